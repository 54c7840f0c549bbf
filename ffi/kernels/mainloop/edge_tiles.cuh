// Tiles on the edge of the problem along the tokens: where their loads of x start.
//
// A TMA load whose box lies partly or wholly outside the tensor fills the outside part with
// zeros, and on Hopper that is slow enough to show in the kernel's time, more so the more of
// the box is outside and the narrower the tile (x's box is reused over fewer columns): a last
// row of 128x128 tiles holding one row of x, or a 2x1 cluster padding an odd count of tile rows
// with a tile wholly outside, cost measurably more than a whole row of tiles. So an edge
// tile's x box stays inside: a tile that reaches past row M loads the tile_m rows that end
// there (M - tile_m .. M - 1), and the epilogue stores only the rows that are the tile's own
// (>= tile * tile_m; none for a tile wholly outside). With M < tile_m nothing can move and the
// box keeps its zeros. Along N the weight boxes stay: a partial one measured no slower, and a
// tile wholly outside that a 1x2 cluster pads costs the wave it adds, not its loads. The
// swap-AB form's token tiles (x is the wgmma's B there, the tokens its N) move the same way:
// left in place, its last token tile ran slower the fewer tokens it held.
// docs/design.md points at the measurements.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace jax_swiglu {

// The first row (or column) that tile `tile` of `tile_extent` loads, along a dimension of
// `extent`: its own start, or for a tile that reaches past the end, the start of the last
// tile_extent-long run inside (0 if there is none).
CUTLASS_HOST_DEVICE constexpr int EdgeTileOrigin(int tile, int tile_extent, int extent) {
  const int start = tile * tile_extent;
  const int last_inside = extent > tile_extent ? extent - tile_extent : 0;
  return start < last_inside ? start : last_inside;
}

// The rows of an output tile its epilogue stores: the tile computed rows origin .. origin +
// tile_m - 1 (where its loads of x started), and rows origin + first .. origin + end - 1 are
// its own (end may pass T; the store stops there too). A zeros tile stores zeros there.
struct TileRows {
  int origin;
  int first;
  int end;
  bool zeros;
};

// A dense tile's rows: its own start, moved inside x at the edge as above.
struct DenseTileRows {
  template <int kTileM>
  CUTLASS_HOST_DEVICE static TileRows Of(int m_total, int m_coord, int /*l_coord*/) {
    const int origin = EdgeTileOrigin(m_coord, kTileM, m_total);
    return {origin, m_coord * kTileM - origin, m_total - origin, false};
  }
};

// CUTLASS's SM90 TMA mainloop `Base` with its producer's x loads moved as above; the math
// (mma, mma_tail) is Base's. x is Base's A (tokens on M) or, with kXIsB, its B (swap-AB: the
// tokens are N). Pair it only with an epilogue that stores an edge tile's rows from
// EdgeTileOrigin (SwiGluEpilogue's direct store: kShiftedRows; the swap-AB epilogue with
// DenseTileRows).
template <class Base, bool kXIsB = false>
struct EdgeTileMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;

  // Base's tiled views of the weights and x, plus x whole (to cut moved tiles from) and the
  // token count.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_mnkl,
                                Params const& params) const {
    using namespace cute;
    auto [m, n, k, l] = problem_shape_mnkl;
    auto tiled = Base::load_init(problem_shape_mnkl, params);
    if constexpr (kXIsB) {
      Tensor x_nkl = params.tma_load_b.get_tma_tensor(make_shape(n, k, l));  // (n, k, l)
      return make_tuple(get<0>(tiled), get<1>(tiled), x_nkl, static_cast<int>(n));
    } else {
      Tensor x_mkl = params.tma_load_a.get_tma_tensor(make_shape(m, k, l));  // (m, k, l)
      return make_tuple(get<0>(tiled), get<1>(tiled), x_mkl, static_cast<int>(m));
    }
  }

  template <class TensorA, class TensorB, class TensorX, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB, TensorX, int> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    constexpr int kXMode = kXIsB ? 1 : 0;
    constexpr int kTileTokens = size<kXMode>(TileShape{});
    const int token_tile = static_cast<int>(get<kXMode>(blk_coord));
    // Token tile `token_tile` of this view of x starts at EdgeTileOrigin (its own start but at
    // the edge).
    const int shift =
        EdgeTileOrigin(token_tile, kTileTokens, get<3>(inputs)) - token_tile * kTileTokens;
    Tensor moved = domain_offset(make_coord(shift, 0, 0), get<2>(inputs));
    if constexpr (kXIsB) {
      Tensor x_tiles = local_tile(moved, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
      Base::load(params, pipeline, smem_pipe_write, make_tuple(get<0>(inputs), x_tiles),
                 blk_coord, k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster,
                 shared_tensors);
    } else {
      Tensor x_tiles = local_tile(moved, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
      Base::load(params, pipeline, smem_pipe_write, make_tuple(x_tiles, get<1>(inputs)),
                 blk_coord, k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster,
                 shared_tensors);
    }
  }
};

}  // namespace jax_swiglu
