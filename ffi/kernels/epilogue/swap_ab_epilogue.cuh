// SwiGLU epilogue of the swap-AB (weights on the wgmma M side) interleaved kernel.
//
// With few tokens per tile (decode, and the mid-M tiles of 8k tokens that pad M by less than a
// 64-row token tile would) the interleaved GEMM runs transposed: the packed gate/up columns are
// the wgmma M side (64 rows per warpgroup and pass) and the tokens its N side, so every
// tensor-core row does useful work. The accumulator tile is then [packed columns, tokens]: each
// 64-row block of a warpgroup is one gate/up pair of 32-column runs, gate rows in warps 0-1
// and their up rows in warps 2-3. The wgmma layout gives the thread of warp w + 2 holding up
// row r + 32 the same lane and register index as the thread of warp w holding gate row r, so
// the pairing is an exchange of registers through shared memory, shared evenly: for the even
// 8-token blocks the up thread hands its values to the gate thread, for the odd ones the gate
// thread hands its to the up thread; the receiver computes act(g) * u in fp32 and rounds once.
// The rounded outputs, [token, column] in the tile, go through shared memory again (a thread
// holds 2 tokens per column, the output rows are column-contiguous) and leave in 16-byte
// stores of 8 columns of one token. A pass is 128 packed rows (64 output columns): one 64-row
// block of each warpgroup in the cooperative schedule, two blocks of its one warpgroup in
// pingpong; a 256-row tile runs two. A pass goes in chunks of kChunkTokens (16 or 32) tokens,
// so the shared memory held is one chunk's exchange and outputs whatever the tile's width: the
// mainloop keeps the rest for its stages. The assembly takes 32-token chunks (half the
// barriers) unless 16 leave the mainloop one stage more (SwapAbChunkTokens below).
//
// It implements the epilogue interface of CUTLASS's SM90 cooperative and pingpong
// GemmUniversal kernels, which call it only for the work unit that completes a tile (after the
// stream-K fixup has summed the partial accumulators; pingpong's two warpgroups take turns);
// the empty load side is EpilogueWithoutSource's. The fp8 kernel's form (Scaled) multiplies
// gate and up by their token's and packed column's scales (epilogue/scales.cuh) before the
// activation. `Rows` says which tokens of a tile are its own
// (TileRows, mainloop/edge_tiles.cuh: DenseTileRows for dense calls, whose last token tile
// loads the tokens that end at M, ExpertTileRows for grouped ones,
// schedulers/expert_groups.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "../../kernel_configs.h"
#include "../activations.cuh"
#include "../mainloop/edge_tiles.cuh"
#include "no_source.cuh"
#include "scales.cuh"

namespace jax_swiglu {

template <class ElementD_, class CtaTileShape_, Activation kActivation, bool kScaled = false,
          class Rows = DenseTileRows, int kChunkTokens_ = 32>
class SwapAbSwiGluEpilogue : public EpilogueWithoutSource<ElementD_> {
  using Base = EpilogueWithoutSource<ElementD_>;

 public:
  using typename Base::ElementD;
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::PipelineStorage;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;

