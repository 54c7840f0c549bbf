// SwiGLU epilogue collective for CUTLASS 3.x SM90 warp-specialized GEMM kernels.
//
// The GEMM computes an accumulator tile over packed gate/up columns (tile_n packed
// columns). This epilogue pairs every gate accumulator with its up accumulator, which sit
// in the same thread's registers (where exactly is the `Pairs` policy below: one per
// kernel), combines them in fp32 (SiLU(g) * u), rounds once, and writes a half-width
// [tile_m, tile_n / 2] output tile: registers -> swizzled shared memory -> one TMA store. The store is not waited for: the next tile's mainloop runs
// while it drains, and only the next epilogue (or the kernel's store_tail) waits for it
// before reusing the shared-memory tile. The [M, 2N] product never reaches HBM.
//
// It implements the epilogue interface that CUTLASS's sm90 cooperative and pingpong
// GemmUniversal kernels call (is_producer_load_needed / load / load_tail / store /
// store_tail); it loads no source tensor, so the load side is empty.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "../kernel_configs.h"

namespace jax_swiglu {

// SiLU(g) in fp32, with the fast hardware exp2 and reciprocal (MUFU): about 2 ulp, far
// inside the 1% budget, and no IEEE-division slow path, whose subroutine call would spill
// registers next to 128 live accumulators. Limits match the reference: for very negative
// g, 1 + exp(-g) = inf and the reciprocal is 0, so SiLU(g) = -0; SiLU(-inf) and NaN give NaN.
CUTLASS_DEVICE float Silu(float gate) {
  float sigmoid;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(sigmoid) : "f"(1.0f + __expf(-gate)));
  return gate * sigmoid;
}

// Where a thread's gate and up accumulators pair up, for each kernel. Accumulator
// fragments of a wgmma are ((2 adjacent columns, 2 rows 8 apart, blocks of 8 columns),
// MMA_M, MMA_N); a policy says which (block, mma_n) hold gate values, where their up
// partners are, which output column a gate's tile-local packed column is, and how the
// pair combines.

// Interleaved kernel: one atom spans [gate block | up block | ...] of 64 columns each, so
// the up partner of gate block b is block b + 8 of the same atom, and SiLU is still due.
struct InterleavedPairs {
  static constexpr int kBlocksPerHalf = kGateUpBlock / 8;
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int block, int /*mma_n*/) {
    return (block / kBlocksPerHalf) % 2 == 0;
  }
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block) { return block + kBlocksPerHalf; }
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int mma_n) { return mma_n; }
  CUTLASS_HOST_DEVICE static int OutputColumn(int packed_n) {
    return (packed_n / (2 * kGateUpBlock)) * kGateUpBlock + packed_n % kGateUpBlock;
  }
  CUTLASS_DEVICE static float Combine(float gate, float up) { return Silu(gate) * up; }
};

// Gate-then-up (pingpong) kernel: the gate pass accumulates into MMA_N index 0 and the up
// pass into index 1, and the mainloop has already replaced the gate values by SiLU(g).
struct SequentialPairs {
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int /*block*/, int mma_n) { return mma_n == 0; }
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block) { return block; }
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int /*mma_n*/) { return 1; }
  CUTLASS_HOST_DEVICE static int OutputColumn(int packed_n) { return packed_n; }
  CUTLASS_DEVICE static float Combine(float silu_gate, float up) { return silu_gate * up; }
};

template <class ElementD_, class CtaTileShape_, class Pairs = InterleavedPairs>
class SwiGluEpilogue {
 public:
  using ElementD = ElementD_;
  using ElementC = void;  // no source tensor
  using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideD = cute::Stride<int64_t, cute::_1, int64_t>;

  static constexpr int kTileM = cute::size<0>(CtaTileShape_{});
  static constexpr int kTilePacked = cute::size<1>(CtaTileShape_{});
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile
  static_assert(kTilePacked % (2 * kGateUpBlock) == 0,
                "a tile must hold whole gate/up block pairs");

