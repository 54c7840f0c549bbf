// The direct store path of the SwiGLU epilogue (epilogue/swiglu_epilogue.cuh): each
// thread's rounded pairs straight from registers to global memory, no shared memory.
//
// DirectStore: each run of 4 gate/up pairs becomes one 16-byte store of output columns
// 8q .. 8q + 7 of the run (lane q of a quad) at its global address; rows past M, rows of
// the tile above (in an edge tile moved inside, see kShiftedRows), the other half's rows
// (in a half-tile unit, split_tail.cuh) and columns past n are skipped (n is a multiple of
// 8, so a run's 8 columns are all inside or all outside). A warp's store covers 8 rows x 64
// bytes: whole 32-byte sectors.
// Nothing waits: the next tile's mainloop starts as soon as the stores are issued.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <cstdint>

#include "../../kernel_configs.h"
#include "../mainloop/edge_tiles.cuh"
#include "../schedulers/split_tail.cuh"
#include "pairs.cuh"

namespace jax_swiglu {

// `Pairs` says where a thread's gate and up values sit (epilogue/pairs.cuh); the output tile
// is [kTileM, kTilePacked / 2] of ElementD. kHalfUnits: the scheduler may hand it a half tile
// (split_tail.cuh), marked in the tile's batch index; only the split-tail configs' stores
// check for one.
// `Rows` says which rows of a tile are its own (TileRows: DenseTileRows, or ExpertTileRows
// for grouped tiles, schedulers/expert_groups.cuh).
template <class ElementD, int kTileM, int kTilePacked, class Pairs, bool kHalfUnits = false,
          class Rows = DenseTileRows>
struct DirectStore {
  // An edge tile's rows come from where EdgeTileMainloop loaded them (edge_tiles.cuh): the
  // kernel assembly picks that mainloop by this.
  static constexpr bool kShiftedRows = true;
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile

  struct TensorStorage {};
  static constexpr int kSharedBytes = 0;

  struct Params {
    ElementD* ptr_d;  // [M, n] row-major
    int n;            // output columns
  };
  static Params Make(int /*m*/, ElementD* ptr_d, int n) { return {ptr_d, n}; }
  CUTLASS_DEVICE static void Prefetch(Params const&) {}

  template <int kBlocks, class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL,
            class AccEngine, class AccLayout, class TiledMma>
  CUTLASS_DEVICE static void Store(Params const& params, ProblemShapeMNKL problem_shape_mnkl,
                                    TileShapeMNK tile_shape_mnk, TileCoordMNKL tile_coord_mnkl,
                                    cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                    TiledMma tiled_mma, int thread_idx,
                                    TensorStorage& /*shared_tensors*/) {
    using namespace cute;
    // Coordinates as in the TMA path (the opaque move keeps them out of the mainloop).
    int opaque_thread_idx;
    asm volatile("mov.b32 %0, %1;" : "=r"(opaque_thread_idx) : "r"(thread_idx));
    Tensor tAcc_coord = tiled_mma.get_slice(opaque_thread_idx)
                            .partition_C(make_identity_tensor(take<0, 2>(tile_shape_mnk)));
    const int m0 = get<0>(tAcc_coord(0));
    const int p0 = get<1>(tAcc_coord(0));  // 2q
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    // An edge tile's rows start where its loads did (edge_tiles.cuh); rows before the tile's
    // own start belong to the tile above (or another expert) and are not stored again.
    const int m_total = static_cast<int>(get<0>(problem_shape_mnkl));
    const TileRows rows = Rows::template Of<kTileM>(m_total, static_cast<int>(m_coord),
                                                    static_cast<int>(l_coord));
    const int row0 = rows.origin + m0;
    const int col0 = static_cast<int>(n_coord) * kTileN + 4 * p0;  // 8q
    const int rows_above = rows.first - m0;
    // A unit of a split last round (split_tail.cuh) computed one row of m64 atoms only.
    const int half = kHalfUnits ? SplitTailHalfOfBatchIndex(static_cast<int>(l_coord)) : -1;
    const int own_end = rows.end < m_total - rows.origin ? rows.end : m_total - rows.origin;
    const int rows_left = own_end - m0;
    const int cols_left = params.n - col0;
    const int64_t row_stride = params.n;
    ElementD* const thread_base = params.ptr_d + row0 * row_stride + col0;

    CUTLASS_PRAGMA_UNROLL
    for (int mma_m = 0; mma_m < size<1>(accumulators); ++mma_m) {
      if (kHalfUnits && half >= 0 && mma_m != half) continue;
      CUTLASS_PRAGMA_UNROLL
      for (int row = 0; row < 2; ++row) {
        CUTLASS_PRAGMA_UNROLL
        for (int mma_n = 0; mma_n < size<2>(accumulators); ++mma_n) {
          CUTLASS_PRAGMA_UNROLL
          for (int block = 0; block < kBlocks; block += kRunBlocks) {
            if (!Pairs::template IsGate<kBlocks>(block, mma_n)) continue;
            auto coord = tAcc_coord(make_coord(make_coord(0, row, block), mma_m, mma_n));
            const int dm = get<0>(coord) - m0;                       // compile-time
            const int dn = Pairs::OutputColumn(get<1>(coord) - p0);  // compile-time
            if (dm < rows_above || dm >= rows_left || dn >= cols_left) continue;
            *reinterpret_cast<uint4*>(thread_base + dm * row_stride + dn) =
                rows.zeros ? make_uint4(0, 0, 0, 0)
                           : RunWords<Pairs, ElementD, kBlocks>(accumulators, row, block, mma_m,
                                                                mma_n);
          }
        }
      }
    }
  }


  // Nothing to wait for: the stores are plain ones.
  CUTLASS_DEVICE static void Drain() {}
};

}  // namespace jax_swiglu
