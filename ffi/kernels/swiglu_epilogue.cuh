// SwiGLU epilogue collective for CUTLASS 3.x SM90 warp-specialized GEMM kernels.
//
// The GEMM computes an accumulator tile over packed gate/up columns (tile_n packed
// columns). This epilogue pairs every gate accumulator with its up accumulator, which sit
// in the same thread's registers (where exactly is the `Pairs` policy below: one per
// kernel), combines them in fp32 (act(g) * u), rounds once, and writes a half-width
// [tile_m, tile_n / 2] output tile. The packed layout's quad transpose (jax_swiglu/
// _layout.py) gives each thread 8 consecutive output columns per 32-column run, so every
// store is 16 bytes, by one of two paths (kStore):
//  - TmaStore: registers -> swizzled shared memory -> one TMA store. The store is not
//    waited for: the next tile's mainloop runs while it drains, and only the next epilogue
//    (or the kernel's store_tail) waits for it before reusing the shared-memory tile.
//  - DirectStore: registers -> global memory.
// The [M, 2N] product never reaches HBM.
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
#include "edge_tiles.cuh"
#include "split_tail.cuh"

namespace jax_swiglu {

// The gate's activation, act(g) in fp32, as a product g * sigmoid(t) for both activations:
//  - SiLU: t = g.
//  - GELU, tanh form (Gemma's GeGLU): 0.5 * (1 + tanh(z)) = sigmoid(2z), so
//    gelu_tanh(g) = g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)). Written through the
//    sigmoid it costs two more FMA-pipe instructions than SiLU and keeps its accuracy where
//    tanh(z) nears -1: 1 + tanh(z) from a tanh of bounded relative error would cancel there.
// The sigmoid, 1 / (1 + exp(-t)) in fp32, two ways that cost the SM different things. The
// cooperative kernel's epilogue runs while the tensor cores wait, and for a 128x128 output
// tile it is bound by two limits: the SM issues one instruction per clock per scheduler
// (each of the 8 math warps issues ~800 instructions per tile, 2 warps per scheduler)
// and 16 MUFU ops per clock (CUDA guide's throughput table). Both ways use MUFU.EX2 for
// exp(-t); the reciprocal is either:
//  - MUFU.RCP: 6 instructions per element, 2 of them MUFU, or
//  - Newton-Raphson on the FMA pipe: 11 instructions, 1 MUFU. A guess from the float's
//    bits (relative error at most 0.051 while 1 + exp(-t) < 2^125, i.e. t > -86.6) and
//    two Newton steps, each squaring the error: at most 6.6e-6 there (an fp32 emulation),
//    far below a bf16 half-ulp, so the output still rounds once from a near-exact value.
// MUFU.RCP alone makes a tile's SiLU 2048 MUFU clocks, Newton alone ~2000 issue clocks;
// alternating them (`Combine` takes the even/odd column of each pair) ~1650. That is for
// the cooperative schedule. In the pingpong schedule one warpgroup runs its epilogue at a
// time (one math warp per scheduler) while the other's wgmmas run: there the chain of
// dependent instructions is what counts, and MUFU.RCP on every column measured faster than
// alternating on every shape tried (docs/design.md).
// Range, both ways and both activations: act(+inf) = inf, act(-inf) = -inf * 0 = NaN,
// act(NaN) = NaN, as in the reference. Below t = -86.6 the sigmoid is under 2^-125, and
// each way returns a tiny value or 0 where the reference has a tiny value or 0 (outputs at
// most ~1e-36 apart): MUFU.RCP flushes denormal results to 0; Newton caps exp(-t) just
// below 2^128 (so 1 + exp(-t) stays finite), its guess degrades past 2^125 and is clamped
// to +0 from ~2^127 on, which the steps keep.
template <bool kNewtonReciprocal>
CUTLASS_DEVICE float Sigmoid(float t) {
  constexpr float kMinusLog2E = -1.44269504088896341f;
  float exp_minus_t, sigmoid;
  if constexpr (kNewtonReciprocal) {
    constexpr float kMaxExponent = 127.99f;       // 2^127.99 < FLT_MAX
    constexpr int kReciprocalGuess = 0x7EF311C3;  // 2^127 / d, roughly, in integer bits
    asm("ex2.approx.ftz.f32 %0, %1;"
        : "=f"(exp_minus_t)
        : "f"(fminf(t * kMinusLog2E, kMaxExponent)));  // fminf(NaN, c) = c
    const float denominator = 1.0f + exp_minus_t;
    sigmoid = __int_as_float(max(kReciprocalGuess - __float_as_int(denominator), 0));
    sigmoid = fmaf(sigmoid, fmaf(-denominator, sigmoid, 1.0f), sigmoid);
    sigmoid = fmaf(sigmoid, fmaf(-denominator, sigmoid, 1.0f), sigmoid);
  } else {
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(exp_minus_t) : "f"(t * kMinusLog2E));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(sigmoid) : "f"(1.0f + exp_minus_t));
  }
  return sigmoid;
}