  // Output tile in shared memory, N-contiguous with the 128-byte swizzle, so the 4-byte
  // stores of a warp (8 rows x 16 bytes) hit 32 distinct banks and TMA reads it directly.
  using SmemLayoutD = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<ElementD>{},
      cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>>{}));

  // The kernel instantiates load/store pipelines from these; nothing is loaded and the
  // store side is tracked with bulk-async groups, so they are the empty ones.
  using LoadPipeline = cutlass::PipelineTransactionAsync<0>;
  using LoadPipelineState = cutlass::PipelineState<0>;
  using StorePipeline = cutlass::PipelineTmaStore<0>;
  using StorePipelineState = cutlass::PipelineState<0>;
  static constexpr bool RequiresTransactionBytes = false;

  struct TensorStorage {
    alignas(1024) cute::ArrayEngine<ElementD, cute::cosize_v<SmemLayoutD>> smem_d;
  };
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  // Shared memory the mainloop's stage count must leave free.
  static constexpr int kSharedBytes =
      static_cast<int>(sizeof(TensorStorage) + sizeof(PipelineStorage));

  struct Arguments {
    ElementD* ptr_d;  // [M, n] row-major
    int n;            // output columns
  };

  using TmaStoreD = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{},
      cute::make_tensor(cute::make_gmem_ptr<ElementD>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0)),
                                          cute::make_stride(int64_t(0), cute::_1{}))),
      SmemLayoutD{}));

  struct Params {
    TmaStoreD tma_store_d;
    int n;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape,
                                        Arguments const& args, void* /*workspace*/) {
    using namespace cute;
    int m = get<0>(problem_shape);
    Tensor tensor_d = make_tensor(
        make_gmem_ptr(args.ptr_d),
        make_layout(make_shape(int32_t(m), int32_t(args.n)), make_stride(int64_t(args.n), _1{})));
    return {make_tma_copy(SM90_TMA_STORE{}, tensor_d, SmemLayoutD{}), args.n};
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    int packed_n = cute::get<1>(problem_shape);
    // TMA needs 16-byte aligned row strides and base address.
    constexpr int kAlign = 16 / sizeof(ElementD);
    return args.n > 0 && args.n % kAlign == 0 && 2 * args.n <= packed_n &&
           reinterpret_cast<uintptr_t>(args.ptr_d) % 16 == 0;
  }

  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_load_pipe_increment(CtaTileMNK) {
    return 1;
  }
  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_store_pipe_increment(CtaTileMNK) {
    return 1;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_store_d.get_tma_descriptor());
  }

  CUTLASS_HOST_DEVICE SwiGluEpilogue(Params const& params, TensorStorage& /*shared*/)
      : params_(params) {}

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }

  template <class... Ts>
  CUTLASS_DEVICE LoadPipelineState load(LoadPipeline, LoadPipelineState state, Ts&&...) {
    return state;
  }
  CUTLASS_DEVICE LoadPipelineState load_tail(LoadPipeline, LoadPipelineState state) {
    return state;
  }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem_shape_mnkl,
                            TileShapeMNK tile_shape_mnk, TileCoordMNKL tile_coord_mnkl,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma,
                            int thread_idx, TensorStorage& shared_tensors,
                            int /*subtile_index*/ = -1) {
    using namespace cute;
    static_assert(is_static<TileShapeMNK>::value);
    static_assert(size<0>(TileShapeMNK{}) == kTileM && size<1>(TileShapeMNK{}) == kTilePacked);
    static_assert(is_same_v<typename AccEngine::value_type, float>, "fp32 accumulators");

    // A wgmma fp32 accumulator fragment: ((2 adjacent columns, 2 rows 8 apart, blocks of
    // 8 columns), MMA_M, MMA_N); `Pairs` says where gate and up values sit in it.
    static_assert(rank(AccLayout{}) == 3 && rank<0>(AccLayout{}) == 3);
    static_assert(size<0, 0>(AccLayout{}) == 2 && size<0, 1>(AccLayout{}) == 2);
    constexpr int kBlocks = size<0, 2>(AccLayout{});
    if constexpr (is_same_v<Pairs, InterleavedPairs>) {
      static_assert(kBlocks % (2 * InterleavedPairs::kBlocksPerHalf) == 0,
                    "an MMA atom must hold whole gate/up block pairs");
    } else {
      static_assert(size<2>(AccLayout{}) == 2, "gate and up accumulators: MMA_N is 2");
    }

    constexpr int kThreads = size(TiledMma{});
    auto sync_epilogue_threads = [] {
      cutlass::arch::NamedBarrier::sync(kThreads,
                                        cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    };

    // The previous tile's TMA store must be done reading shared memory before we
    // overwrite it. Only the issuing thread has a bulk group to wait on; for the others
    // the wait returns at once and the barrier holds them.
    tma_store_wait<0>();
    sync_epilogue_threads();

    Tensor sD = make_tensor(make_smem_ptr(shared_tensors.smem_d.begin()), SmemLayoutD{});
    // (m, packed n) tile coordinate of every accumulator this thread holds. The thread
    // index goes through an opaque move first: otherwise the compiler hoists these
    // loop-invariant addresses out of the persistent tile loop, and they sit in registers
    // through every mainloop, next to the accumulators (spilling in the pingpong kernel).
    int opaque_thread_idx;
    asm volatile("mov.b32 %0, %1;" : "=r"(opaque_thread_idx) : "r"(thread_idx));
    Tensor tAcc_coord = tiled_mma.get_slice(opaque_thread_idx)
                            .partition_C(make_identity_tensor(take<0, 2>(tile_shape_mnk)));
    static_assert(decltype(size(tAcc_coord))::value == decltype(size(accumulators))::value);

    cutlass::NumericArrayConverter<ElementD, float, 2, cutlass::FloatRoundStyle::round_to_nearest>
        convert;
    CUTLASS_PRAGMA_UNROLL
    for (int mma_n = 0; mma_n < size<2>(accumulators); ++mma_n) {
      CUTLASS_PRAGMA_UNROLL
      for (int mma_m = 0; mma_m < size<1>(accumulators); ++mma_m) {
        CUTLASS_PRAGMA_UNROLL
        for (int row = 0; row < 2; ++row) {
          CUTLASS_PRAGMA_UNROLL
          for (int block = 0; block < kBlocks; ++block) {
            if (!Pairs::IsGate(block, mma_n)) continue;
            const int up_block = Pairs::UpBlock(block), up_mma_n = Pairs::UpMmaN(mma_n);
            auto gate0 = make_coord(make_coord(0, row, block), mma_m, mma_n);
            auto gate1 = make_coord(make_coord(1, row, block), mma_m, mma_n);
            auto up0 = make_coord(make_coord(0, row, up_block), mma_m, up_mma_n);
            auto up1 = make_coord(make_coord(1, row, up_block), mma_m, up_mma_n);

            cutlass::Array<float, 2> value;
            value[0] = Pairs::Combine(accumulators(gate0), accumulators(up0));
            value[1] = Pairs::Combine(accumulators(gate1), accumulators(up1));
            cutlass::Array<ElementD, 2> rounded = convert(value);

            auto coord = tAcc_coord(gate0);
            int m = get<0>(coord);
            int n = Pairs::OutputColumn(get<1>(coord));
            // Columns n and n + 1 (n even) share one 4-byte word under the swizzle.
            *reinterpret_cast<uint32_t*>(&sD(m, n)) =
                reinterpret_cast<uint32_t const&>(rounded);
          }
        }
      }
    }

    // Make the generic-proxy smem writes visible to the TMA (async proxy), then let one
    // thread issue the store of the whole tile. Rows/columns past (M, n) are clipped by TMA.
    cutlass::arch::fence_view_async_shared();
    sync_epilogue_threads();
    if (thread_idx == 0) {
      auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
      int m_total = get<0>(problem_shape_mnkl);
      Tensor mD = params_.tma_store_d.get_tma_tensor(make_shape(m_total, params_.n));
      Tensor gD = local_tile(mD, Shape<Int<kTileM>, Int<kTileN>>{}, make_coord(m_coord, n_coord));
      auto cta_tma = params_.tma_store_d.get_slice(Int<0>{});
      copy(params_.tma_store_d, cta_tma.partition_S(sD), cta_tma.partition_D(gD));
      tma_store_arrive();
    }
    return make_tuple(load_state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    // Shared memory must outlive every TMA store that reads it (and, in the pingpong
    // kernel, the other warpgroup reuses the tile next).
    cute::tma_store_wait<0>();
    return cute::make_tuple(load_state, store_state);
  }

 private:
  Params const& params_;
};

}  // namespace jax_swiglu
