// Mainloop of the gate-then-up fused SwiGLU kernel (Kernel-1 of the design): for each
// [tile_m, tile_n / 2] output tile, accumulate X @ W_gate over K, then X @ W_up over K.
//
// It plugs into CUTLASS's SM90 GemmUniversal kernels through the collective-mainloop
// interface (load_init / load / load_tail / mma / mma_tail): the pingpong schedule (two
// consumer warpgroups taking turns on whole tiles, one's epilogue overlapping the other's
// mainloop) or the cooperative one (both warpgroups on one tile, 64 rows each). The kernel's
// tile is (tile_m, tile_n, tile_k) over the packed [M, 2 N_pad] problem, so its grid is
// exactly the [M, N] output grid and its accumulator is [gate | up], tile_n / 2 columns each.
// The problem's K mode counts both passes' k-tiles (2 ceil(K / tile_k) tile_k,
// GateThenUpAssembly), which the kernels read their k-tile counts off; the real K comes in
// the mainloop's arguments.
//
// One k-tile sequence per output tile runs both passes: k-tiles 0 .. K/tile_k - 1 load
// x and gate columns, the next K/tile_k load x again and up columns. Gate and up columns
// of an output tile are whole kGateUpBlock-column runs of the packed matrix, every other
// run (jax_swiglu/_layout.py): in shared memory each run is its own 64-byte-swizzled atom
// column, and one TMA box with an outer mode over the runs loads a pass tile. On a cluster
// of CTAs along the tokens, the CTAs share their weight columns: each loads its share of a
// pass tile and multicasts it to all (x rows are each CTA's own).
//
// Registers, the design constraint: a consumer warpgroup holds two fp32 accumulators,
// gate and up (96 + 96 per thread for 64 rows x 192 columns each). The passes run back to
// back: the first up k-tile is issued while the last gate k-tile's wgmmas are in flight, and
// the activation waits for the epilogue (SequentialPairs), which in the pingpong schedule
// overlaps the other warpgroup's mainloop instead of holding the ordered mainloop region.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "../../kernel_configs.h"

namespace jax_swiglu {

template <class Element_, class TileShape_, int Stages, class KernelSchedule, int kClusterM>
struct GateThenUpMainloop {
  // --- what the kernel reads off a collective ---------------------------------------------
  using TileShape = TileShape_;  // (tile_m, gate + up columns, tile_k)
  using ElementA = Element_;
  using ElementB = Element_;
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;  // x: (M, K, L), K contiguous
  using StrideB = cute::Stride<cute::_1, int64_t, int64_t>;  // packed: (N, K, L), N contiguous
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>;
  using DispatchPolicy =
      cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<Stages, ClusterShape, KernelSchedule>;
  static constexpr bool kCooperative =
      cute::is_same_v<KernelSchedule, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  static_assert(kCooperative ||
                    cute::is_same_v<KernelSchedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong>,
                "CUTLASS's cooperative or pingpong schedule");
  using ArchTag = typename DispatchPolicy::ArchTag;
  using ElementAccumulator = float;
  using MainloopPipeline = cutlass::PipelineTmaAsync<Stages>;
  using PipelineState = cutlass::PipelineState<Stages>;
  using PipelineParams = typename MainloopPipeline::Params;
  static constexpr int NumProducerThreadEvents = 1;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTilePacked = cute::size<1>(TileShape{});
  static constexpr int kTileN = kTilePacked / 2;  // one pass: gate (or up) columns
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static_assert(kTileN % kGateUpBlock == 0, "a pass tile must be whole gate (or up) blocks");
  // Each CTA of a cluster loads and multicasts an equal share of a pass tile's runs (CuTe
  // splits the box's outer mode; a fraction of a run would misplace data and bytes).
  static_assert((kTileN / kGateUpBlock) % kClusterM == 0,
                "a pass tile's runs must split evenly over the cluster");
  // One pass of the mainloop covers this (M, N, K) tile.
  using PassShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;