template <Activation kActivation, bool kNewtonReciprocal>
CUTLASS_DEVICE float Activate(float gate) {
  if constexpr (kActivation == Activation::Silu) {
    return gate * Sigmoid<kNewtonReciprocal>(gate);
  } else {
    static_assert(kActivation == Activation::GeluTanh, "an activation without its math");
    constexpr float kLinear = 1.5957691216057308f;              // 2 sqrt(2 / pi)
    constexpr float kCubic = 1.5957691216057308f * 0.044715f;   // 2 sqrt(2 / pi) 0.044715
    return gate * Sigmoid<kNewtonReciprocal>(gate * fmaf(kCubic, gate * gate, kLinear));
  }
}

// Where a thread's gate and up accumulators pair up, for each kernel. Accumulator
// fragments of a wgmma are ((2 adjacent columns, 2 rows 8 apart, kBlocks blocks of 8
// columns), MMA_M, MMA_N), MMA_N counting atoms of 8 * kBlocks columns along N; a policy
// says which (block, mma_n) hold gate values, where their up partners are, which output
// column a gate's tile-local packed column is, and how the pair combines.

// Interleaved kernel: the tile spans [gate block | up block | ...] of kGateUpBlock columns
// each, so the up partner of 8-column block q of the tile (q = mma_n * kBlocks + block) is
// block q + kGateUpBlock / 8, and the activation is still due. In every compiled config the
// atom holds whole pairs (config 8's 320-wide tile runs 64-wide atoms), so the partner is in
// the same atom; an atom width that is not a multiple of 64 (say 160) would put it in the next.
// kAlternateReciprocal: the sigmoid's reciprocal alternates Newton (even columns) and
// MUFU.RCP (odd), for the cooperative schedule, or is MUFU.RCP on both, for pingpong (see
// Sigmoid). kActivation: the gate's activation (Activate).
template <bool kAlternateReciprocal, Activation kActivation>
struct InterleavedPairs {
  static constexpr int kBlocksPerHalf = kGateUpBlock / 8;
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int block, int mma_n) {
    return ((mma_n * kBlocks + block) / kBlocksPerHalf) % 2 == 0;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block, int mma_n) {
    return (mma_n * kBlocks + block + kBlocksPerHalf) % kBlocks;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int block, int mma_n) {
    return (mma_n * kBlocks + block + kBlocksPerHalf) / kBlocks;
  }
  CUTLASS_HOST_DEVICE static constexpr int OutputColumn(int packed_n) {
    return (packed_n / (2 * kGateUpBlock)) * kGateUpBlock + packed_n % kGateUpBlock;
  }
  // `column`: 0 or 1, which of a thread's two adjacent columns (see Sigmoid for why).
  template <int column>
  CUTLASS_DEVICE static float Combine(float gate, float up) {
    return Activate<kActivation, kAlternateReciprocal && column == 0>(gate) * up;
  }
};

// (The pairing depends on neither the activation nor the reciprocal: checked on two.)
namespace pairing_check {
using Straddling = InterleavedPairs<true, Activation::Silu>;
using WithinAtom = InterleavedPairs<false, Activation::GeluTanh>;
}  // namespace pairing_check
// The pairing, checked where a pair straddles two atoms: with 160-wide atoms (20 blocks),
// packed columns 128-159 (atom 0, blocks 16-19) are gate and their up partners are columns
// 160-191 (atom 1, blocks 0-3); columns 160-191 themselves are up.
static_assert(pairing_check::Straddling::IsGate<20>(16, 0) &&
                  pairing_check::Straddling::UpBlock<20>(16, 0) == 0 &&
                  pairing_check::Straddling::UpMmaN<20>(16, 0) == 1 &&
                  pairing_check::Straddling::UpBlock<20>(19, 0) == 3 &&
                  !pairing_check::Straddling::IsGate<20>(0, 1) &&
                  pairing_check::Straddling::IsGate<20>(4, 1) &&
                  pairing_check::Straddling::UpBlock<20>(4, 1) == 8 &&
                  pairing_check::Straddling::UpMmaN<20>(4, 1) == 1,
              "gate/up pairing across MMA atoms");
