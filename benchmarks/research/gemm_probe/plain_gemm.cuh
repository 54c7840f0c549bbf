// A plain CUTLASS GEMM, D[M, 2N] = X[M, K] @ W[K, 2N] in bf16 with fp32 accumulation,
// assembled exactly as the interleaved kernel is (same CollectiveBuilder mainloop, tile,
// cluster and persistent scheduler) but with CUTLASS's own TMA epilogue writing the whole
// [M, 2N] product. It answers one question for target 2 of issue 4: how much of the fused
// kernel's gap to cuBLAS's bare GEMM is CUTLASS's mainloop, and how much is our epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <string>
#include <type_traits>

#include "kernels/interleaved_kernel.cuh"  // KernelScheduleFor, LaunchGemm

namespace gemm_probe {

template <jax_swiglu::Schedule S>
struct EpilogueScheduleFor;
template <>
struct EpilogueScheduleFor<jax_swiglu::Schedule::Cooperative> {
  using type = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
template <>
struct EpilogueScheduleFor<jax_swiglu::Schedule::Pingpong> {
  using type = cutlass::epilogue::TmaWarpSpecialized;
};

// Candidate tiles no fused kernel has yet, timed as plain GEMMs only: do they beat our
// kernels' mainloops, and come nearer cuBLAS, on the rows where target 2 misses? Ids from
// 100 on (PLAIN_IDS of run.sh). Two families:
//  - packed widths 160 and 192, which the 64-column gate/up blocks of the time ruled out for
//    a fused kernel (run 37: 192 won, the layout went to 32-column blocks and 100 and 102
//    became interleaved configs 6 and 7; 160 would need 16-column blocks);
//  - "transposed" tiles (transposed = true): the GEMM computes D^T[2N, M] = W^T X^T, weights
//    on the wgmma M side (MN-major A) and tokens on the N side (K-major B), the orientation
//    cuBLAS picks for these shapes (Nsight Compute, 2026-11-29-ncu-fused-vs-cublas.md). Here
//    tile_m counts packed weight columns and tile_n tokens; D is written [M, 2N] row-major
//    all the same (column-major D^T). With 64-column gate/up blocks, a 128-row weight tile
//    put gate and up in the two m64 atoms of one warpgroup, so a fused epilogue would have
//    found each pair in one thread, for any token width (these lost, run 37).
//    115-117 are cuBLAS's mid-M tile (128 weight columns x 208 tokens, cooperative; the
//    tile of swap-AB row 70) in 1 x 2, 2 x 2 and 4 x 2 clusters (weights x tokens).
//  - "K-major weights" (Orientation::kWeightsKMajor): the normal orientation, but the weights
//    stored [2N, K] (each packed column's K values contiguous, the "TN" layout) instead of
//    [K, 2N]. Shared memory then swizzles 128 bytes along K for any tile width, where an
//    N-major B tile gets the full 128-byte swizzle only at widths that are multiples of 64
//    (160 gets 64-byte, 176 and 112 32-byte swizzles). Widths like 176 and 112 fill the last
//    wave better where a multiple of 64 leaves it ragged (3B M=512: 504 tiles of 128x176 on
//    132 SMs, 96% of 4 waves, against 460 of 128x192, 87%; 0.5B M=2048: 1392 of 128x112,
//    96% of 11 waves, against 1216 of 128x128, 92% of 10). Such widths need CuTe's extended
//    wgmma shapes (build_env.sh defines them; runs 86-87 lacked them, run 92 had them).
enum class Orientation { kNormal, kTransposed, kWeightsKMajor };
struct ProbeConfig {
  jax_swiglu::KernelConfig tiles;
  Orientation orientation;
};
#define GEMM_PROBE_CANDIDATE(id, orientation, schedule, tm, tn, tk, cm, cn)                  \
  ProbeConfig{{id, jax_swiglu::Family::Interleaved, jax_swiglu::Operands::Bits16,          \
               jax_swiglu::Accumulation::Promoted, jax_swiglu::Schedule::schedule,           \
               jax_swiglu::MmaMSide::Tokens, tm, tn, tk,                                      \
               cm, cn, jax_swiglu::TileScheduler::Persistent,                               \
               jax_swiglu::OutputStore::TmaStore /* unused: CUTLASS's own epilogue */, 1,   \
               jax_swiglu::Build::Optional},                                                \
              Orientation::orientation},
inline constexpr ProbeConfig kCandidates[] = {
    GEMM_PROBE_CANDIDATE(100, kNormal, Pingpong, 128, 192, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(101, kNormal, Pingpong, 128, 160, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(102, kNormal, Cooperative, 256, 192, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(103, kTransposed, Pingpong, 128, 160, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(104, kTransposed, Pingpong, 128, 160, 64, 1, 2)
    GEMM_PROBE_CANDIDATE(105, kTransposed, Cooperative, 256, 128, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(106, kTransposed, Cooperative, 256, 160, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(107, kTransposed, Pingpong, 128, 192, 64, 1, 1)
    GEMM_PROBE_CANDIDATE(108, kWeightsKMajor, Pingpong, 128, 128, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(109, kWeightsKMajor, Pingpong, 128, 192, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(110, kWeightsKMajor, Pingpong, 128, 160, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(111, kWeightsKMajor, Pingpong, 128, 176, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(112, kWeightsKMajor, Pingpong, 128, 112, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(113, kWeightsKMajor, Cooperative, 256, 192, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(114, kWeightsKMajor, Cooperative, 128, 224, 64, 2, 1)
    GEMM_PROBE_CANDIDATE(115, kTransposed, Cooperative, 128, 208, 64, 1, 2)
    GEMM_PROBE_CANDIDATE(116, kTransposed, Cooperative, 128, 208, 64, 2, 2)
    GEMM_PROBE_CANDIDATE(117, kTransposed, Cooperative, 128, 208, 64, 4, 2)
};
#undef GEMM_PROBE_CANDIDATE
inline constexpr int kFirstCandidateId = 100;

// The tiles of probe id `Id`: a 16-bit interleaved row of ffi/kernel_configs.h, or a candidate.
template <int Id>
constexpr ProbeConfig ProbeConfigFor() {
  if constexpr (Id >= kFirstCandidateId) {
    static_assert(Id - kFirstCandidateId < int(sizeof(kCandidates) / sizeof(ProbeConfig)),
                  "no such candidate");
    return kCandidates[Id - kFirstCandidateId];
  } else {
    static_assert(jax_swiglu::kConfigs[Id].family == jax_swiglu::Family::Interleaved &&
                      jax_swiglu::kConfigs[Id].operands == jax_swiglu::Operands::Bits16,
                  "a 16-bit interleaved row");
    return ProbeConfig{jax_swiglu::kConfigs[Id], Orientation::kNormal};
  }
}

// The plain GEMM with the tiles of probe id `ConfigId`.
template <int ConfigId>
struct PlainGemm {
  static constexpr ProbeConfig kProbe = ProbeConfigFor<ConfigId>();
  static constexpr jax_swiglu::KernelConfig kConfig = kProbe.tiles;
  using Element = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  using ClusterShape =
      cute::Shape<cute::Int<kConfig.cluster_m>, cute::Int<kConfig.cluster_n>, cute::_1>;
  static constexpr int kAlignment = 8;
  static constexpr bool kTransposed = kProbe.orientation == Orientation::kTransposed;
  static constexpr bool kWeightsKMajor = kProbe.orientation == Orientation::kWeightsKMajor;
  // Normal: A = x [M, K] K-major, B = W [K, 2N] N-major, D [M, 2N] row-major.
  // Transposed: A = W^T [2N, K] M-major, B = x^T (tokens x K, K-major), D^T column-major.
  // K-major weights: as normal, but B = W stored [2N, K] (K-major; CUTLASS's ColumnMajor B).
  using LayoutA = std::conditional_t<kTransposed, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<kWeightsKMajor, cutlass::layout::ColumnMajor, LayoutA>;
  using LayoutD = LayoutA;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignment,  // no source tensor
      Element, LayoutD, kAlignment,
      typename EpilogueScheduleFor<kConfig.schedule>::type>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, LayoutA, kAlignment,
      Element, LayoutB, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename jax_swiglu::KernelScheduleFor<kConfig.schedule,
                                             kConfig.accumulation>::type>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
};

// Whether probe id `ConfigId` reads the weights K-major ([2N, K]); probe.cu checks such a
// kernel against cuBLAS on the same buffer read that way.
template <int ConfigId>
bool PlainReadsKMajorWeights() {
  return PlainGemm<ConfigId>::kWeightsKMajor;
}

// Launches the plain GEMM on the problem's x [m, k] and packed weights (read as [k, 2 n_packed],
// or as [2 n_packed, k] for K-major candidates), writing [m, 2 n_packed] to `out` (the
// caller's buffer of that size).
template <int ConfigId>
std::string LaunchPlain(const jax_swiglu::SwigluProblem& p, const jax_swiglu::DeviceFacts& facts,
                        cudaStream_t stream) {
  using G = PlainGemm<ConfigId>;
  using Kernel = typename G::Kernel;
  using Element = typename G::Element;
  const int m = static_cast<int>(p.m), n2 = static_cast<int>(2 * p.n_packed),
            k = static_cast<int>(p.k);
  // CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L), D is (M, N, L).
  // Normal: rows are tokens; transposed: rows are packed weight columns, columns tokens.
  // Either way x, W and D are the same row-major buffers; only the strides swap.
  const auto x_strides = cute::make_stride(int64_t(k), cute::_1{}, int64_t(0));   // (token, k)
  const auto w_strides = cute::make_stride(cute::_1{}, int64_t(n2), int64_t(0));  // (col, k)
  typename Kernel::StrideA stride_a;
  typename Kernel::StrideB stride_b;
  typename Kernel::StrideD stride_d;
  int rows, columns;
  if constexpr (G::kWeightsKMajor) {
    stride_a = x_strides;
    stride_b = cute::make_stride(int64_t(k), cute::_1{}, int64_t(0));  // (col, k), K-major
    stride_d = cute::make_stride(int64_t(n2), cute::_1{}, int64_t(0));
    rows = m;
    columns = n2;
  } else if constexpr (G::kTransposed) {
    stride_a = w_strides;
    stride_b = x_strides;
    stride_d = cute::make_stride(cute::_1{}, int64_t(n2), int64_t(0));  // D^T: (col, token)
    rows = n2;
    columns = m;
  } else {
    stride_a = x_strides;
    stride_b = w_strides;
    stride_d = cute::make_stride(int64_t(n2), cute::_1{}, int64_t(0));
    rows = m;
    columns = n2;
  }
  const void* a = G::kTransposed ? p.packed : p.x;
  const void* b = G::kTransposed ? p.x : p.packed;
  typename Kernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {rows, columns, k, 1},
      {static_cast<Element const*>(a), stride_a, static_cast<Element const*>(b), stride_b},
      {{}, nullptr, stride_d, static_cast<Element*>(p.out), stride_d},
      cutlass::KernelHardwareInfo{facts.device, facts.sm_count},
      {}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return jax_swiglu::LaunchGemm<Kernel>(
      args, p, facts, dim3(G::kConfig.cluster_m, G::kConfig.cluster_n, 1), stream, "plain");
}

}  // namespace gemm_probe
