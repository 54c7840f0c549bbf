// SwiGLU epilogue of the swap-AB (weights on the wgmma M side) interleaved kernel.
//
// At decode a call has a handful of tokens, so the interleaved GEMM runs transposed: the
// packed gate/up columns are the wgmma M side (64 rows per warpgroup) and the tokens its N
// side (8..64), and every tensor-core row does useful work while the weights stream. The
// accumulator tile is then [packed columns, tokens]: a warpgroup's 64 rows are one gate/up
// pair of 32-column runs, gate rows in warps 0-1 and their up rows in warps 2-3, so no thread
// holds both halves of a pair. The epilogue therefore meets them in shared memory: every
// thread writes its fp32 accumulators there, and after a barrier each thread reads the gate
// and up values of 8 consecutive output columns of one token, computes act(g) * u in fp32,
// rounds once and writes 16 bytes to the [M, N] output. At these sizes the epilogue is a
// small share of a tile that streams K * tile_n weights, so its shared-memory round trip
// costs little.
//
// It implements the epilogue interface of CUTLASS's SM90 cooperative GemmUniversal kernel,
// which calls it only for the work unit that completes a tile (after the stream-K fixup has
// summed the partial accumulators); the empty load side is EpilogueWithoutSource's. The fp8
// kernel's form (Scaled) multiplies gate and up by their token's and packed column's scales
// (epilogue/scales.cuh) before the activation. `Rows` says which tokens of a tile are its own
// (TileRows, mainloop/edge_tiles.cuh: PlainTileRows for dense calls, ExpertTileRows for
// grouped ones, schedulers/expert_groups.cuh).
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
          class Rows = PlainTileRows>
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
  static_assert(kTilePacked % (2 * kGateUpBlock) == 0, "a tile holds whole gate/up pairs");
  static_assert(kGateUpBlock == 32 && sizeof(ElementD) == 2, "4 pairs of 2 bytes per store");
  // One token's accumulators per shared-memory row, packed column fastest. The 4 floats of
  // padding shift the next row by 4 banks, so a warp's writes (8 packed columns x 4 token
  // pairs) land in 32 different banks.
  static constexpr int kRowFloats = kTilePacked + 4;
  static_assert((2 * kRowFloats) % 32 == 8, "conflict-free accumulator writes");

  struct TensorStorage {
    alignas(16) float accumulators[kTileTokens * kRowFloats];
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
    constexpr int kThreads = size(TiledMma{});
    auto sync_epilogue_threads = [] {
      cutlass::arch::NamedBarrier::sync(kThreads,
                                        cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    };

    // The previous tile's readers are done with shared memory before it is overwritten.
    sync_epilogue_threads();
    float* const smem = shared_tensors.accumulators;
    Tensor sAcc = make_tensor(make_smem_ptr(smem),
                              make_layout(make_shape(Int<kTilePacked>{}, Int<kTileTokens>{}),
                                          make_stride(_1{}, Int<kRowFloats>{})));
    Tensor tCsAcc = tiled_mma.get_slice(thread_idx).partition_C(sAcc);
    static_assert(decltype(size(tCsAcc))::value == decltype(size(accumulators))::value);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); ++i) tCsAcc(i) = accumulators(i);
    sync_epilogue_threads();

    // Each group is 8 consecutive output columns of one token: columns 8q .. 8q + 7 of a
    // 32-column run, which the packed layout's quad transpose keeps at packed positions
    // 8j + 2q + e (j = 0..3, e = 0..1) of the run's gate block, and 32 further on for up.
    auto [packed_tile, token_tile, k_coord, l_coord] = tile_coord_mnkl;
    const int tokens = static_cast<int>(get<1>(problem_shape_mnkl));
    // The tile's accumulator row t is token rows.origin + t; rows first .. end - 1 are its own.
    const TileRows rows = Rows::template Of<kTileTokens>(tokens, static_cast<int>(token_tile),
                                                         static_cast<int>(l_coord));
    const int token0 = rows.origin;
    const int own_end = rows.end < tokens - token0 ? rows.end : tokens - token0;
    const int col0 = static_cast<int>(packed_tile) * kTileN;
    constexpr int kGroupsPerToken = kTileN / 8;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int group = thread_idx; group < kTileTokens * kGroupsPerToken; group += kThreads) {
      const int token = group / kGroupsPerToken;
      const int column = (group % kGroupsPerToken) * 8;
      if (token < rows.first || token >= own_end || col0 + column >= params_.n) continue;
      if (rows.zeros) {
        *reinterpret_cast<uint4*>(params_.ptr_d + int64_t(token0 + token) * params_.n + col0 +
                                  column) = make_uint4(0, 0, 0, 0);
        continue;
      }
      const float* gate = smem + token * kRowFloats + (column / kGateUpBlock) * 2 * kGateUpBlock +
                          2 * ((column % kGateUpBlock) / 8);
      const float* up = gate + kGateUpBlock;
      // kScaled: the token's scale, and the packed column of gate pair j (its up pair is
      // kGateUpBlock further on); a group inside n has every packed column inside.
      float x_scale = 1.0f;
      int gate_column = 0;
      if constexpr (kScaled) {
        x_scale = TokenScale(params_.scales, token0 + token);
        gate_column = static_cast<int>(packed_tile) * kTilePacked + static_cast<int>(gate - smem -
                                                                                   token * kRowFloats);
      }
      uint32_t words[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        float2 g = *reinterpret_cast<const float2*>(gate + 8 * j);
        float2 u = *reinterpret_cast<const float2*>(up + 8 * j);
        if constexpr (kScaled) {
          const int c = gate_column + 8 * j;
          g.x *= x_scale * ColumnScale(params_.scales, c);
          g.y *= x_scale * ColumnScale(params_.scales, c + 1);
          u.x *= x_scale * ColumnScale(params_.scales, c + kGateUpBlock);
          u.y *= x_scale * ColumnScale(params_.scales, c + kGateUpBlock + 1);
        }
        cutlass::Array<float, 2> value;
        value[0] = Activate<kActivation, false>(g.x) * u.x;
        value[1] = Activate<kActivation, false>(g.y) * u.y;
        cutlass::NumericArrayConverter<ElementD, float, 2,
                                       cutlass::FloatRoundStyle::round_to_nearest> convert;
        cutlass::Array<ElementD, 2> rounded = convert(value);
        words[j] = reinterpret_cast<uint32_t const&>(rounded);
      }
      *reinterpret_cast<uint4*>(params_.ptr_d + int64_t(token0 + token) * params_.n + col0 +
                                column) = make_uint4(words[0], words[1], words[2], words[3]);
    }
    return make_tuple(load_state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    return cute::make_tuple(load_state, store_state);
  }

 private:
  Params const& params_;
};

}  // namespace jax_swiglu