// ... and within one 64-wide atom (8 blocks): blocks 0-3 gate, partners 4-7.
static_assert(pairing_check::WithinAtom::IsGate<8>(3, 2) &&
                  !pairing_check::WithinAtom::IsGate<8>(4, 2) &&
                  pairing_check::WithinAtom::UpBlock<8>(3, 2) == 7 &&
                  pairing_check::WithinAtom::UpMmaN<8>(3, 2) == 2,
              "gate/up pairing within an MMA atom");

template <class Pairs>
inline constexpr bool kIsInterleavedPairs = false;
template <bool kAlternateReciprocal, Activation kActivation>
inline constexpr bool kIsInterleavedPairs<InterleavedPairs<kAlternateReciprocal, kActivation>> =
    true;

// Gate-then-up (pingpong) kernel: the gate pass accumulates into MMA_N index 0 and the up
// pass into index 1, and the mainloop has already replaced the gate values by act(g).
struct SequentialPairs {
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int /*block*/, int mma_n) {
    return mma_n == 0;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block, int /*mma_n*/) {
    return block;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int /*block*/, int /*mma_n*/) {
    return 1;
  }
  CUTLASS_HOST_DEVICE static constexpr int OutputColumn(int packed_n) { return packed_n; }
  template <int column>
  CUTLASS_DEVICE static float Combine(float activated_gate, float up) {
    return activated_gate * up;
  }
};

// kStore: TmaStore stages the output tile in shared memory for one TMA store per tile;
// DirectStore writes each thread's 16-byte runs straight to global memory and takes no
// shared memory (every interleaved config but stream-K: ffi/kernel_configs.h says where each
// path measured faster).
// kHalfUnits: the scheduler may hand it a half tile (split_tail.cuh), marked in the tile's
// batch index; only the split-tail configs' epilogues check for one.
// kScaled: the fp8 kernel's form, whose accumulators are sums of quantized products: each is
// first multiplied by its token's and its packed column's scale (TokenAndColumnScales).
template <class ElementD_, class CtaTileShape_, class Pairs,
          OutputStore kStore = OutputStore::TmaStore, bool kHalfUnits = false,
          bool kScaled = false>
class SwiGluEpilogue {
 public:
  static constexpr bool kDirect = kStore == OutputStore::DirectStore;
  // The direct store takes an edge tile's rows from where EdgeTileMainloop loaded them
  // (edge_tiles.cuh); the TMA store writes whole tiles at their own place, after a mainloop
  // that loads them there. The kernel assembly picks the mainloop by this.
  static constexpr bool kShiftedRows = kDirect;
  using ElementD = ElementD_;
  using ElementC = void;  // no source tensor
  using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideD = cute::Stride<int64_t, cute::_1, int64_t>;

  static constexpr int kTileM = cute::size<0>(CtaTileShape_{});
  static constexpr int kTilePacked = cute::size<1>(CtaTileShape_{});
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile
  static_assert(kTilePacked % (2 * kGateUpBlock) == 0,
                "a tile must hold whole gate/up block pairs");
  // A 32-column run of the layout is 4 of a wgmma fragment's 8-column blocks; in each, lane
  // q of a quad holds columns 2q and 2q + 1, so its 4 pairs of a run are the run's output
  // columns 8q .. 8q + 7 (the quad transpose): one 16-byte store.
  static constexpr int kRunBlocks = kGateUpBlock / 8;
  static_assert(kGateUpBlock == 32 && sizeof(ElementD) == 2, "4 pairs of 2 bytes per run");

  // Output tile in shared memory, N-contiguous and swizzled, so the 16-byte stores of a warp
  // (8 rows x 64 bytes) hit every bank evenly and TMA reads it directly. The swizzle atom is
  // 8 rows x kAtomN columns: the 128-byte swizzle (64 columns) where the tile width allows,
  // else the 64-byte one (32 columns: a 96-column tile from 192 packed columns).
  static constexpr int kAtomN = kTileN % 64 == 0 ? 64 : 32;
  static_assert(kTileN % kAtomN == 0, "the output tile must be whole 32-column swizzle atoms");
  using SmemLayoutAtomD =
      cute::conditional_t<kAtomN == 64, cute::GMMA::Layout_K_SW128_Atom<ElementD>,
                          cute::GMMA::Layout_K_SW64_Atom<ElementD>>;
  using SmemLayoutD = decltype(cute::tile_to_shape(
      SmemLayoutAtomD{}, cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>>{}));

