// The fp8 kernels' scales: an accumulator of quantized products stands for its value times
// its token's scale and its packed column's (jax_swiglu/_quantize.py), applied in fp32 before
// the pairing and the activation. The 16-bit kernels take `NoScales`.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "../mainloop/edge_tiles.cuh"

namespace jax_swiglu {

// x row m's scale x_scale[m], packed column p's w_scale[p * w_scale_stride] (stride 1: a
// scale per packed column; 0: one for all). Null for the 16-bit kernels.
struct ScaleParams {
  float const* x_scale = nullptr;
  float const* w_scale = nullptr;
  int w_scale_stride = 0;
};

CUTLASS_DEVICE float TokenScale(ScaleParams const& scales, int row) {
  return __ldg(scales.x_scale + row);
}
CUTLASS_DEVICE float ColumnScale(ScaleParams const& scales, int column) {
  return __ldg(scales.w_scale + column * scales.w_scale_stride);
}

// The 16-bit kernels: the accumulators are the products.
struct NoScales {
  static constexpr bool kScaled = false;
  template <class... Ts>
  CUTLASS_DEVICE static void Apply(ScaleParams const&, Ts&&...) {}
};

// Tokens on the wgmma M side: accumulator (m, p) of a [kTileM, kTilePacked] tile times
// x_scale[row] * w_scale[column], at the global row its loads came from (an edge tile's rows
// start at EdgeTileOrigin where the store shifts them: kShiftedRows) and its packed column;
// rows past M and columns past the packed width (a tile's padding, never stored) get 0. The
// scales come through the read-only cache: a thread's columns repeat over its rows and a
// row's over its columns.
template <int kTileM, int kTilePacked, bool kShiftedRows>
struct TokenAndColumnScales {
  static constexpr bool kScaled = true;

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma>
  CUTLASS_DEVICE static void Apply(ScaleParams const& scales,
                                   ProblemShapeMNKL problem_shape_mnkl,
                                   TileShapeMNK tile_shape_mnk, TileCoordMNKL tile_coord_mnkl,
                                   cute::Tensor<AccEngine, AccLayout>& accumulators,
                                   TiledMma tiled_mma, int thread_idx) {
    using namespace cute;
    int opaque_thread_idx;
    asm volatile("mov.b32 %0, %1;" : "=r"(opaque_thread_idx) : "r"(thread_idx));
    Tensor tAcc_coord = tiled_mma.get_slice(opaque_thread_idx)
                            .partition_C(make_identity_tensor(take<0, 2>(tile_shape_mnk)));
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    const int m_total = static_cast<int>(get<0>(problem_shape_mnkl));
    const int packed_total = static_cast<int>(get<1>(problem_shape_mnkl));
    const int row_origin = kShiftedRows
                               ? EdgeTileOrigin(static_cast<int>(m_coord), kTileM, m_total)
                               : static_cast<int>(m_coord) * kTileM;
    const int column_origin = static_cast<int>(n_coord) * kTilePacked;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); ++i) {
      const int row = row_origin + get<0>(tAcc_coord(i));
      const int column = column_origin + get<1>(tAcc_coord(i));
      const float x_scale = row < m_total ? TokenScale(scales, row) : 0.0f;
      const float w_scale = column < packed_total ? ColumnScale(scales, column) : 0.0f;
      accumulators(i) = accumulators(i) * x_scale * w_scale;
    }
  }
};

}  // namespace jax_swiglu