  // The CUTLASS tile is (packed columns, tokens, k).
  static constexpr int kTilePacked = cute::size<0>(CtaTileShape_{});
  static constexpr int kTileTokens = cute::size<1>(CtaTileShape_{});
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile
  static_assert(kGateUpBlock == 32 && sizeof(ElementD) == 2, "8 outputs per 16-byte store");
  // A pass: 128 packed rows, 64 output columns.
  static constexpr int kPassPacked = 128;
  static constexpr int kPassColumns = kPassPacked / 2;
  static constexpr int kPasses = kTilePacked / kPassPacked;
  static_assert(kTilePacked % kPassPacked == 0, "whole passes of two 64-row blocks");
  // A thread's accumulators of one 64-row block: 64 x tokens over a warpgroup's 128; the
  // wgmma layout keeps 4 values per 8-token block (2 tokens x 2 rows), blocks in order.
  static constexpr int kBlockValues = kTileTokens / 2;
  static constexpr int kTokenBlockValues = 4;
  // A chunk: 2 or 4 blocks of 8 tokens (the last may be shorter); whole pairs of blocks, a
  // gate thread's and an up thread's.
  static constexpr int kChunkTokens = kChunkTokens_;
  static_assert(kChunkTokens == 16 || kChunkTokens == 32, "2 or 4 blocks of 8 tokens");
  static constexpr int kChunkValues = kChunkTokens / 8 * kTokenBlockValues;
  static constexpr int kChunks = (kBlockValues + kChunkValues - 1) / kChunkValues;
  static_assert(kTileTokens % 8 == 0, "whole 8-token blocks");
  // A chunk's exchange, [block of the pass][value][gate/up thread pair]: a 64-row block has 64
  // pairs, a pass two blocks (one per warpgroup, or both of one), and a warp's 32 writes or
  // reads of one value are 32 consecutive floats.
  static constexpr int kExchangeFloats = kPassPacked * kChunkValues;
  // The rounded outputs of a chunk, [token][column]; 8 elements of padding per row keep the
  // rows 16-byte aligned and spread a warp's writes (4 tokens x 4 column pairs) over banks.
  static constexpr int kOutRow = kPassColumns + 8;
  static constexpr int kOutElements = kChunkTokens * kOutRow;

  struct TensorStorage {
    // Separate buffers: a chunk's exchange can be written while the previous chunk's
    // outputs are still being stored (two barriers per chunk).
    alignas(16) float exchange[kExchangeFloats];
    alignas(16) ElementD outputs[kOutElements];
  };
  // Shared memory the mainloop's stage count must leave free.
  static constexpr int kSharedBytes =
      static_cast<int>(sizeof(TensorStorage) + sizeof(PipelineStorage));

  using typename Base::Arguments;
  struct Params {
    ElementD* ptr_d;
    int n;
    ScaleParams scales;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return {args.ptr_d, args.n, {args.x_scale, args.w_scale, args.w_scale_stride}};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::OutputFits(static_cast<int>(cute::get<0>(problem_shape)), args);
  }


  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const&) {}

