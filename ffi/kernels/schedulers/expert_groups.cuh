// Grouped (mixture-of-experts) calls: one persistent grid over every expert's tiles.
//
// x [T, K] holds the tokens sorted by expert: group_sizes[e] rows (int32, on the device) for
// expert e in expert order, as jax.lax.ragged_dot takes them; the packed weights are E
// matrices [K, 2 N_pad] one after the other; out [T, N]. The tiles are walked expert by
// expert, and within an expert in bands of token tiles (BandedGroupTile): a band's column
// tiles one after the other, its token tiles fastest, so consecutive CTAs share a weight tile
// and a round of them rereads from L2 only the band's x rows, not every row of an expert that
// got many (a skewed routing's heavy expert, or a few experts' many tokens). An expert's
// token tiles start at its first row, so its last one is ragged: the loads of a tile come from
// ExpertTileOrigin (inside x where x has a tile's rows), the epilogue stores only the expert's
// rows of it, and empty experts have no tiles. Rows past the last group form one more group
// whose tiles store zeros (they run one k tile for the pipeline's sake, none of it stored).
//
// Two forms, as for dense calls (interleaved_kernel.cuh): tokens on the wgmma M side (the
// prefill form: x is CUTLASS's A, the experts' weights its batched B), and weights on it
// (swap-AB, kSwapAb: the weights are the batched A, x is B, and a token tile of 16 or 32
// rows fits the few rows an expert gets at decode, so its weights stream once).
//
// Sizes are read on the device, so XLA's shapes stay static and nothing syncs with the host;
// a negative size counts as 0 and a sum past T ends the groups at row T (the Python front
// defines the same). Three parts agree on how a tile is described (ExpertTile: its first
// row on the token axis, its column tile on the other, its expert, row count and whether it
// is a zeros tile in L): ExpertGroupsScheduler hands tiles out, ExpertGroupsMainloop loads
// them from the expert's weights, and ExpertTileRows tells the epilogue which rows are the
// tile's (epilogue/direct_store.cuh, epilogue/swap_ab_epilogue.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/grid_dependency_control.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include <cstdint>

#include "../mainloop/edge_tiles.cuh"

namespace jax_swiglu {

// A tile's L coordinate: its expert, its rows (1 .. tile_m) and the zeros flag, packed.
struct ExpertTile {
  static constexpr int kRowBits = 9;  // up to 256-row tiles
  static constexpr int kZerosBit = 1 << kRowBits;
  static constexpr int kExpertShift = kRowBits + 1;
  // Experts a call may have, so the packed L stays a positive int32.
  static constexpr int64_t kMaxExperts = int64_t(1) << (31 - kExpertShift);

  int expert;
  int rows;
  bool zeros;

