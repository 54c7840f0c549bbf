// A per-tile timeline of the interleaved kernel, for finding where a pingpong tile's time
// goes (benchmarks/research/gemm_probe/trace.cu runs it). The kernel is the interleaved config as
// built in ffi/kernels/interleaved_kernel.cuh, with its mainloop and epilogue wrapped:
// each wrapper calls the wrapped member unchanged and records the SM's clock around it,
// from one thread per role (each math warpgroup's first thread, the producer's lane 0),
// into a global buffer. Nothing else differs, so the schedule is CUTLASS's own, except in
// the variants that run this probe's k-loop instead (see TracedMainloop).
//
// Per tile and role, slots of `kTraceSlots` 64-bit values:
//   math warpgroup: 0 mma entry (after the order barrier), 1 mma exit (last k-tile issued),
//     2 mma_tail exit (all wgmmas done), 3 store entry (after the epilogue's turn came),
//     4 store exit, 5 store_tail exit, 6 (probe's k-loop) k-tile 0's data landed, 7 the SM
//     id, 8-9 (probe's k-loop, sampled tiles) data and wgmma wait totals, 10-11 (probe's
//     k-loop) k-tile 0's wgmmas issued, done (0: the tile had <= kInFlight k-tiles), 12
//     (probe's k-loop) k-tile 0's data wait began;
//   producer: 0 load entry, 1 load exit (the tile's last TMA issued), 7 the SM id.
// Variants (TraceVariant): the config as built; its epilogue with the other output path
// (TMA store <-> direct store, the mainloop's stages re-derived as for a config); Skip:
// the epilogue only sums its accumulators (which keeps every wgmma live) and stores
// nothing (how fast the mainloops run when the other warpgroup's epilogue costs next to
// nothing); Stepped1/2: this probe's k-loop.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <string>

#include "kernels/interleaved_kernel.cuh"

namespace gemm_probe {

constexpr int kTraceRoles = 3;  // math warpgroup 0, math warpgroup 1, producer
constexpr int kTraceMaxTiles = 128;
constexpr int kTraceSlots = 13;
constexpr int kTraceProducer = 2;

// [CTA][role][tile][slot]; null: record nothing. One per translation unit (no separate
// device linking): LaunchTraced sets its own before each launch.
static __device__ unsigned long long* g_trace = nullptr;

// `trace`: g_trace, read once when a wrapper is constructed (reading it at every record
// made each record wait for a global load, which the first version's timings included).
CUTLASS_DEVICE void TraceRecord(unsigned long long* trace, int role, int tile, int slot,
                                unsigned long long value) {
  if (trace == nullptr || tile >= kTraceMaxTiles) return;
  const size_t cta = blockIdx.x + size_t(gridDim.x) * (blockIdx.y + size_t(gridDim.y) * blockIdx.z);
  trace[((cta * kTraceRoles + role) * kTraceMaxTiles + tile) * kTraceSlots + slot] = value;
}

CUTLASS_DEVICE unsigned SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

CUTLASS_DEVICE unsigned long long Clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

// Warp group 0 is the producer in CUTLASS's SM90 warp-specialized kernels, 1 and 2 the
// math warpgroups.
CUTLASS_DEVICE int MathRole() { return static_cast<int>(threadIdx.x / 128) - 1; }

// kInFlight = 0: CUTLASS's own k-loop (Base::mma). kInFlight >= 1: this probe's k-loop,
// the same wgmmas in the same order, which waits until at most kInFlight k-tiles of
// wgmmas are in flight before releasing a stage (CUTLASS's keeps 1). Only in each
// warpgroup's tile kStepTile (clock reads in every k-tile slow the loop down) it records
// per k-tile (g_steps) when its data wait ended and when the wgmma wait after its issue
// ended, and in slots 8 and 9 the tile's total cycles waiting for TMA data and for wgmmas.
constexpr int kStepTile = 3;
constexpr int kStepMaxKTiles = 64;
// [CTA][math warpgroup][k-tile][2]; null: record nothing.
static __device__ unsigned long long* g_steps = nullptr;

CUTLASS_DEVICE void StepRecord(unsigned long long* steps, int k_tile, int slot,
                               unsigned long long value) {
  if (steps == nullptr || k_tile >= kStepMaxKTiles) return;
  const size_t cta = blockIdx.x + size_t(gridDim.x) * (blockIdx.y + size_t(gridDim.y) * blockIdx.z);
  steps[((cta * 2 + MathRole()) * kStepMaxKTiles + k_tile) * 2 + slot] = value;
}

template <class Base, int kInFlight, int kExitInFlight = kInFlight, bool kSpin = false>
struct TracedMainloop : Base {
  static_assert(kExitInFlight >= kInFlight);
  int traced_loads = 0;
  int traced_mmas = 0;
  unsigned long long* trace_ = g_trace;
  unsigned long long* steps_ = g_steps;

