// Per-tile timelines of the interleaved kernel (traced_kernel.cuh) on Qwen2.5 MLP shapes,
// with cuBLAS's bare GEMM [M, K] x [K, 2N] timed alongside for scale.
//
// Usage: trace OUT.csv STEPS.csv ROW...   ROW = model:M (e.g. qwen2.5-0.5b:2048). The traced configs
// and variants are compiled in: GEMM_PROBE_TRACED, a list of (config, TraceVariant)
// pairs (trace.sh writes it). Per row and variant: the median time per launch of kRounds
// blocks of kReps launches on weights rotated through more than the L2 (CUDA events,
// nothing recorded), then one recorded launch; its events go to OUT.csv, one line per
// (variant, row, CTA, role, tile): the slots of traced_kernel.cuh, and for the variants
// with the probe's k-loop the per-k-tile times of the sampled tiles to STEPS.csv. Each
// variant's output is compared with the first variant's (a k-loop variant must compute
// the same product: same wgmmas, same order, so the same bits).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_common.cuh"
#include "traced_kernel.cuh"

#if __has_include("trace_ids.h")  // written by trace.sh next to its copy of this file
#include "trace_ids.h"
#endif
#ifndef GEMM_PROBE_TRACED
#define GEMM_PROBE_TRACED {6, gemm_probe::TraceVariant::AsBuilt}
#define GEMM_PROBE_TRACED_MATCHES GEMM_PROBE_MATCH(6, gemm_probe::TraceVariant::AsBuilt)
#endif

namespace {

constexpr int kReps = 10;
constexpr int kRounds = 5;

struct Variant {
  int config;
  gemm_probe::TraceVariant kind;
};

const char* VariantName(gemm_probe::TraceVariant kind) {
  switch (kind) {
    case gemm_probe::TraceVariant::AsBuilt: return "as-built";
    case gemm_probe::TraceVariant::OtherStore: return "other-store";
    case gemm_probe::TraceVariant::Skip: return "skip";
    case gemm_probe::TraceVariant::Stepped1: return "stepped1";
    case gemm_probe::TraceVariant::Stepped2: return "stepped2";
    case gemm_probe::TraceVariant::Early2: return "early2";
    case gemm_probe::TraceVariant::Early3: return "early3";
    case gemm_probe::TraceVariant::Spin1: return "spin1";
  }
  return "?";
}

using TracedLauncher = std::string (*)(const jax_swiglu::SwigluProblem&,
                                       const jax_swiglu::DeviceFacts&, unsigned long long*,
                                       unsigned long long*, cudaStream_t);

template <int Config, gemm_probe::TraceVariant Epilogue>
constexpr TracedLauncher kLaunch = &gemm_probe::LaunchTraced<Config, Epilogue>;

// Elements of two bf16 buffers whose bits differ.
__global__ void CountDifferent(const uint16_t* a, const uint16_t* b, size_t count,
                               unsigned long long* different) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(different, local);
}

}  // namespace