  CUTLASS_HOST_DEVICE static int32_t Encode(int expert, int rows, bool zeros) {
    return (expert << kExpertShift) | (zeros ? kZerosBit : 0) | rows;
  }
  CUTLASS_HOST_DEVICE static ExpertTile Decode(int32_t l) {
    return {l >> kExpertShift, l & (kZerosBit - 1), (l & kZerosBit) != 0};
  }
};

// The first row a tile whose own rows start at `first_row` loads: there, or for a tile that
// would reach past row T, the last tile_m rows of x (as EdgeTileOrigin does for dense tiles).
CUTLASS_HOST_DEVICE constexpr int ExpertTileOrigin(int first_row, int tile_m, int tokens) {
  const int last_inside = tokens > tile_m ? tokens - tile_m : 0;
  return first_row < last_inside ? first_row : last_inside;
}

// The direct store's rows of a grouped tile (TileRows, mainloop/edge_tiles.cuh).
struct ExpertTileRows {
  template <int kTileM>
  CUTLASS_DEVICE static TileRows Of(int tokens, int m_coord, int l_coord) {
    const ExpertTile tile = ExpertTile::Decode(l_coord);
    const int origin = ExpertTileOrigin(m_coord, kTileM, tokens);
    return {origin, m_coord - origin, m_coord - origin + tile.rows, tile.zeros};
  }
};

// Where tile `local` of an expert's tiles_m x tiles_n tiles lies: (token tile, column tile).
// Token tiles go in bands of `band`, the last band shorter; within a band token tiles fastest,
// then column tiles. An expert of at most `band` token tiles is one band: token tiles fastest,
// then column tiles, over the whole expert.
struct GroupTileCoord {
  uint32_t m;
  uint32_t n;
};
CUTLASS_HOST_DEVICE constexpr GroupTileCoord BandedGroupTile(uint32_t local, uint32_t tiles_m,
                                                             uint32_t tiles_n, uint32_t band) {
  const uint32_t band_index = local / (band * tiles_n);
  const uint32_t first_m = band_index * band;
  const uint32_t band_m = tiles_m - first_m < band ? tiles_m - first_m : band;
  const uint32_t in_band = local - band_index * band * tiles_n;
  return {first_m + in_band % band_m, in_band / band_m};
}

// Token tiles per band: a round of `sms` tiles then spans about as many bytes of x (band
// token tiles) as of weights (sms / band column tiles), the band whose rounds touch the
// fewest bytes (the square root of sms * tile_columns / tile_tokens); but at most as many token
// tiles as fill a quarter of the L2 with x rows over the whole K (`x_tile_bytes` each), so
// that the band's x stays in the L2 while the column tiles' weights stream past it (at long K
// a band of the square root spills, and its x rows come from DRAM again round after round).
// An unknown L2 (0) leaves the band uncapped.
CUTLASS_HOST_DEVICE constexpr uint32_t TokenTilesPerBand(int sms, int tile_tokens,
                                                         int tile_columns, int64_t x_tile_bytes,
                                                         int64_t l2_bytes) {
  const uint64_t target = static_cast<uint64_t>(sms > 0 ? sms : 1) *
                          static_cast<uint64_t>(tile_columns) / static_cast<uint64_t>(tile_tokens);
  uint32_t band = 1;
  while (static_cast<uint64_t>(band + 1) * (band + 1) <= target) ++band;
  const int64_t fit = x_tile_bytes > 0 && l2_bytes > 0 ? l2_bytes / 4 / x_tile_bytes : band;
  return fit < 1 ? 1u : (fit < band ? static_cast<uint32_t>(fit) : band);
}

// The walk visits every tile of an expert exactly once, whatever the band (checked here, at
// compile time, on sizes with ragged last bands, one band, and bands of one token tile).
constexpr bool BandedWalkVisitsEveryTileOnce(uint32_t tiles_m, uint32_t tiles_n, uint32_t band) {
  bool seen[64] = {};
  if (tiles_m * tiles_n > 64) return false;
  for (uint32_t local = 0; local < tiles_m * tiles_n; ++local) {
    const GroupTileCoord tile = BandedGroupTile(local, tiles_m, tiles_n, band);
    if (tile.m >= tiles_m || tile.n >= tiles_n || seen[tile.m * tiles_n + tile.n]) return false;
    seen[tile.m * tiles_n + tile.n] = true;
  }
  return true;
}
static_assert(BandedWalkVisitsEveryTileOnce(7, 3, 2) && BandedWalkVisitsEveryTileOnce(7, 3, 3) &&
                  BandedWalkVisitsEveryTileOnce(5, 4, 5) &&
                  BandedWalkVisitsEveryTileOnce(5, 4, 8) &&
                  BandedWalkVisitsEveryTileOnce(1, 9, 4) &&
                  BandedWalkVisitsEveryTileOnce(9, 1, 4) &&
                  BandedWalkVisitsEveryTileOnce(8, 8, 1) &&
                  BandedWalkVisitsEveryTileOnce(6, 10, 4),
              "the banded walk must visit each of an expert's tiles once");
static_assert(BandedGroupTile(5, 4, 3, 8).m == 1 && BandedGroupTile(5, 4, 3, 8).n == 1,
              "an expert within one band walks token tiles fastest over the whole expert");
static_assert(TokenTilesPerBand(132, 256, 192, 256 * 2048 * 2, 50 << 20) == 9 &&
                  TokenTilesPerBand(132, 256, 192, 256 * 7168 * 2, 50 << 20) == 3 &&
                  TokenTilesPerBand(132, 256, 192, 256 * 7168 * 2, 0) == 9 &&
                  TokenTilesPerBand(132, 16, 128, 16 * 4096 * 2, 50 << 20) == 32 &&
                  TokenTilesPerBand(1, 256, 128, 256 * 4096 * 2, 50 << 20) == 1 &&
                  TokenTilesPerBand(132, 256, 192, int64_t{256} * 65536 * 2, 16 << 20) == 1,
              "bands from the SM count, the tile's sides and the L2");

// CUTLASS's persistent scheduler interface over the grouped tiles above. Every thread of a
// warp walks the same tiles; the walk is warp-cooperative (32 experts per step: one size
// load per lane, two prefix sums through shuffles), so every caller must be a whole warp,
// as CUTLASS's SM90 kernels call their scheduler. Grid: one CTA per SM, or fewer where the
// call has fewer tiles at most. kSwapAb: the tokens are the problem's N (the tile's second
// mode), the packed columns its M.
template <bool kSwapAb>
class ExpertGroupsScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  // (No default member initializers: get_grid_shape's default argument needs Arguments
  // complete inside this class; value-initialize it instead.)
  struct Arguments : Base::Arguments {
    const int32_t* group_sizes;  // [experts], on the device
    int experts;
    int64_t l2_bytes;  // the device's (0: unknown, no cap on the band)
    int band;  // 0: TokenTilesPerBand's; -1: whole experts; N > 0: N (DeviceFacts::grouped_band)
  };