  // SmemLayoutD by hand, for the stores: (m, n)'s element offset before the swizzle, in
  // 8-row x kAtomN-column atoms placed M first. The swizzle (on byte addresses, from a
  // 1024-byte aligned tile) XORs the 16-byte chunk of a row (offset bits 3 on) with the
  // bits of the 128-byte line index (offset bits 6 on), 3 bits of each for the 128-byte
  // swizzle and 2 for the 64-byte one: Swizzled below.
  static constexpr int kSwizzleBits = kAtomN == 64 ? 3 : 2;
  CUTLASS_HOST_DEVICE static constexpr int LinearOffset(int m, int n) {
    return (m / 8) * 8 * kAtomN + (n / kAtomN) * kAtomN * kTileM + (m % 8) * kAtomN + n % kAtomN;
  }
  static constexpr int Swizzled(int offset) {
    return offset ^ (((offset >> 6) & ((1 << kSwizzleBits) - 1)) << 3);
  }
  static_assert(sizeof(ElementD) == 2 &&
                    cute::is_same_v<cute::remove_cvref_t<decltype(SmemLayoutD{}.layout_a())>,
                                    cute::Swizzle<kSwizzleBits, 4, 3>> &&
                    cute::is_same_v<cute::remove_cvref_t<decltype(SmemLayoutD{}.offset())>,
                                    cute::smem_ptr_flag_bits<16>>,
                "LinearOffset assumes a 128- or 64-byte swizzle on byte addresses of 16-bit "
                "elements");
  static_assert(SmemLayoutD{}.layout_b()(1, 0) == LinearOffset(1, 0) &&
                    SmemLayoutD{}.layout_b()(0, 9) == LinearOffset(0, 9) &&
                    SmemLayoutD{}.layout_b()(8, 0) == LinearOffset(8, 0) &&  // atoms M first
                    SmemLayoutD{}.layout_b()(9, 5) == LinearOffset(9, 5) &&
                    SmemLayoutD{}.layout_b()(kTileM - 1, kTileN - 1) ==
                        LinearOffset(kTileM - 1, kTileN - 1) &&
                    (kTileN <= kAtomN ||
                     SmemLayoutD{}.layout_b()(3, kAtomN) == LinearOffset(3, kAtomN)),
                "LinearOffset must match SmemLayoutD");

  // The stores' address split (store()): lane q of a quad, in row m0 (m0 < 16: a thread's
  // first row), stores its 16 bytes of the run at tile-local output column dn (a multiple
  // of 32) in row m0 + dm (dm a multiple of 8) at columns dn + 8q. The 16-byte chunk is
  // what the swizzle XORs, with bits of m % 8 = m0 % 8, so the swizzled offset is a
  // per-thread base plus one XOR with a per-thread constant, ChunkXor(m0, q).
  CUTLASS_HOST_DEVICE static constexpr int ChunkXor(int m0, int q) {
    return (8 * q) ^ ((((m0 % 8) * kAtomN >> 6) & ((1 << kSwizzleBits) - 1)) << 3);
  }
  static constexpr bool AddressSplitHolds() {
    for (int m0 = 0; m0 < 16; ++m0)
      for (int q = 0; q < 4; ++q)
        for (int dm = 0; m0 + dm < kTileM; dm += 8)
          for (int dn = 0; dn < kTileN; dn += kGateUpBlock)
            if (Swizzled(LinearOffset(m0 + dm, dn + 8 * q)) !=
                LinearOffset(m0, 0) + (LinearOffset(dm, dn) ^ ChunkXor(m0, q)))
              return false;
    return true;
  }
  static_assert(AddressSplitHolds(), "the per-thread address split must match the swizzle");
  // ... and a gate run starts an output run: its output column is a multiple of 32.
  static constexpr bool GateRunsStartOutputRuns() {
    for (int p = 0; p < kTilePacked; p += kGateUpBlock)
      if (Pairs::OutputColumn(p) % kGateUpBlock != 0) return false;
    return true;
  }
  static_assert(GateRunsStartOutputRuns(), "OutputColumn maps runs to runs");

