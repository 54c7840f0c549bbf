// The swap-AB mainloop's loads of the 16-bit packed weights with gate and up rows paired.
//
// The packed layout keeps gate and up columns in runs of kGateUpBlock (32): [g 32 | u 32] per
// 64 packed columns (jax_swiglu/_layout.py). In the swap-AB form the packed columns are the
// wgmma's M side, and a wgmma thread holds rows r and r + 8 of its warp's 16 rows of each
// 64-row block. Loaded in packed order, a block's gate rows sit in warps 0-1 and their up rows
// in warps 2-3, and the epilogue must exchange them through shared memory. Loaded through a
// 5-D view of the same [K, 2N] matrix, (8 columns, gate/up, 4 runs of 8, K, 64-column blocks)
// with strides (1, 32, 8, 2N, 64), the tile's rows come in runs of 8 instead: g0-7, u0-7,
// g8-15, u8-15, ..., so rows r and r + 8 of every warp are one feature's gate and up, and the
// epilogue pairs them in registers (swap_ab_epilogue.cuh, kPairedRows). The view's inner
// rows are 16 bytes (8 columns) instead of 128; the shared-memory tile is the same (MN-major,
// 128-byte swizzled), only which packed column each of its rows holds changes.
//
// PairedWeightRowsMainloop<Base> is CUTLASS's SM90 TMA + wgmma mainloop `Base` (its A the
// packed weights, MN-major) with its A loads through that view: the arguments are Base's, the
// parameters Base's plus the view's TMA, and the math (mma, mma_tail) is Base's.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "../../kernel_configs.h"

namespace jax_swiglu {

// Packed position (within its 64-column block) of row `row` of a 64-row block loaded through
// the paired view: rows come in runs of 8 columns, a gate run then its up run.
CUTLASS_HOST_DEVICE constexpr int PairedRowColumn(int row) {
  const int run = row / 16, up = (row / 8) % 2, column = row % 8;
  return up * kGateUpBlock + run * 8 + column;
}

template <class Base>
struct PairedWeightRowsMainloop : Base {
  using typename Base::Arguments;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::DispatchPolicy;
  using typename Base::GmemTiledCopyA;
  using typename Base::GmemTiledCopyB;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using ClusterShape = typename DispatchPolicy::ClusterShape;
  using InternalElementA = typename Base::InternalElementA;
  static_assert(sizeof(InternalElementA) == 2, "16-bit packed weights");
  static_assert(cutlass::gemm::detail::is_major<0, typename Base::StrideA>(),
                "packed-column-contiguous weights (MN-major A)");
  static_assert(kGateUpBlock == 32, "4 runs of 8 per gate or up run");
  static_assert(cute::size<0>(TileShape{}) % 64 == 0, "whole 64-row blocks");

  // The paired view's (M, K, L) layout: M = (8 columns, gate/up, run, 64-column block).
  using PairedStrideA = cute::Stride<
      cute::Stride<cute::_1, cute::Int<kGateUpBlock>, cute::_8, cute::Int<2 * kGateUpBlock>>,
      int64_t, cute::_0>;
  CUTLASS_HOST_DEVICE static auto PairedShape(int packed, int k, int l) {
    using namespace cute;
    return make_shape(make_shape(_8{}, _2{}, _4{}, packed / (2 * kGateUpBlock)), k, l);
  }
  static auto PairedWeights(InternalElementA const* weights, int packed, int k,
                            int64_t k_stride) {
    using namespace cute;
    return make_tensor(make_gmem_ptr(weights),
                       make_layout(PairedShape(packed, k, 1),
                                   PairedStrideA{make_stride(_1{}, Int<kGateUpBlock>{}, _8{},
                                                             Int<2 * kGateUpBlock>{}),
                                                 k_stride, _0{}}));
  }
  using PairedTmaA = decltype(make_tma_copy_A_sm90(
      GmemTiledCopyA{}, PairedWeights(nullptr, 0, 0, 0),
      SmemLayoutA{}(cute::_, cute::_, cute::Int<0>{}), TileShape{}, ClusterShape{}));

  struct Params : Base::Params {
    PairedTmaA tma_load_paired_a;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* workspace) {
    using namespace cute;
    Params params;
    static_cast<typename Base::Params&>(params) =
        Base::to_underlying_arguments(problem_shape, args, workspace);
    auto [m, n, k, l] = append<4>(problem_shape, 1);
    params.tma_load_paired_a = make_tma_copy_A_sm90(
        GmemTiledCopyA{},
        PairedWeights(reinterpret_cast<InternalElementA const*>(args.ptr_A), int(m), int(k),
                      int64_t(get<1>(args.dA))),
        SmemLayoutA{}(_, _, Int<0>{}), TileShape{}, ClusterShape{});
    return params;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto shape = cute::append<4>(problem_shape, 1);
    // Whole 64-column blocks of gate/up runs, and one matrix (no batch of weights).
    return Base::can_implement(problem_shape, args) &&
           int(cute::get<0>(shape)) % (2 * kGateUpBlock) == 0 && int(cute::get<3>(shape)) == 1;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_load_paired_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b.get_tma_descriptor());
  }

  // The weights' tiles through the paired view, x's as Base tiles them.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_mnkl,
                                Params const& params) const {
    using namespace cute;
    auto [m, n, k, l] = problem_shape_mnkl;
    Tensor weights = params.tma_load_paired_a.get_tma_tensor(PairedShape(int(m), int(k), int(l)));
    Tensor weight_tiles = local_tile(weights, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
    auto tiled = Base::load_init(problem_shape_mnkl, params);
    return make_tuple(weight_tiles, get<1>(tiled));
  }

  // Base's producer loop with the weights' TMA the paired view's.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor s_a = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor s_b = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    constexpr int cluster_x = size<0>(ClusterShape{});
    const int block_x = block_rank_in_cluster % cluster_x;
    const int block_y = block_rank_in_cluster / cluster_x;
    auto a_slice = params.tma_load_paired_a.get_slice(block_y);
    auto b_slice = params.tma_load_b.get_slice(block_x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor g_a = get<0>(inputs)(_, _, m_coord, _, l_coord);  // (BLK_M, BLK_K, k)
    Tensor g_b = get<1>(inputs)(_, _, n_coord, _, l_coord);  // (BLK_N, BLK_K, k)
    Tensor a_src = a_slice.partition_S(g_a);
    Tensor a_dst = a_slice.partition_D(s_a);
    Tensor b_src = b_slice.partition_S(g_b);
    Tensor b_dst = b_slice.partition_D(s_b);
    // The CTAs of the cluster that share a tile receive each multicast part.
    uint16_t mask_a = 0, mask_b = 0;
    auto cluster_blocks = Layout<ClusterShape>{};  // (m, n) -> block id
    if constexpr (cute::is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int n = 0; n < size<1>(cluster_blocks); ++n) {
        mask_a |= uint16_t(1) << cluster_blocks(block_x, n, Int<0>{});
      }
    }
    if constexpr (cute::is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int m = 0; m < size<0>(cluster_blocks); ++m) {
        mask_b |= uint16_t(1) << cluster_blocks(m, block_y, Int<0>{});
      }
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      copy(params.tma_load_paired_a.with(*barrier, mask_a), a_src(_, _, _, *k_tile_iter),
           a_dst(_, _, _, stage));
      copy(params.tma_load_b.with(*barrier, mask_b), b_src(_, _, _, *k_tile_iter),
           b_dst(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }
};

}  // namespace jax_swiglu