  struct Params : Base::Params {
    const int32_t* group_sizes = nullptr;
    int32_t experts = 0;
    int32_t tokens = 0;
    int32_t tile_m = 1;
    int32_t tiles_n = 1;
    int32_t k_tiles = 1;
    uint32_t band = 1;  // token tiles per band (BandedGroupTile)
  };

  // The most tiles a call of `tokens` rows over `experts` groups can have: every group adds at
  // most one ragged token tile, and the zeros group one more.
  CUTLASS_HOST_DEVICE static int64_t MaxTiles(int64_t tokens, int64_t experts, int tile_m,
                                              int64_t tiles_n) {
    const int64_t groups = (experts < tokens ? experts : tokens) + 1;
    return ((tokens + tile_m - 1) / tile_m + groups) * tiles_n;
  }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    static_assert(cute::size(ClusterShape{}) == 1, "grouped tiles run without clusters");
    Params params;
    static_cast<Base::Params&>(params) = Base::to_underlying_arguments(
        problem_shape_mnkl, tile_shape, cluster_shape, hw_info, arguments, workspace,
        epilogue_subtile, ktile_start_alignment_count);
    auto shape = cute::append<4>(problem_shape_mnkl, cute::Int<1>{});
    constexpr int kTileTokens = cute::size<kSwapAb ? 1 : 0>(TileShape{});
    constexpr int kTileColumns = cute::size<kSwapAb ? 0 : 1>(TileShape{});
    constexpr int kTileK = cute::size<2>(TileShape{});
    params.group_sizes = arguments.group_sizes;
    params.experts = arguments.experts;
    params.tokens = static_cast<int32_t>(cute::get<kSwapAb ? 1 : 0>(shape));
    params.tile_m = kTileTokens;
    params.tiles_n =
        (static_cast<int32_t>(cute::get<kSwapAb ? 0 : 1>(shape)) + kTileColumns - 1) / kTileColumns;
    params.k_tiles = (static_cast<int32_t>(cute::get<2>(shape)) + kTileK - 1) / kTileK;
    // -1: one band of every token tile the call could give an expert.
    params.band =
        arguments.band == 0
            ? TokenTilesPerBand(SmCount(hw_info), kTileTokens, kTileColumns,
                                XTileBytes(kTileTokens, cute::get<2>(shape)), arguments.l2_bytes)
        : arguments.band < 0
            ? static_cast<uint32_t>((params.tokens + kTileTokens - 1) / kTileTokens + 1)
            : static_cast<uint32_t>(arguments.band);
    return params;
  }

  // The SMs of hw_info's device (CUTLASS leaves sm_count 0 where the caller did not query).
  static int SmCount(cutlass::KernelHardwareInfo const& hw_info) {
    return hw_info.sm_count > 0
               ? hw_info.sm_count
               : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw_info.device_id);
  }

  // A token tile's x rows over the whole K: grouped rows take 16-bit operands
  // (kernel_configs.h).
  static int64_t XTileBytes(int tile_tokens, int64_t k) { return int64_t{tile_tokens} * k * 2; }

  // One CTA per SM, or one per tile where the call has fewer tiles at most.
  template <class ProblemShapeMNK, class BlockShape, class ClusterShape>
  static dim3 get_grid_shape(Params const& params, ProblemShapeMNK, BlockShape, ClusterShape,
                             cutlass::KernelHardwareInfo hw_info, Arguments = Arguments{},
                             bool = true) {
    const int sms = SmCount(hw_info);
    const int64_t tiles = MaxTiles(params.tokens, params.experts, params.tile_m, params.tiles_n);
    return dim3(static_cast<uint32_t>(tiles < sms ? tiles : sms), 1, 1);
  }

  template <class ProblemShape, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const& work,
                                                       ProblemShape problem_shape, TileShape) {
    // A zeros tile runs one k tile (the pipeline expects one), then stores zeros.
    if (ExpertTile::Decode(work.L_idx).zeros) return 1;
    return static_cast<int>((cute::get<2>(problem_shape) + cute::size<2>(TileShape{}) - 1) /
                            cute::size<2>(TileShape{}));
  }

  CUTLASS_HOST_DEVICE ExpertGroupsScheduler() {}

  CUTLASS_DEVICE explicit ExpertGroupsScheduler(Params const& params)
      : Base(params),
        group_sizes_(params.group_sizes),
        experts_(params.experts),
        tokens_(params.tokens),
        tile_m_(params.tile_m),
        tiles_n_(params.tiles_n),
        band_(params.band) {
    // The sizes may come from the kernel before this one (programmatic dependent launch).
    cutlass::arch::wait_on_dependent_grids();
    next_ = blockIdx.x;
    stride_ = gridDim.x;
    Seek();
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return current_;
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return current_; }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    next_ += stride_ * advance_count;
    Seek();
  }

  template <class WorkTileInfo_>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo_) {
    advance_to_next_work();
    return cute::make_tuple(current_, true);
  }

  template <class WorkTileInfo_, class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo_ work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t advance_count = 1) const {
    ExpertGroupsScheduler next = *this;
    next.advance_to_next_work(advance_count);
    return !next.current_.is_valid();
  }

 private:
  // Finds tile next_ from the current chunk of 32 groups on (the zeros group is group
  // experts_), moving the chunk forward while the tile lies past it; sets current_.
  CUTLASS_DEVICE void Seek() {
    const int lane = static_cast<int>(threadIdx.x % 32);
    while (chunk_ <= experts_) {
      const int group = chunk_ + lane;
      // Group sizes as defined: negative ones are 0; the zeros group takes every row left.
      uint32_t size = 0;
      if (group < experts_) {
        const int32_t s = __ldg(group_sizes_ + group);
        size = s > 0 ? static_cast<uint32_t>(s) : 0u;
      } else if (group == experts_) {
        size = static_cast<uint32_t>(tokens_);
      }
      // End row of each group: a prefix sum that saturates at T (sizes and sums <= T < 2^31).
      const uint32_t limit = static_cast<uint32_t>(tokens_);
      uint32_t end = (lane == 0 ? chunk_row_ : 0u) + (size < limit ? size : limit);
      end = end < limit ? end : limit;
      CUTLASS_PRAGMA_UNROLL
      for (int offset = 1; offset < 32; offset *= 2) {
        const uint32_t before = __shfl_up_sync(0xffffffffu, end, offset);
        if (lane >= offset) {
          end += before;
          end = end < limit ? end : limit;
        }
      }
      uint32_t start = __shfl_up_sync(0xffffffffu, end, 1);
      if (lane == 0) start = chunk_row_;
      const uint32_t rows = end - start;
      const uint32_t tiles =
          (rows + static_cast<uint32_t>(tile_m_) - 1) / static_cast<uint32_t>(tile_m_) *
          static_cast<uint32_t>(tiles_n_);
      // First tile past each group: a prefix sum of the tile counts from the chunk's first.
      uint32_t tile_end = (lane == 0 ? chunk_tile_ : 0u) + tiles;
      CUTLASS_PRAGMA_UNROLL
      for (int offset = 1; offset < 32; offset *= 2) {
        const uint32_t before = __shfl_up_sync(0xffffffffu, tile_end, offset);
        if (lane >= offset) tile_end += before;
      }
      const uint32_t holds = __ballot_sync(0xffffffffu, tile_end > next_);
      if (holds != 0) {
        const int owner = __ffs(holds) - 1;
        const uint32_t group_rows = __shfl_sync(0xffffffffu, rows, owner);
        const uint32_t group_start = __shfl_sync(0xffffffffu, start, owner);
        const uint32_t group_tiles = __shfl_sync(0xffffffffu, tiles, owner);
        const uint32_t group_tile_end = __shfl_sync(0xffffffffu, tile_end, owner);
        const int expert = chunk_ + owner;
        // The group's bands of token tiles, token tiles fastest within each.
        const uint32_t local = next_ - (group_tile_end - group_tiles);
        const uint32_t tiles_m = group_tiles / static_cast<uint32_t>(tiles_n_);
        const GroupTileCoord tile =
            BandedGroupTile(local, tiles_m, static_cast<uint32_t>(tiles_n_), band_);
        const uint32_t first = tile.m * static_cast<uint32_t>(tile_m_);
        const uint32_t left = group_rows - first;
        const int tile_rows = static_cast<int>(left < uint32_t(tile_m_) ? left : uint32_t(tile_m_));
        const bool zeros = expert == experts_;
        const auto row = static_cast<int32_t>(group_start + first);
        const auto column_tile = static_cast<int32_t>(tile.n);
        const int32_t l = ExpertTile::Encode(zeros ? 0 : expert, tile_rows, zeros);
        current_ = kSwapAb ? WorkTileInfo{column_tile, row, l, true}
                           : WorkTileInfo{row, column_tile, l, true};
        return;
      }
      chunk_tile_ = __shfl_sync(0xffffffffu, tile_end, 31);
      chunk_row_ = __shfl_sync(0xffffffffu, end, 31);
      chunk_ += 32;
    }
    current_ = WorkTileInfo::invalid_work_tile();
  }

  const int32_t* group_sizes_ = nullptr;
  int experts_ = 0;
  int tokens_ = 0;
  int tile_m_ = 1;
  int tiles_n_ = 1;
  uint32_t band_ = 1;
  uint32_t next_ = 0;    // the linear tile this CTA (or warpgroup) works on
  uint32_t stride_ = 1;  // CTAs in the grid
  int chunk_ = 0;            // first group of the chunk of 32 the walk is in
  uint32_t chunk_tile_ = 0;  // its first linear tile
  uint32_t chunk_row_ = 0;   // its first row
  WorkTileInfo current_ = WorkTileInfo::invalid_work_tile();
};