struct Compiled {
  Variant variant;
  TracedLauncher launch;
};

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s OUT.csv STEPS.csv model:M...\n", argv[0]);
    return 2;
  }
  std::vector<Compiled> compiled;
  {
    // GEMM_PROBE_TRACED is a list of {config, variant} pairs; each names a compiled launcher.
    const Variant variants[] = {GEMM_PROBE_TRACED};
    for (const Variant& v : variants) {
      TracedLauncher launch = nullptr;
#define GEMM_PROBE_MATCH(c, e) \
  if (v.config == c && v.kind == e) launch = kLaunch<c, e>;
      GEMM_PROBE_TRACED_MATCHES
#undef GEMM_PROBE_MATCH
      if (!launch) {
        std::fprintf(stderr, "config %d (%s) not compiled\n", v.config, VariantName(v.kind));
        return 2;
      }
      compiled.push_back({v, launch});
    }
  }

  jax_swiglu::DeviceFacts facts{};
  CHECK_CUDA(cudaGetDevice(&facts.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, facts.device));
  facts.sm_count = prop.multiProcessorCount;
  facts.cc_major = prop.major;
  facts.cc_minor = prop.minor;

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(handle, stream);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  // Enough for any persistent grid of this GPU (one CTA per SM).
  const size_t trace_values = size_t(facts.sm_count) * gemm_probe::kTraceRoles *
                              gemm_probe::kTraceMaxTiles * gemm_probe::kTraceSlots;
  unsigned long long* trace = nullptr;
  CHECK_CUDA(cudaMalloc(&trace, trace_values * sizeof(unsigned long long)));
  std::vector<unsigned long long> host(trace_values);
  const size_t step_values = size_t(facts.sm_count) * 2 * gemm_probe::kStepMaxKTiles * 2;
  unsigned long long *steps = nullptr, *different = nullptr;
  CHECK_CUDA(cudaMalloc(&steps, step_values * sizeof(unsigned long long)));
  CHECK_CUDA(cudaMalloc(&different, sizeof(unsigned long long)));
  std::vector<unsigned long long> host_steps(step_values);

  FILE* csv = std::fopen(argv[1], "w");
  if (!csv) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(csv, "config,variant,model,m,k,n,us,cublas_us,cta,role,tile");
  for (int s = 0; s < gemm_probe::kTraceSlots; ++s) std::fprintf(csv, ",s%d", s);
  std::fprintf(csv, "\n");
  FILE* steps_csv = std::fopen(argv[2], "w");
  if (!steps_csv) {
    std::perror(argv[2]);
    return 1;
  }
  std::fprintf(steps_csv, "config,variant,model,m,cta,role,k_tile,data_ready,mma_done\n");

  for (int a = 3; a < argc; ++a) {
    const std::string row(argv[a]);
    const size_t colon = row.find(':');
    const Model* model = nullptr;
    for (const Model& candidate : kModels)
      if (row.substr(0, colon) == candidate.name) model = &candidate;
    if (!model || colon == std::string::npos) {
      std::fprintf(stderr, "bad row %s\n", row.c_str());
      return 2;
    }
    const int m = std::atoi(row.c_str() + colon + 1);
    const int k = model->hidden, n = model->intermediate, n2 = 2 * n;
    const RotatingInputs inputs(m, k, n2);
    const int sets = inputs.sets;
    const std::vector<uint16_t*>& xs = inputs.xs;
    const std::vector<uint16_t*>& ws = inputs.ws;
    uint16_t *out = nullptr, *out_first = nullptr, *out_cublas = nullptr;
    CHECK_CUDA(cudaMalloc(&out, size_t(m) * n * sizeof(uint16_t)));
    CHECK_CUDA(cudaMalloc(&out_first, size_t(m) * n * sizeof(uint16_t)));
    CHECK_CUDA(cudaMalloc(&out_cublas, size_t(m) * n2 * sizeof(uint16_t)));
    auto problem = [&](int s) {
      jax_swiglu::SwigluProblem p{};
      p.x = xs[s];
      p.packed = ws[s];  // timing only: any [K, 2N] data is a valid packed matrix
      p.out = out;
      p.m = m;
      p.n = n;
      p.n_packed = n;
      p.k = k;
      p.swizzle = 1;
      p.raster = 0;
      return p;
    };
    int next_set = 0;
    // Median microseconds per launch of `launch(set)`.
    auto time = [&](auto&& launch) {
      for (int i = 0; i < 3; ++i) launch(i % sets);
      std::vector<double> per_launch;
      for (int round = 0; round < kRounds; ++round) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        for (int r = 0; r < kReps; ++r) {
          launch(next_set);
          next_set = (next_set + 1) % sets;
        }
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        per_launch.push_back(1000.0 * ms / kReps);
      }
      return Median(per_launch);
    };
    const float alpha = 1.0f, beta = 0.0f;
    const double cublas_us = time([&](int s) {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n2, m, k, &alpha, ws[s], CUDA_R_16BF, n2,
                   xs[s], CUDA_R_16BF, k, &beta, out_cublas, CUDA_R_16BF, n2,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    for (const Compiled& c : compiled) {
      auto run = [&](int s, unsigned long long* buffer, unsigned long long* step_buffer) {
        const std::string error = c.launch(problem(s), facts, buffer, step_buffer, stream);
        if (!error.empty()) {
          std::fprintf(stderr, "%s\n", error.c_str());
          std::exit(1);
        }
      };
      const double us = time([&](int s) { run(s, nullptr, nullptr); });
      // The output on set 0, against the first variant's.
      run(0, nullptr, nullptr);
      unsigned long long host_different = 0;
      if (&c == &compiled[0]) {
        CHECK_CUDA(cudaMemcpyAsync(out_first, out, size_t(m) * n * sizeof(uint16_t),
                                   cudaMemcpyDeviceToDevice, stream));
      } else {
        CHECK_CUDA(cudaMemsetAsync(different, 0, sizeof(unsigned long long), stream));
        CountDifferent<<<1024, 256, 0, stream>>>(out, out_first, size_t(m) * n, different);
        CHECK_CUDA(cudaMemcpyAsync(&host_different, different, sizeof(host_different),
                                   cudaMemcpyDeviceToHost, stream));
      }
      CHECK_CUDA(cudaMemsetAsync(trace, 0, trace_values * sizeof(unsigned long long), stream));
      CHECK_CUDA(cudaMemsetAsync(steps, 0, step_values * sizeof(unsigned long long), stream));
      run(next_set, trace, steps);
      CHECK_CUDA(cudaMemcpyAsync(host.data(), trace, trace_values * sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaMemcpyAsync(host_steps.data(), steps,
                                 step_values * sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      std::printf("%s M=%d config %d (%s): %.1f us (cuBLAS %.1f), output elements differing "
                  "from the first variant's: %llu%s\n",
                  model->name, m, c.variant.config, VariantName(c.variant.kind), us,
                  cublas_us, host_different,
                  c.variant.kind == gemm_probe::TraceVariant::OtherStore ||
                          c.variant.kind == gemm_probe::TraceVariant::Skip
                      ? " (expected: this variant writes differently or nothing)"
                      : "");
      std::fflush(stdout);
      for (int cta = 0; cta < facts.sm_count; ++cta)
        for (int role = 0; role < gemm_probe::kTraceRoles; ++role)
          for (int tile = 0; tile < gemm_probe::kTraceMaxTiles; ++tile) {
            const unsigned long long* slots =
                &host[((size_t(cta) * gemm_probe::kTraceRoles + role) * gemm_probe::kTraceMaxTiles +
                       tile) * gemm_probe::kTraceSlots];
            if (slots[0] == 0) continue;
            std::fprintf(csv, "%d,%s,%s,%d,%d,%d,%.2f,%.2f,%d,%d,%d", c.variant.config,
                         VariantName(c.variant.kind), model->name, m, k, n, us, cublas_us, cta, role,
                         tile);
            for (int s = 0; s < gemm_probe::kTraceSlots; ++s)
              std::fprintf(csv, ",%llu", slots[s]);
            std::fprintf(csv, "\n");
          }
      for (int cta = 0; cta < facts.sm_count; ++cta)
        for (int role = 0; role < 2; ++role)
          for (int k_tile = 0; k_tile < gemm_probe::kStepMaxKTiles; ++k_tile) {
            const unsigned long long* slots =
                &host_steps[((size_t(cta) * 2 + role) * gemm_probe::kStepMaxKTiles + k_tile) * 2];
            if (slots[0] == 0) continue;
            std::fprintf(steps_csv, "%d,%s,%s,%d,%d,%d,%d,%llu,%llu\n", c.variant.config,
                         VariantName(c.variant.kind), model->name, m, cta, role, k_tile,
                         slots[0], slots[1]);
          }
    }
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(out_first));
    CHECK_CUDA(cudaFree(out_cublas));
  }
  std::fclose(csv);
  std::fclose(steps_csv);
  return 0;
}