  // wgmma 64 x (a pass's tile_n / 2) x 16 atoms, A (x) K-major and B (weights) N-major from
  // smem; one warpgroup per tile (pingpong) or two, 64 rows each (cooperative). Over the
  // kernel's (tile_m, tile_n) tile this gives MMA_N = 2: index 0 is the gate accumulator, 1
  // the up accumulator (SequentialPairs in the epilogue).
  using WarpGroupLayout =
      cute::Layout<cute::Shape<cute::Int<kCooperative ? 2 : 1>, cute::_1, cute::_1>>;
  static_assert(!kCooperative || kTileM == 128, "the cooperative tile: 64 rows per warpgroup");
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<ElementA, ElementB, float, PassShape, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      WarpGroupLayout{}));

  using SmemLayoutAtomA = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                   cute::GMMA::Major::K, ElementA, cute::Int<kTileM>,
                                   cute::Int<kTileK>>());
  // The weights' swizzle atom is exactly one gate (or up) run wide (32 columns, 64 bytes:
  // the 64-byte swizzle), so each TMA box row is one contiguous run of the packed matrix and
  // the box's inner extent equals the swizzle width. (A 128-byte atom over two 64-byte runs
  // asks TMA for a box narrower than its swizzle, which the TMA unit rejects on the GPU.)
  static_assert(kGateUpBlock * sizeof(ElementB) == 64, "one run is one 64-byte swizzle atom");
  using SmemLayoutAtomB = cute::GMMA::Layout_MN_SW64_Atom<ElementB>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemLayoutAtomA{},
      cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{}, cute::Int<Stages>{}),
      cute::Step<cute::_1, cute::_2, cute::_3>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemLayoutAtomB{},
      cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{}, cute::Int<Stages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));

  // TMA copies raw 16-bit words: no conversion on the way.
  using InternalElement = cute::uint_bit_t<cute::sizeof_bits_v<ElementA>>;

  struct TensorStorage {
    alignas(1024) cute::array_aligned<ElementA, cute::cosize_v<SmemLayoutA>> smem_A;
    alignas(1024) cute::array_aligned<ElementB, cute::cosize_v<SmemLayoutB>> smem_B;
  };
  using PipelineStorage = typename MainloopPipeline::SharedStorage;

  static constexpr uint32_t TmaTransactionBytes =
      static_cast<uint32_t>((kTileM + kTileN) * kTileK * sizeof(ElementA));

  struct Arguments {
    ElementA const* ptr_x;       // [M, K]
    ElementB const* ptr_packed;  // [K, 2 N_pad], packed layout
    int k;                       // K (the problem shape's K counts both passes)
  };
  // The problem shape's K for a real K: both passes' k-tiles, each pass's last one whole.
  static constexpr int BothPassesK(int k) { return 2 * ((k + kTileK - 1) / kTileK) * kTileK; }

  // The gate (or up) columns of the packed matrix as an (N, K, L) tensor with a two-level
  // N mode: kGateUpBlock contiguous columns, then the next run of the same kind
  // 2 * kGateUpBlock columns on.
  static auto PassView(InternalElement const* first_column, int blocks, int k,
                       int64_t packed_cols) {
    using namespace cute;
    return make_tensor(
        first_column,
        make_layout(make_shape(make_shape(Int<kGateUpBlock>{}, blocks), k, 1),
                    make_stride(make_stride(_1{}, int64_t(2 * kGateUpBlock)), packed_cols,
                                int64_t(0))));
  }
  static auto RowsView(InternalElement const* x, int m, int k) {
    using namespace cute;
    return make_tensor(x, make_layout(make_shape(m, k, 1), make_stride(int64_t(k), _1{},
                                                                        int64_t(0))));
  }

  // x: each CTA its own rows. The weights: multicast over the cluster's CTAs.
  using TmaLoadB = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      cute::Int<kClusterM>{}));
  using TmaA = decltype(cute::make_tma_copy_A_sm90(
      cute::SM90_TMA_LOAD{}, RowsView(nullptr, 0, 0), SmemLayoutA{}(cute::_, cute::_, 0),
      PassShape{}, ClusterShape{}));
  using TmaB = decltype(cute::make_tma_copy_B_sm90(
      TmaLoadB{}, PassView(nullptr, 0, 0, 0), SmemLayoutB{}(cute::_, cute::_, 0),
      PassShape{}, ClusterShape{}));

  struct Params {
    TmaA tma_x;
    TmaB tma_gate;
    TmaB tma_up;
    uint32_t tma_transaction_bytes = TmaTransactionBytes;
    int k;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* /*workspace*/) {
    using namespace cute;
    auto [m, packed_cols, both_passes_k, l] = append<4>(problem_shape, 1);
    (void)both_passes_k, (void)l;  // the real K comes in the arguments; one batch
    const int k = args.k;
    auto x = reinterpret_cast<InternalElement const*>(args.ptr_x);
    auto packed = reinterpret_cast<InternalElement const*>(args.ptr_packed);
    const int blocks = packed_cols / (2 * kGateUpBlock);
    return {
        make_tma_copy_A_sm90(SM90_TMA_LOAD{}, RowsView(x, m, k), SmemLayoutA{}(_, _, 0),
                             PassShape{}, ClusterShape{}),
        make_tma_copy_B_sm90(TmaLoadB{}, PassView(packed, blocks, k, packed_cols),
                             SmemLayoutB{}(_, _, 0), PassShape{}, ClusterShape{}),
        make_tma_copy_B_sm90(TmaLoadB{},
                             PassView(packed + kGateUpBlock, blocks, k, packed_cols),
                             SmemLayoutB{}(_, _, 0), PassShape{}, ClusterShape{}),
        TmaTransactionBytes,
        k};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto [m, packed_cols, both_passes_k, l] = cute::append<4>(problem_shape, 1);
    constexpr int kAlign = 16 / sizeof(ElementA);  // TMA: 16-byte strides and addresses
    return args.k > 0 && args.k % kAlign == 0 && both_passes_k == BothPassesK(args.k) &&
           packed_cols % (2 * kGateUpBlock) == 0 &&
           reinterpret_cast<uintptr_t>(args.ptr_x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(args.ptr_packed) % 16 == 0;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_x.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_gate.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_up.get_tma_descriptor());
  }

  // Returns (x tiles, tile grid, gate tiles, up tiles). The pingpong kernel reads the number
  // of k-tiles per output tile off the first (its k mode counts both passes: the second pass
  // revisits the same x tiles; the cooperative kernel counts them off the problem's K), and
  // both read the [M, N] tile grid off the first two.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_mnkl,
                                Params const& params) const {
    using namespace cute;
    using X = Underscore;
    auto [m, packed_cols, both_passes_k, l] = problem_shape_mnkl;
    (void)both_passes_k;  // the real K is the params'
    const int k = params.k;
    const int blocks = packed_cols / (2 * kGateUpBlock);

    Tensor mX = params.tma_x.get_tma_tensor(make_shape(m, k, l));
    Tensor gX = local_tile(mX, PassShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
    Tensor gX_both = make_tensor(
        gX.data(), make_layout(layout<0>(gX), layout<1>(gX), layout<2>(gX),
                               make_layout(make_shape(size<3>(gX), _2{}),
                                           make_stride(stride<3>(gX), _0{})),
                               layout<4>(gX)));  // (BLK_M, BLK_K, m, (k, pass), l)

    auto pass_shape = make_shape(make_shape(Int<kGateUpBlock>{}, blocks), k, l);
    Tensor gGate = local_tile(params.tma_gate.get_tma_tensor(pass_shape), PassShape{},
                              make_coord(_, _, _), Step<X, _1, _1>{});  // (BLK_N, BLK_K, n, k, l)
    Tensor gUp = local_tile(params.tma_up.get_tma_tensor(pass_shape), PassShape{},
                            make_coord(_, _, _), Step<X, _1, _1>{});
    // The kernel only reads shapes off this: a flat [N_pad, K] grid of output tiles.
    Tensor grid = local_tile(make_identity_tensor(make_shape(blocks * kGateUpBlock, k, l)),
                             PassShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    return make_tuple(gX_both, grid, gGate, gUp);
  }

  // Producer: one k-tile sequence for both passes of an output tile.
  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator /*k_tile_iter*/,
                           int k_tile_count, int /*thread_idx*/, uint32_t block_rank,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    // The cluster is kClusterM CTAs along the tokens: this CTA loads its share of each
    // weight tile for all of them (block_rank is its place along M).
    const uint16_t multicast_mask = static_cast<uint16_t>((1u << kClusterM) - 1);

    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gX = get<0>(load_inputs)(_, _, m_coord, _, l_coord);     // (BLK_M, BLK_K, 2k)
    Tensor gGate = get<2>(load_inputs)(_, _, n_coord, _, l_coord);  // (BLK_N, BLK_K, k)
    Tensor gUp = get<3>(load_inputs)(_, _, n_coord, _, l_coord);

    auto tma_x = params.tma_x.get_slice(0);
    auto tma_gate = params.tma_gate.get_slice(block_rank % kClusterM);
    auto tma_up = params.tma_up.get_slice(block_rank % kClusterM);
    Tensor tXgX = tma_x.partition_S(gX);
    Tensor tXsX = tma_x.partition_D(sA);
    Tensor tGgG = tma_gate.partition_S(gGate);
    Tensor tUgU = tma_up.partition_S(gUp);
    Tensor tWsW = tma_gate.partition_D(sB);  // same smem layout for either pass

    const int k_tiles = k_tile_count / 2;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int tile = 0; tile < k_tile_count; ++tile) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      copy(params.tma_x.with(*barrier), tXgX(_, _, _, tile), tXsX(_, _, _, stage));
      if (tile < k_tiles) {
        copy(params.tma_gate.with(*barrier, multicast_mask), tGgG(_, _, _, tile),
             tWsW(_, _, _, stage));
      } else {
        copy(params.tma_up.with(*barrier, multicast_mask), tUgU(_, _, _, tile - k_tiles),
             tWsW(_, _, _, stage));
      }
      ++smem_pipe_write;
    }
  }

  // Keeps the producer's CTA alive until the consumers have released every stage.
  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState smem_pipe_write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(smem_pipe_write);
  }

  // Consumer warpgroup(s): the gate pass, then the up pass. Stages go back to the producer
  // one k-tile late, once the wgmmas reading them have completed (as in CUTLASS's mainloop).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& /*params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value);
    static_assert(size<2>(FrgTensorC{}) == 2, "accumulator is [gate | up]");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});

    // This warpgroup's share of the tile (its rows, in the cooperative schedule).
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group =
        __shfl_sync(0xFFFFFFFF, (thread_idx / cutlass::NumThreadsPerWarpGroup) % kWarpGroups, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,M,K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,N,K,PIPE)

    // Views of the two accumulators, each (MMA, MMA_M, 1) as cute::gemm wants them.
    auto one_pass = [&](auto pass) {
      Tensor slice = accum(_, _, pass);
      return make_tensor(slice.data(), append(slice.layout(), Layout<_1, _0>{}));
    };
    Tensor acc_gate = one_pass(Int<0>{});
    Tensor acc_up = one_pass(Int<1>{});

    // The stage to hand back is always the one before smem_pipe_read's: derive it rather
    // than carry a second pipeline state (registers are what this kernel is short of).
    auto release_stage = [&] {
      pipeline.consumer_release(
          PipelineState((smem_pipe_read.index() + Stages - 1) % Stages, 0, 0));
    };
    // Issues one k-tile's wgmmas into `acc` (zeroing it first for the first k-tile of a
    // pass); then, with at most this k-tile in flight, hands the previous k-tile's stage
    // back, except for the tile's very first k-tile (its predecessor belongs to the previous
    // tile, which mma_tail released). The up pass's first k-tile thus overlaps the gate
    // pass's last one.
    auto k_tile = [&](auto& acc, bool first_of_pass, bool release_previous) {
      pipeline.consumer_wait(smem_pipe_read);
      const int stage = smem_pipe_read.index();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      tiled_mma.accumulate_ = first_of_pass ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), acc);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      if (release_previous) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc);
        release_stage();
      }
      ++smem_pipe_read;
    };

    const int k_tiles = k_tile_count / 2;
    // The up accumulator gets its values before any wgmma is in flight: left undefined, the
    // compiler initializes its registers between the passes, while the gate pass's last
    // wgmmas run, and ptxas then serializes every wgmma (C7515).
    clear(acc_up);
    warpgroup_fence_operand(acc_up);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int tile = 0; tile < k_tiles; ++tile) k_tile(acc_gate, tile == 0, tile != 0);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int tile = 0; tile < k_tiles; ++tile) k_tile(acc_up, tile == 0, true);
    warpgroup_fence_operand(accum);
  }

  // Waits for the last wgmmas and releases the stage nobody released yet.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline pipeline, PipelineState smem_pipe_release,
                               int k_tile_count) {
    smem_pipe_release.advance(k_tile_count - 1);
    cute::warpgroup_wait<0>();
    pipeline.consumer_release(smem_pipe_release);
  }
};

}  // namespace jax_swiglu