// Tag selecting ExpertGroupsScheduler in CUTLASS's GemmUniversal (see the selector below).
template <bool kSwapAb>
struct ExpertGroupsPersistentScheduler {};

// CUTLASS's SM90 TMA mainloop `Base` for grouped tiles: x is one [T, K] matrix, the weights
// E [K, 2 N_pad] ones (the batch mode of B, or of A for kSwapAb; L = E). A tile's x box
// starts at ExpertTileOrigin and its weight boxes at its expert's matrix; the math is Base's.
template <class Base, bool kSwapAb>
struct ExpertGroupsMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;

  struct Arguments : Base::Arguments {
    int experts = 1;
  };
  struct Params : Base::Params {
    int experts = 1;
  };

  // x's TMA descriptor over [T, K] (one batch), the weights' over E batches: Base's for two
  // problem shapes, which differ in L only. (In the second, x gets a batch stride that no
  // load uses, so its unused descriptor is a valid one.)
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* workspace) {
    auto shape = cute::append<4>(problem_shape, 1);
    const auto m = cute::get<0>(shape), n = cute::get<1>(shape), k = cute::get<2>(shape);
    typename Base::Arguments experts_args = args;
    if constexpr (kSwapAb) {
      cute::get<2>(experts_args.dB) = static_cast<int64_t>(n) * static_cast<int64_t>(k);
    } else {
      cute::get<2>(experts_args.dA) = static_cast<int64_t>(m) * static_cast<int64_t>(k);
    }
    typename Base::Params params = Base::to_underlying_arguments(
        cute::make_shape(m, n, k, args.experts), experts_args, workspace);
    auto x_only = Base::to_underlying_arguments(cute::make_shape(m, n, k, 1), args, workspace);
    if constexpr (kSwapAb) {
      params.tma_load_b = x_only.tma_load_b;
    } else {
      params.tma_load_a = x_only.tma_load_a;
    }
    return {params, args.experts};
  }

  // Base's tiled views (for the kernel's coordinates), x [T, K] and the weights [2N', K, E]
  // whole (to cut each tile's boxes from), and T.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_mnkl,
                                Params const& params) const {
    using namespace cute;
    auto [m, n, k, l] = problem_shape_mnkl;
    auto tiled = Base::load_init(problem_shape_mnkl, params);
    if constexpr (kSwapAb) {
      Tensor x_nkl = params.tma_load_b.get_tma_tensor(make_shape(n, k, 1));
      Tensor w_mkl = params.tma_load_a.get_tma_tensor(make_shape(m, k, params.experts));
      return make_tuple(get<0>(tiled), get<1>(tiled), x_nkl, w_mkl, static_cast<int>(n));
    } else {
      Tensor x_mkl = params.tma_load_a.get_tma_tensor(make_shape(m, k, 1));
      Tensor w_nkl = params.tma_load_b.get_tma_tensor(make_shape(n, k, params.experts));
      return make_tuple(get<0>(tiled), get<1>(tiled), x_mkl, w_nkl, static_cast<int>(m));
    }
  }

  template <class TensorA, class TensorB, class TensorX, class TensorW, class KTileIterator,
            class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB, TensorX, TensorW, int> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    constexpr int kTokensMode = kSwapAb ? 1 : 0;
    constexpr int kTileTokens = size<kTokensMode>(TileShape{});
    const int first_row = static_cast<int>(get<kTokensMode>(blk_coord));
    const ExpertTile tile = ExpertTile::Decode(static_cast<int32_t>(get<3>(blk_coord)));
    const int origin = ExpertTileOrigin(first_row, kTileTokens, get<4>(inputs));
    // The tokens' and the weights' tiles in the tile's (M, K) / (N, K) modes.
    using XStep = cute::conditional_t<kSwapAb, Step<X, _1, _1>, Step<_1, X, _1>>;
    using WStep = cute::conditional_t<kSwapAb, Step<_1, X, _1>, Step<X, _1, _1>>;
    Tensor x_tiles = local_tile(domain_offset(make_coord(origin, 0, 0), get<2>(inputs)),
                                TileShape{}, make_coord(_, _, _), XStep{});
    Tensor w_tiles = local_tile(domain_offset(make_coord(0, 0, tile.expert), get<3>(inputs)),
                                TileShape{}, make_coord(_, _, _), WStep{});
    if constexpr (kSwapAb) {
      Base::load(params, pipeline, smem_pipe_write, make_tuple(w_tiles, x_tiles),
                 make_coord(get<0>(blk_coord), 0, get<2>(blk_coord), 0), k_tile_iter,
                 k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
    } else {
      Base::load(params, pipeline, smem_pipe_write, make_tuple(x_tiles, w_tiles),
                 make_coord(0, get<1>(blk_coord), get<2>(blk_coord), 0), k_tile_iter,
                 k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
    }
  }
};

}  // namespace jax_swiglu

namespace cutlass::gemm::kernel::detail {

template <bool kSwapAb, class ArchTag, class TileShape, class ClusterShape,
          uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_swiglu::ExpertGroupsPersistentScheduler<kSwapAb>, ArchTag,
                             TileShape, ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = jax_swiglu::ExpertGroupsScheduler<kSwapAb>;
};

}  // namespace cutlass::gemm::kernel::detail