  // The kernel instantiates load/store pipelines from these; nothing is loaded and the
  // store side is tracked with bulk-async groups, so they are the empty ones.
  using LoadPipeline = cutlass::PipelineTransactionAsync<0>;
  using LoadPipelineState = cutlass::PipelineState<0>;
  using StorePipeline = cutlass::PipelineTmaStore<0>;
  using StorePipelineState = cutlass::PipelineState<0>;
  static constexpr bool RequiresTransactionBytes = false;

  struct TmaTensorStorage {
    alignas(1024) cute::ArrayEngine<ElementD, cute::cosize_v<SmemLayoutD>> smem_d;
  };
  struct DirectTensorStorage {};
  using TensorStorage = cute::conditional_t<kDirect, DirectTensorStorage, TmaTensorStorage>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  // Shared memory the mainloop's stage count must leave free.
  static constexpr int kSharedBytes =
      kDirect ? 0 : static_cast<int>(sizeof(TensorStorage) + sizeof(PipelineStorage));

  struct Arguments {
    ElementD* ptr_d;  // [M, n] row-major
    int n;            // output columns
    // kScaled only: x_scale[M], and w_scale[packed column * w_scale_stride] (launch.h).
    float const* x_scale = nullptr;
    float const* w_scale = nullptr;
    int w_scale_stride = 0;
  };

