// The fp8 kernels' scales: an accumulator of quantized products stands for its value times
// its token's scale and its packed column's (jax_swiglu/_quantize.py), applied in fp32 before
// the pairing and the activation. The 16-bit kernels take `NoScales`.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <cstdint>

#include "../mainloop/edge_tiles.cuh"
#include "scale_params.cuh"

namespace jax_swiglu {

// The 16-bit kernels: the accumulators are the products.
struct NoScales {
  static constexpr bool kScaled = false;
  template <class... Ts>
  CUTLASS_DEVICE static void Apply(ScaleParams const&, Ts&&...) {}
};

// Tokens on the wgmma M side: accumulator (m, p) of a [kTileM, kTilePacked] tile times
// x_scale[row] * w_scale[column], at the global row its loads came from (an edge tile's rows
// start at EdgeTileOrigin where the store shifts them: kShiftedRows) and its packed column;
// rows past M and columns past the packed width (a tile's padding, never stored) get 0.
// A thread's accumulators span few rows (2 per MMA_M atom) and few columns (2 per 8-column
// block), so each scale is loaded once, from a clamped index (no branch per load), and the
// scale pointers are read from the kernel parameters once: read per accumulator, behind a
// branch each, they cost an indexed constant load and two global loads per accumulator.
// The cooperative epilogue runs while the tensor cores wait and is bound by the instructions
// it issues: where the tile's columns all lie inside the packed width with a scale each (the
// common case, decided once per tile), a thread's two adjacent columns of each 8-column block
// take one 8-byte load at a fixed offset from one address, instead of an index, a clamp, a
// select and a load per column. Only where a warpgroup's share is one 64-row atom: a 128-row
// share (pingpong) holds twice the accumulators, its column scales loaded ahead would spill,
// and its epilogue overlaps the other warpgroup's mainloop.
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
    // Fragment ((2 adjacent columns, 2 rows 8 apart, blocks of 8 columns), MMA_M, MMA_N).
    static_assert(rank(AccLayout{}) == 3 && rank<0>(AccLayout{}) == 3);
    constexpr int kBlocks = size<0, 2>(AccLayout{});
    constexpr int kMmaM = size<1>(AccLayout{});
    constexpr int kMmaN = size<2>(AccLayout{});
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
    const ScaleParams read_once = scales;

    float token_scale[2][kMmaM];
    CUTLASS_PRAGMA_UNROLL
    for (int mma_m = 0; mma_m < kMmaM; ++mma_m) {
      CUTLASS_PRAGMA_UNROLL
      for (int row = 0; row < 2; ++row) {
        const int m = row_origin + get<0>(tAcc_coord(make_coord(make_coord(0, row, 0), mma_m, 0)));
        const float value = TokenScale(read_once, m < m_total ? m : m_total - 1);
        token_scale[row][mma_m] = m < m_total ? value : 0.0f;
      }
    }
    // Column p's scale, for the thread's columns (0 | 1) of each block of each atom.
    float column_scale[kMmaN][kBlocks][2];
    auto for_each_column = [](auto&& f) {
      CUTLASS_PRAGMA_UNROLL
      for (int mma_n = 0; mma_n < kMmaN; ++mma_n) {
        CUTLASS_PRAGMA_UNROLL
        for (int block = 0; block < kBlocks; ++block) {
          CUTLASS_PRAGMA_UNROLL
          for (int column = 0; column < 2; ++column) f(mma_n, block, column);
        }
      }
    };
    const int first_column = get<1>(tAcc_coord(make_coord(make_coord(0, 0, 0), 0, 0)));  // 2q
    const bool whole_pairs = kMmaM == 1 && read_once.w_scale_stride == 1 &&
                             column_origin + kTilePacked <= packed_total &&
                             reinterpret_cast<uintptr_t>(read_once.w_scale) % sizeof(float2) == 0;
    if (whole_pairs) {
      // Columns first_column + offset and the next one: column_origin and the offsets are
      // even, so each pair is one aligned float2.
      float2 const* pairs =
          reinterpret_cast<float2 const*>(read_once.w_scale + column_origin + first_column);
      CUTLASS_PRAGMA_UNROLL
      for (int mma_n = 0; mma_n < kMmaN; ++mma_n) {
        CUTLASS_PRAGMA_UNROLL
        for (int block = 0; block < kBlocks; ++block) {
          const int offset =  // compile-time
              get<1>(tAcc_coord(make_coord(make_coord(0, 0, block), 0, mma_n))) - first_column;
          const float2 pair = __ldg(pairs + offset / 2);
          column_scale[mma_n][block][0] = pair.x;
          column_scale[mma_n][block][1] = pair.y;
        }
      }
    } else {
      for_each_column([&](int mma_n, int block, int column) {
        const int p = column_origin +
                      get<1>(tAcc_coord(make_coord(make_coord(column, 0, block), 0, mma_n)));
        const float value = ColumnScale(read_once, p < packed_total ? p : packed_total - 1);
        column_scale[mma_n][block][column] = p < packed_total ? value : 0.0f;
      });
    }
    for_each_column([&](int mma_n, int block, int column) {
      CUTLASS_PRAGMA_UNROLL
      for (int mma_m = 0; mma_m < kMmaM; ++mma_m) {
        CUTLASS_PRAGMA_UNROLL
        for (int row = 0; row < 2; ++row) {
          float& a = accumulators(make_coord(make_coord(column, row, block), mma_m, mma_n));
          a = a * token_scale[row][mma_m] * column_scale[mma_n][block][column];
        }
      }
    });
  }
};

}  // namespace jax_swiglu