  template <class... Ts>
  CUTLASS_DEVICE void load(Ts&&... args) {
    const bool record = threadIdx.x == 0;
    if (record) TraceRecord(trace_, kTraceProducer, traced_loads, 0, Clock());
    Base::load(static_cast<Ts&&>(args)...);
    if (record) {
      TraceRecord(trace_, kTraceProducer, traced_loads, 1, Clock());
      TraceRecord(trace_, kTraceProducer, traced_loads, 7, SmId());
    }
    ++traced_loads;
  }

  template <class Pipeline, class State, class Accumulators, class Storage, class Params>
  CUTLASS_DEVICE void mma(Pipeline pipeline, State state, Accumulators& accumulators,
                          int k_tile_count, int thread_idx, Storage& shared_tensors,
                          Params const& params) {
    const bool record = threadIdx.x % 128 == 0;
    // (Probing here which stages had landed, with one mbarrier test per stage, cost about
    // a thousand cycles per tile in a first version: only the clock is read.)
    if (record) TraceRecord(trace_, MathRole(), traced_mmas, 0, Clock());
    if constexpr (kInFlight == 0) {
      Base::mma(pipeline, state, accumulators, k_tile_count, thread_idx, shared_tensors, params);
    } else {
      SteppedMma(pipeline, state, accumulators, k_tile_count, shared_tensors, record);
    }
    if (record) {
      TraceRecord(trace_, MathRole(), traced_mmas, 1, Clock());
      TraceRecord(trace_, MathRole(), traced_mmas, 7, SmId());
    }
  }

  template <class Pipeline, class State>
  CUTLASS_DEVICE void mma_tail(Pipeline pipeline, State state, int k_tile_count) {
    if constexpr (kInFlight == 0) {
      Base::mma_tail(pipeline, state, k_tile_count);
    } else {
      // The stages of the last min(kExitInFlight, k_tile_count) k-tiles are still held.
      const int held = cute::min(kExitInFlight, k_tile_count);
      state.advance(k_tile_count - held);
      cute::warpgroup_wait<0>();
      for (int i = 0; i < held; ++i, ++state) pipeline.consumer_release(state);
    }
    if (threadIdx.x % 128 == 0) TraceRecord(trace_, MathRole(), traced_mmas, 2, Clock());
    ++traced_mmas;
  }