  using TmaStoreD = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{},
      cute::make_tensor(cute::make_gmem_ptr<ElementD>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0)),
                                          cute::make_stride(int64_t(0), cute::_1{}))),
      SmemLayoutD{}));

  struct Params {
    TmaStoreD tma_store_d;  // TmaStore only
    ElementD* ptr_d;        // DirectStore only
    int n;
    float const* x_scale;
    float const* w_scale;
    int w_scale_stride;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape,
                                        Arguments const& args, void* /*workspace*/) {
    using namespace cute;
    if constexpr (kDirect) {
      return {TmaStoreD{}, args.ptr_d, args.n, args.x_scale, args.w_scale, args.w_scale_stride};
    } else {
      int m = get<0>(problem_shape);
      Tensor tensor_d = make_tensor(make_gmem_ptr(args.ptr_d),
                                    make_layout(make_shape(int32_t(m), int32_t(args.n)),
                                                make_stride(int64_t(args.n), _1{})));
      return {make_tma_copy(SM90_TMA_STORE{}, tensor_d, SmemLayoutD{}), args.ptr_d, args.n,
              args.x_scale, args.w_scale, args.w_scale_stride};
    }
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
    if constexpr (!kDirect) cute::prefetch_tma_descriptor(params.tma_store_d.get_tma_descriptor());
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
    static_assert(kBlocks % kRunBlocks == 0, "an MMA atom holds whole 32-column runs");
    if constexpr (kIsInterleavedPairs<Pairs>) {
      static_assert((kBlocks * size<2>(AccLayout{})) % (2 * Pairs::kBlocksPerHalf) == 0,
                    "the MMA atoms must hold whole gate/up block pairs");
    } else {
      static_assert(size<2>(AccLayout{}) == 2, "gate and up accumulators: MMA_N is 2");
    }

    if constexpr (kScaled) {
      TokenAndColumnScales(problem_shape_mnkl, tile_shape_mnk, tile_coord_mnkl, accumulators,
                           tiled_mma, thread_idx);
    }
    if constexpr (kDirect) {
      StoreDirect<kBlocks>(problem_shape_mnkl, tile_shape_mnk, tile_coord_mnkl, accumulators,
                           tiled_mma, thread_idx);
    } else {
      StoreViaSharedMemory<kBlocks>(problem_shape_mnkl, tile_shape_mnk, tile_coord_mnkl,
                                    accumulators, tiled_mma, thread_idx, shared_tensors);
    }
    return make_tuple(load_state, store_state);
  }

 private:
  // kScaled: accumulator (m, p) of the tile times x_scale[row] * w_scale[column], at the
  // global row its loads came from (an edge tile's rows start at EdgeTileOrigin with the
  // direct store) and its packed column; rows past M and columns past the packed width (a
  // tile's padding, never stored) get 0. The scales come through the read-only cache: a
  // thread's columns repeat over its rows and a row's over its columns.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma>
  CUTLASS_DEVICE void TokenAndColumnScales(ProblemShapeMNKL problem_shape_mnkl,
                                           TileShapeMNK tile_shape_mnk,
                                           TileCoordMNKL tile_coord_mnkl,
                                           cute::Tensor<AccEngine, AccLayout>& accumulators,
                                           TiledMma tiled_mma, int thread_idx) const {
    using namespace cute;
    static_assert(!kHalfUnits, "scales on half tiles are not implemented");
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
      const float x_scale = row < m_total ? __ldg(params_.x_scale + row) : 0.0f;
      const float w_scale =
          column < packed_total ? __ldg(params_.w_scale + column * params_.w_scale_stride) : 0.0f;
      accumulators(i) = accumulators(i) * x_scale * w_scale;
    }
  }

  // One output pair, for both store paths: the gate accumulators (0 | 1, row, block) of
  // atom (mma_m, mma_n) and their up partners (where `Pairs` puts them), combined in fp32
  // and rounded once into one 4-byte word, output columns n and n + 1 (n even).
  template <int kBlocks, class AccEngine, class AccLayout>
  CUTLASS_DEVICE static uint32_t RoundedPair(cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                             int row, int block, int mma_m, int mma_n) {
    using cute::make_coord;
    const int up_block = Pairs::template UpBlock<kBlocks>(block, mma_n);
    const int up_mma_n = Pairs::template UpMmaN<kBlocks>(block, mma_n);
    auto gate0 = make_coord(make_coord(0, row, block), mma_m, mma_n);
    auto gate1 = make_coord(make_coord(1, row, block), mma_m, mma_n);
    auto up0 = make_coord(make_coord(0, row, up_block), mma_m, up_mma_n);
    auto up1 = make_coord(make_coord(1, row, up_block), mma_m, up_mma_n);
    cutlass::Array<float, 2> value;
    value[0] = Pairs::template Combine<0>(accumulators(gate0), accumulators(up0));
    value[1] = Pairs::template Combine<1>(accumulators(gate1), accumulators(up1));
    cutlass::NumericArrayConverter<ElementD, float, 2, cutlass::FloatRoundStyle::round_to_nearest>
        convert;
    cutlass::Array<ElementD, 2> rounded = convert(value);
    return reinterpret_cast<uint32_t const&>(rounded);
  }

  // The 4 pairs of the 32-column run starting at gate block `block`: 8 output columns.
  template <int kBlocks, class AccEngine, class AccLayout>
  CUTLASS_DEVICE static uint4 RunWords(cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                       int row, int block, int mma_m, int mma_n) {
    return {RoundedPair<kBlocks>(accumulators, row, block + 0, mma_m, mma_n),
            RoundedPair<kBlocks>(accumulators, row, block + 1, mma_m, mma_n),
            RoundedPair<kBlocks>(accumulators, row, block + 2, mma_m, mma_n),
            RoundedPair<kBlocks>(accumulators, row, block + 3, mma_m, mma_n)};
  }

  template <int kBlocks, class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL,
            class AccEngine, class AccLayout, class TiledMma>
  CUTLASS_DEVICE void StoreViaSharedMemory(ProblemShapeMNKL problem_shape_mnkl,
                                           TileShapeMNK tile_shape_mnk,
                                           TileCoordMNKL tile_coord_mnkl,
                                           cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                           TiledMma tiled_mma, int thread_idx,
                                           TensorStorage& shared_tensors) {
    using namespace cute;

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

    // (m, packed n) tile coordinate of every accumulator this thread holds. The thread
    // index goes through an opaque move first: otherwise the compiler hoists these
    // loop-invariant values out of the persistent tile loop, and they sit in registers
    // through every mainloop, next to the accumulators (spilling in the pingpong kernel).
    int opaque_thread_idx;
    asm volatile("mov.b32 %0, %1;" : "=r"(opaque_thread_idx) : "r"(thread_idx));
    Tensor tAcc_coord = tiled_mma.get_slice(opaque_thread_idx)
                            .partition_C(make_identity_tensor(take<0, 2>(tile_shape_mnk)));
    static_assert(decltype(size(tAcc_coord))::value == decltype(size(accumulators))::value);

    // Shared-memory addresses without the generic layout arithmetic, which costs integer
    // instructions per store (the epilogue is issue-bound: the tensor cores wait). A
    // thread's runs sit at (m0 + dm, 8q + dn) for its first accumulator at (m0, p0 = 2q),
    // dm and dn compile-time: AddressSplitHolds.
    const int m0 = get<0>(tAcc_coord(0));
    const int p0 = get<1>(tAcc_coord(0));
    const int chunk_xor = ChunkXor(m0, p0 / 2);
    const uint32_t thread_base = cute::cast_smem_ptr_to_uint(shared_tensors.smem_d.begin()) +
                                 sizeof(ElementD) * LinearOffset(m0, 0);

    CUTLASS_PRAGMA_UNROLL
    for (int mma_n = 0; mma_n < size<2>(accumulators); ++mma_n) {
      CUTLASS_PRAGMA_UNROLL
      for (int mma_m = 0; mma_m < size<1>(accumulators); ++mma_m) {
        CUTLASS_PRAGMA_UNROLL
        for (int row = 0; row < 2; ++row) {
          CUTLASS_PRAGMA_UNROLL
          for (int block = 0; block < kBlocks; block += kRunBlocks) {
            if (!Pairs::template IsGate<kBlocks>(block, mma_n)) continue;
            const uint4 words = RunWords<kBlocks>(accumulators, row, block, mma_m, mma_n);
            auto coord = tAcc_coord(make_coord(make_coord(0, row, block), mma_m, mma_n));
            const int dm = get<0>(coord) - m0;                        // compile-time
            const int dn = Pairs::OutputColumn(get<1>(coord) - p0);   // compile-time
            const uint32_t address =
                thread_base + sizeof(ElementD) * (LinearOffset(dm, dn) ^ chunk_xor);
            // No "memory" clobber needed: the fence and barrier after the loop are volatile
            // asm too, so the stores stay before them.
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
                         :
                         : "r"(address), "r"(words.x), "r"(words.y), "r"(words.z), "r"(words.w));
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
      Tensor sD = make_tensor(make_smem_ptr(shared_tensors.smem_d.begin()), SmemLayoutD{});
      auto cta_tma = params_.tma_store_d.get_slice(Int<0>{});
      copy(params_.tma_store_d, cta_tma.partition_S(sD), cta_tma.partition_D(gD));
      tma_store_arrive();
    }
  }

 public:

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    // Shared memory must outlive every TMA store that reads it (and, in the pingpong
    // kernel, the other warpgroup reuses the tile next).
    if constexpr (!kDirect) cute::tma_store_wait<0>();
    return cute::make_tuple(load_state, store_state);
  }

 private:
  // DirectStore: each run of 4 gate/up pairs becomes one 16-byte store of output columns
  // 8q .. 8q + 7 of the run (lane q of a quad) at its global address; rows past M, rows of
  // the tile above (in an edge tile moved inside, see kShiftedRows), the other half's rows
  // (in a half-tile unit, split_tail.cuh) and columns past n are skipped (n is a multiple of
  // 8, so a run's 8 columns are all inside or all outside). A warp's store covers 8 rows x 64
  // bytes: whole 32-byte sectors.
  // Nothing waits: the next tile's mainloop starts as soon as the stores are issued.
  template <int kBlocks, class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL,
            class AccEngine, class AccLayout, class TiledMma>
  CUTLASS_DEVICE void StoreDirect(ProblemShapeMNKL problem_shape_mnkl, TileShapeMNK tile_shape_mnk,
                                  TileCoordMNKL tile_coord_mnkl,
                                  cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                  TiledMma tiled_mma, int thread_idx) {
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
    // own start belong to the tile above and are not stored again.
    const int m_total = static_cast<int>(get<0>(problem_shape_mnkl));
    const int tile_row = static_cast<int>(m_coord) * kTileM;
    const int row0 = EdgeTileOrigin(static_cast<int>(m_coord), kTileM, m_total) + m0;
    const int col0 = static_cast<int>(n_coord) * kTileN + 4 * p0;  // 8q
    const int rows_above = tile_row - row0;
    // A unit of a split last round (split_tail.cuh) computed one row of m64 atoms only.
    const int half = kHalfUnits ? SplitTailHalfOfBatchIndex(static_cast<int>(l_coord)) : -1;
    const int rows_left = m_total - row0;
    const int cols_left = params_.n - col0;
    const int64_t row_stride = params_.n;
    ElementD* const thread_base = params_.ptr_d + row0 * row_stride + col0;

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
                RunWords<kBlocks>(accumulators, row, block, mma_m, mma_n);
          }
        }
      }
    }
  }

 public:

 private:
  Params const& params_;
};

}  // namespace jax_swiglu
