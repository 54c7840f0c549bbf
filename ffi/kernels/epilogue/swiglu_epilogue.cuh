// The SwiGLU epilogue collective for CUTLASS 3.x SM90 warp-specialized GEMM kernels with the
// tokens on the wgmma M side (the interleaved kernel's prefill form, and the gate-then-up
// kernel), composed of named parts:
//  - Pairs (epilogue/pairs.cuh): where a thread's gate accumulator and its up partner sit
//    (the same thread's registers), how they combine (act(g) * u in fp32) and round once;
//  - Scales (epilogue/scales.cuh): NoScales, or the fp8 kernel's token and column scales,
//    applied to every accumulator first;
//  - Store: DirectStore (epilogue/direct_store.cuh: registers -> global memory) or TmaStore
//    (epilogue/tma_store.cuh: registers -> swizzled shared memory -> one TMA store).
// The packed layout's quad transpose (jax_swiglu/_layout.py) gives each thread 8 consecutive
// output columns per 32-column run, so either store writes 16 bytes per thread and run, and
// the [M, 2N] product never reaches HBM.
//
// It implements the epilogue interface that CUTLASS's sm90 cooperative and pingpong
// GemmUniversal kernels call (store / store_tail; the empty load side is
// EpilogueWithoutSource's).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <cstdint>

#include "../../kernel_configs.h"
#include "no_source.cuh"
#include "pairs.cuh"
#include "scales.cuh"

namespace jax_swiglu {

template <class ElementD_, class CtaTileShape_, class Pairs, class Store, class Scales>
class SwiGluEpilogue : public EpilogueWithoutSource<ElementD_> {
  using Base = EpilogueWithoutSource<ElementD_>;

 public:
  using typename Base::ElementD;
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::PipelineStorage;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;

  // Whether an edge tile's rows are stored from where EdgeTileMainloop loaded them: the
  // kernel assembly picks the mainloop by this.
  static constexpr bool kShiftedRows = Store::kShiftedRows;

  static constexpr int kTileM = cute::size<0>(CtaTileShape_{});
  static constexpr int kTilePacked = cute::size<1>(CtaTileShape_{});
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile
  static_assert(kTilePacked % (2 * kGateUpBlock) == 0,
                "a tile must hold whole gate/up block pairs");
  static_assert(Store::kTileN == kTileN, "the store writes this epilogue's output tile");
  static_assert(kGateUpBlock == 32 && sizeof(ElementD) == 2, "4 pairs of 2 bytes per run");

  using TensorStorage = typename Store::TensorStorage;
  // Shared memory the mainloop's stage count must leave free.
  static constexpr int kSharedBytes =
      Store::kSharedBytes == 0 ? 0
                               : static_cast<int>(sizeof(TensorStorage) + sizeof(PipelineStorage));

  using typename Base::Arguments;

  struct Params {
    typename Store::Params store;
    ScaleParams scales;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape,
                                        Arguments const& args, void* /*workspace*/) {
    return {Store::Make(static_cast<int>(cute::get<0>(problem_shape)), args.ptr_d, args.n),
            {args.x_scale, args.w_scale, args.w_scale_stride}};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::OutputFits(static_cast<int>(cute::get<1>(problem_shape)), args);
  }


  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Store::Prefetch(params.store);
  }

  CUTLASS_HOST_DEVICE SwiGluEpilogue(Params const& params, TensorStorage& /*shared*/)
      : params_(params) {}

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
    static_assert(kBlocks % kRunBlocks == 0, "an MMA atom holds whole 32-column runs");
    if constexpr (kIsInterleavedPairs<Pairs>) {
      static_assert((kBlocks * size<2>(AccLayout{})) % (2 * Pairs::kBlocksPerHalf) == 0,
                    "the MMA atoms must hold whole gate/up block pairs");
    } else {
      static_assert(size<2>(AccLayout{}) == 2, "gate and up accumulators: MMA_N is 2");
    }

    Scales::Apply(params_.scales, problem_shape_mnkl, tile_shape_mnk, tile_coord_mnkl,
                  accumulators, tiled_mma, thread_idx);
    Store::template Store<kBlocks>(params_.store, problem_shape_mnkl, tile_shape_mnk,
                                   tile_coord_mnkl, accumulators, tiled_mma, thread_idx,
                                   shared_tensors);
    return make_tuple(load_state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    Store::Drain();
    return cute::make_tuple(load_state, store_state);
  }

 private:
  Params const& params_;
};

}  // namespace jax_swiglu