 private:
  template <class Pipeline, class State, class Accumulators, class Storage>
  CUTLASS_DEVICE void SteppedMma(Pipeline pipeline, State read, Accumulators& accumulators,
                                 int k_tile_count, Storage& shared_tensors, bool record) {
    using namespace cute;
    using TiledMma = typename Base::TiledMma;
    static_assert(size(TiledMma{}) == 128, "one math warpgroup per tile (pingpong)");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    TiledMma tiled_mma;
    auto slice = tiled_mma.get_slice(0);  // a wgmma's operands are the warpgroup's, whole
    Tensor fragments_a = slice.make_fragment_A(slice.partition_A(sA));  // (MMA, M, K, stage)
    Tensor fragments_b = slice.make_fragment_B(slice.partition_B(sB));  // (MMA, N, K, stage)
    const bool sample = record && traced_mmas == kStepTile;
    unsigned long long data_wait = 0, mma_wait = 0;
    // Every tile's first k-tile, kept in registers until the loop ends: data landed,
    // wgmmas issued, wgmmas done (known at the wait kInFlight k-tiles later).
    unsigned long long first_wait = 0, first_data = 0, first_issued = 0, first_done = 0;
    State release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accumulators);
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      const unsigned long long before_data = sample ? Clock() : 0;
      if (record && k_tile == 0) first_wait = Clock();
      if constexpr (kSpin) {
        // Poll without ever sleeping (CUTLASS's wait sleeps on the barrier: NANOSLEEP.SYNCS).
        while (pipeline.consumer_test_wait(read).get() != cutlass::BarrierStatus::WaitDone) {
        }
      } else {
        pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      }
      if (sample) {
        const unsigned long long now = Clock();
        data_wait += now - before_data;
        StepRecord(steps_, k_tile, 0, now);
      }
      if (record && k_tile == 0) first_data = Clock();
      const int stage = read.index();
      warpgroup_fence_operand(accumulators);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(fragments_a); ++k_block) {
        cute::gemm(tiled_mma, fragments_a(_, _, k_block, stage), fragments_b(_, _, k_block, stage),
                   accumulators);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      if (record && k_tile == 0) first_issued = Clock();
      ++read;
      // The last (kExitInFlight - kInFlight) k-tiles do not wait: the loop ends with up to
      // kExitInFlight k-tiles of wgmmas in flight, and the other warpgroup's turn starts
      // that much earlier (mma_tail waits for them and releases their stages).
      if (k_tile >= k_tile_count - (kExitInFlight - kInFlight)) continue;
      const unsigned long long before_mma = sample ? Clock() : 0;
      warpgroup_wait<kInFlight>();
      warpgroup_fence_operand(accumulators);
      if (sample) {
        const unsigned long long now = Clock();
        mma_wait += now - before_mma;
        StepRecord(steps_, k_tile, 1, now);
      }
      if (record && k_tile == kInFlight) first_done = Clock();
      if (k_tile >= kInFlight) {
        pipeline.consumer_release(release);  // k-tile (k_tile - kInFlight) is done
        ++release;
      }
    }
    warpgroup_fence_operand(accumulators);
    if (sample) {
      TraceRecord(trace_, MathRole(), traced_mmas, 8, data_wait);
      TraceRecord(trace_, MathRole(), traced_mmas, 9, mma_wait);
    }
    if (record) {
      TraceRecord(trace_, MathRole(), traced_mmas, 6, first_data);
      TraceRecord(trace_, MathRole(), traced_mmas, 12, first_wait);
      TraceRecord(trace_, MathRole(), traced_mmas, 10, first_issued);
      TraceRecord(trace_, MathRole(), traced_mmas, 11, first_done);
    }
  }
};

// AsBuilt, OtherStore, Skip: CUTLASS's k-loop with the epilogue as built, with the other
// output path, or summing only. Stepped1, Stepped2: the epilogue as built and this probe's
// k-loop with 1 or 2 k-tiles of wgmmas in flight; Early2, Early3: its k-loop with 1 in
// flight that leaves its last 1 or 2 k-tiles unwaited, so that it returns (and the other
// warpgroup's mainloop starts) with 2 or 3 k-tiles of wgmmas still in flight; Spin1:
// Stepped1 polling the stages' barriers instead of sleeping on them.
enum class TraceVariant { AsBuilt, OtherStore, Skip, Stepped1, Stepped2, Early2, Early3, Spin1 };

// The k-loop a variant runs (TracedMainloop's parameters; in_flight 0: CUTLASS's own).
struct KLoop {
  int in_flight, exit_in_flight;
  bool spin;
};
constexpr KLoop KLoopOf(TraceVariant variant) {
  switch (variant) {
    case TraceVariant::Stepped1: return {1, 1, false};
    case TraceVariant::Stepped2: return {2, 2, false};
    case TraceVariant::Early2: return {1, 2, false};
    case TraceVariant::Early3: return {1, 3, false};
    case TraceVariant::Spin1: return {1, 1, true};
    default: return {0, 0, false};
  }
}

template <class Base, bool kSkipEpilogue>
struct TracedEpilogue : Base {
  using Base::Base;
  int traced_stores = 0;
  unsigned long long* trace_ = g_trace;