  CUTLASS_HOST_DEVICE SwapAbSwiGluEpilogue(Params const& params, TensorStorage& /*shared*/)
      : params_(params) {}

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem_shape_mnkl,
                            TileShapeMNK, TileCoordMNKL tile_coord_mnkl,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma,
                            int thread_idx, TensorStorage& shared_tensors,
                            int /*subtile*/ = -1) {
    using namespace cute;
    static_assert(is_same_v<typename AccEngine::value_type, float>, "fp32 accumulators");
    // Cooperative: two warpgroups, one 64-row block each per pass; pingpong: one warpgroup
    // (thread_idx is its own), two blocks per pass.
    constexpr int kThreads = size(TiledMma{});
    static_assert(kThreads == 128 || kThreads == 256, "one or two consumer warpgroups");
    constexpr int kPassBlocks = kPassPacked / 64 / (kThreads / 128);
    auto sync_epilogue_threads = [] {
      cutlass::arch::NamedBarrier::sync(kThreads,
                                        cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    };

    // Each accumulator's (packed row, token) in the tile: ((values), 64-row blocks, 1).
    Tensor coords = tiled_mma.get_slice(thread_idx).partition_C(
        make_identity_tensor(make_shape(Int<kTilePacked>{}, Int<kTileTokens>{})));
    static_assert(rank(decltype(coords){}) == 3 &&
                  size<1>(decltype(coords){}) == kPasses * kPassBlocks &&
                  size<2>(decltype(coords){}) == 1 &&
                  size<0>(decltype(coords){}) == kBlockValues,
                  "wgmma blocks of 64 packed rows x all tokens");
    // Warps 2-3 of a warpgroup hold the up rows (32..63 of each 64-row block); a gate thread
    // and its up partner share one pair index.
    const bool up_thread = get<0>(coords(0, 0, 0)) % (2 * kGateUpBlock) >= kGateUpBlock;
    const int pair = (thread_idx / 128) * 64 + thread_idx % 64;

    auto [packed_tile, token_tile, k_coord, l_coord] = tile_coord_mnkl;
    const int tokens = static_cast<int>(get<1>(problem_shape_mnkl));
    // The tile's accumulator column t is token rows.origin + t; columns first .. end - 1 are
    // its own.
    const TileRows rows = Rows::template Of<kTileTokens>(tokens, static_cast<int>(token_tile),
                                                         static_cast<int>(l_coord));
    const int token0 = rows.origin;
    const int own_end = rows.end < tokens - token0 ? rows.end : tokens - token0;
    float* const exchange = shared_tensors.exchange;
    ElementD* const outputs = shared_tensors.outputs;
    // The parameters read once (inside the loops each read is an indexed constant load).
    const ScaleParams scales = params_.scales;
    const int n = params_.n;
    ElementD* const ptr_d = params_.ptr_d;
    // The fp8 scales (kScaled) are loaded per pass and chunk, not per output: in the wgmma
    // layout a value v of a 64-row block is token first_token + 8 (v / 4) + v % 2 of the tile
    // and the thread's row (v / 2) % 2 of the two it holds in the block, so a block's 4 column
    // scales and a chunk's 4 token scales serve all its outputs. Indices are clamped into the
    // arrays: the rows and tokens they stand in for (padding) are never stored.
    const int packed_total = static_cast<int>(get<0>(problem_shape_mnkl));
    const int first_token = get<1>(coords(0, 0, 0));
    constexpr int kChunkBlocks = kChunkTokens / 8;

    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPasses; ++pass) {
      const int column0 = static_cast<int>(packed_tile) * kTileN + pass * kPassColumns;
      // [block of the pass][the thread's row of it]: its gate column's scale, its up column's.
      float gate_scales[kPassBlocks][2];
      float up_scales[kPassBlocks][2];
      if constexpr (kScaled) {
        CUTLASS_PRAGMA_UNROLL
        for (int block = 0; block < kPassBlocks; ++block) {
          CUTLASS_PRAGMA_UNROLL
          for (int row = 0; row < 2; ++row) {
            const int gate_row = get<0>(coords(2 * row, pass * kPassBlocks + block, 0)) -
                                 (up_thread ? kGateUpBlock : 0);
            const int gate_column = static_cast<int>(packed_tile) * kTilePacked + gate_row;
            gate_scales[block][row] = ColumnScale(scales, min(gate_column, packed_total - 1));
            up_scales[block][row] =
                ColumnScale(scales, min(gate_column + kGateUpBlock, packed_total - 1));
          }
        }
      }

      CUTLASS_PRAGMA_UNROLL
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        const int chunk_token0 = chunk * kChunkTokens;
        // Chunks with none of the tile's own tokens (a moved edge tile's first ones, any past
        // M) store nothing: the same for every thread, so no barrier is skipped by some only.
        if (chunk_token0 >= own_end) break;
        if (chunk_token0 + kChunkTokens <= rows.first) continue;
        // [pair of the chunk's 8-token blocks][token of the two]: the scales of the thread's
        // tokens in the blocks it computes (the even ones in a gate thread, the odd ones in an
        // up thread; see below).
        float token_scales[kChunkBlocks / 2][2];
        if constexpr (kScaled) {
          CUTLASS_PRAGMA_UNROLL
          for (int pair_of_blocks = 0; pair_of_blocks < kChunkBlocks / 2; ++pair_of_blocks) {
            CUTLASS_PRAGMA_UNROLL
            for (int token = 0; token < 2; ++token) {
              const int block = chunk * kChunkBlocks + 2 * pair_of_blocks + (up_thread ? 1 : 0);
              const int row = token0 + first_token + 8 * block + token;
              token_scales[pair_of_blocks][token] =
                  TokenScale(scales, max(0, min(row, tokens - 1)));
            }
          }
        }
        // Value v of a block belongs to 8-token block v / 4: the gate thread receives the
        // even blocks, the up thread the odd ones. The previous chunk's exchange readers are
        // done (its second barrier below), so it may be overwritten.
        CUTLASS_PRAGMA_UNROLL
        for (int block = 0; block < kPassBlocks; ++block) {
          Tensor values = accumulators(_, pass * kPassBlocks + block, 0);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kChunkValues; ++i) {
            const int v = chunk * kChunkValues + i;
            const bool odd = (v / kTokenBlockValues) % 2 == 1;
            if (v < kBlockValues && odd != up_thread) {
              exchange[(block * kChunkValues + i) * (kThreads / 2) + pair] = values(v);
            }
          }
        }
        // The exchange is written, and the previous chunk's outputs are stored.
        sync_epilogue_threads();
        if (!rows.zeros) {
          CUTLASS_PRAGMA_UNROLL
          for (int block = 0; block < kPassBlocks; ++block) {
            Tensor values = accumulators(_, pass * kPassBlocks + block, 0);
            Tensor value_coords = coords(_, pass * kPassBlocks + block, 0);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kChunkValues; ++i) {
              const int v = chunk * kChunkValues + i;
              const bool odd = (v / kTokenBlockValues) % 2 == 1;
              if (v < kBlockValues && odd == up_thread) {
                const float mine = values(v);
                const float partners =
                    exchange[(block * kChunkValues + i) * (kThreads / 2) + pair];
                float g = up_thread ? partners : mine;
                float u = up_thread ? mine : partners;
                const int token = get<1>(value_coords(v));
                const int gate_row = get<0>(value_coords(v)) - (up_thread ? kGateUpBlock : 0);
                if constexpr (kScaled) {
                  const float x_scale =
                      token_scales[(v / kTokenBlockValues) % kChunkBlocks / 2][v % 2];
                  g *= x_scale * gate_scales[block][(v / 2) % 2];
                  u *= x_scale * up_scales[block][(v / 2) % 2];
                }
                outputs[(token - chunk_token0) * kOutRow + OutputColumn(gate_row)] =
                    cutlass::NumericConverter<ElementD, float,
                                              cutlass::FloatRoundStyle::round_to_nearest>{}(
                        Activate<kActivation, false>(g) * u);
              }
            }
          }
        }
        // The chunk's outputs are in shared memory, and its exchange is read.
        sync_epilogue_threads();

        // 16-byte stores: 8 consecutive output columns of one token.
        constexpr int kGroupsPerToken = kPassColumns / 8;
        CUTLASS_PRAGMA_NO_UNROLL
        for (int group = thread_idx; group < kChunkTokens * kGroupsPerToken;
             group += kThreads) {
          const int token = chunk_token0 + group / kGroupsPerToken;
          const int column = (group % kGroupsPerToken) * 8;
          if (token >= kTileTokens || token < rows.first || token >= own_end ||
              column0 + column >= n) {
            continue;
          }
          const uint4 value =
              rows.zeros ? make_uint4(0, 0, 0, 0)
                         : *reinterpret_cast<const uint4*>(
                               outputs + (token - chunk_token0) * kOutRow + column);
          *reinterpret_cast<uint4*>(ptr_d + int64_t(token0 + token) * n +
                                    column0 + column) = value;
        }
      }
    }
    return make_tuple(load_state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    return cute::make_tuple(load_state, store_state);
  }

 private:
  // The output column (of a pass's 64) of the gate accumulator at packed row `row` of the tile:
  // row's 64-row block holds 32 columns, and the packed layout's quad transpose keeps column
  // 8q + 2j + e of a 32-column run at packed position 8j + 2q + e (jax_swiglu/_layout.py).
  CUTLASS_DEVICE static int OutputColumn(int row) {
    const int block = (row % kPassPacked) / (2 * kGateUpBlock);
    const int position = row % (2 * kGateUpBlock);
    return block * kGateUpBlock + 8 * ((position % 8) / 2) + 2 * (position / 8) + position % 2;
  }

  Params const& params_;
};

}  // namespace jax_swiglu