  template <class LoadPipeline, class LoadState, class StorePipeline, class StoreState,
            class ProblemShape, class TileShape, class TileCoord, class AccEngine, class AccLayout,
            class... Ts>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadState load_state,
                            StorePipeline store_pipeline, StoreState store_state,
                            ProblemShape problem_shape, TileShape tile_shape, TileCoord tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, Ts&&... args) {
    const bool record = threadIdx.x % 128 == 0;
    if (record) TraceRecord(trace_, MathRole(), traced_stores, 3, Clock());
    if constexpr (kSkipEpilogue) {
      // Read every accumulator once (else ptxas may drop the wgmmas that write them) and
      // store nothing: a sum no finite product reaches.
      float sum = 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(accumulators); ++i) sum += accumulators(i);
      if (sum == -3.0e38f) TraceRecord(trace_, MathRole(), traced_stores, 6, 0xFFFFFFFFull);
      if (record) TraceRecord(trace_, MathRole(), traced_stores, 4, Clock());
      return cute::make_tuple(load_state, store_state);
    } else {
      auto states = Base::store(load_pipeline, load_state, store_pipeline, store_state,
                                problem_shape, tile_shape, tile_coord, accumulators,
                                static_cast<Ts&&>(args)...);
      if (record) TraceRecord(trace_, MathRole(), traced_stores, 4, Clock());
      return states;
    }
  }

  template <class... Ts>
  CUTLASS_DEVICE auto store_tail(Ts&&... args) {
    auto states = Base::store_tail(static_cast<Ts&&>(args)...);
    if (threadIdx.x % 128 == 0) TraceRecord(trace_, MathRole(), traced_stores, 5, Clock());
    ++traced_stores;
    return states;
  }
};

template <int ConfigId, TraceVariant kVariant>
struct TracedInterleaved {
  // The product's parts for the config (tokens on the wgmma M side), recombined here with the
  // other output path where the variant asks for it.
  using Product =
      jax_swiglu::InterleavedAssembly<ConfigId, jax_swiglu::BF16, jax_swiglu::Activation::Silu>;
  static_assert(!Product::kSwapAb && !Product::kFp8 && !Product::kSplitTail,
                "the traced rows are 16-bit, tokens on M, whole tiles");
  static constexpr jax_swiglu::KernelConfig kConfig = Product::kConfig;
  using Element = typename Product::Element;
  static constexpr jax_swiglu::OutputStore kStore =
      kVariant != TraceVariant::OtherStore ? kConfig.store
      : kConfig.store == jax_swiglu::OutputStore::TmaStore ? jax_swiglu::OutputStore::DirectStore
                                                           : jax_swiglu::OutputStore::TmaStore;
  using Pairs = typename Product::Pairs;
  using Store = jax_swiglu::StoreFor<kStore, typename Product::ElementD, kConfig.tile_m,
                                     kConfig.tile_n, Pairs, false>;
  using Epilogue = jax_swiglu::SwiGluEpilogue<typename Product::ElementD,
                                              typename Product::TileShape, Pairs, Store,
                                              jax_swiglu::NoScales>;
  using Built = jax_swiglu::CollectiveMainloopFor<
      Element, typename Product::TileShape, typename Product::LayoutA,
      typename Product::LayoutB, kConfig.cluster_m, kConfig.cluster_n, kConfig.schedule,
      Epilogue::kSharedBytes>;
  using Mainloop = cute::conditional_t<Epilogue::kShiftedRows,
                                       jax_swiglu::EdgeTileMainloop<Built>, Built>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>,
      TracedMainloop<Mainloop, KLoopOf(kVariant).in_flight, KLoopOf(kVariant).exit_in_flight,
                     KLoopOf(kVariant).spin>,
      TracedEpilogue<Epilogue, kVariant == TraceVariant::Skip>,
      typename jax_swiglu::TileSchedulerFor<kConfig.scheduler, kConfig.m_bands>::type>;
};

// Launches the traced kernel, recording into `trace` (kTraceRoles * kTraceMaxTiles *
// kTraceSlots values per CTA, or null) and `steps` (2 * kStepMaxKTiles * 2 per CTA, or
// null). Defined in one translation unit per config and variant (traced_instance.cuh).
template <int ConfigId, TraceVariant kVariant>
std::string LaunchTraced(const jax_swiglu::SwigluProblem& p, const jax_swiglu::DeviceFacts& facts,
                         unsigned long long* trace, unsigned long long* steps,
                         cudaStream_t stream);

}  // namespace gemm_probe
