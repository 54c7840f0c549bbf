// Side by side in one process, on the Qwen2.5 MLP shapes (bf16, random data, weights
// rotated through more than the 60 MB L2): cuBLAS's bare GEMM [M, K] x [K, 2N] through
// cublasGemmEx's default algorithm (the benchmark's baseline (c) is XLA's autotuned cuBLASLt
// call of the same product, so its times differ), the same GEMM as plain CUTLASS kernels
// built like our fused kernel (plain_gemm.cuh: same mainloop and tiles, CUTLASS's epilogue
// writing [M, 2N]), and our fused interleaved kernel with those tiles (writing [M, N]).
//
// Usage: probe OUT.json IDLE_MS [M ...]   (default M: 512 2048 8192; GEMM_PROBE_SHAPES="KxN,..."
// replaces the Qwen2.5 shapes). The configs timed are compiled in: GEMM_PROBE_PLAIN_IDS (may
// be empty) and GEMM_PROBE_FUSED_IDS (run.sh sets them).
// Times: CUDA events around `kReps` back-to-back launches on rotating buffers, per launch;
// the median of `kRounds` rounds, the variants in a fresh random order each round. After
// each block of kReps launches the GPU idles IDLE_MS milliseconds. The regime matters on
// an H200 at its 700 W limit: with no idle time the load is sustained and the clocks drop
// (as in a model's forward pass); with idle time each block runs in a short burst at high
// clocks (as in benchmarks/bench_swiglu.py, whose jitted calls are separated by Python).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "launch.h"
#include "probe_common.cuh"

namespace gemm_probe {
template <int ConfigId>
std::string LaunchPlain(const jax_swiglu::SwigluProblem&, const jax_swiglu::DeviceFacts&,
                        cudaStream_t);
template <int ConfigId>
bool PlainReadsKMajorWeights();

using Launcher = std::string (*)(const jax_swiglu::SwigluProblem&, const jax_swiglu::DeviceFacts&,
                                 cudaStream_t);
struct Compiled {
  int config;
  Launcher launch;
  bool weights_k_major;  // reads the weight buffer as [2N, K] (plain_gemm.cuh)
};
// The configs compiled in (run.sh passes the lists and builds one translation unit each).
template <int... Ids>
std::vector<Compiled> PlainLaunchers() {
  return {{Ids, &LaunchPlain<Ids>, PlainReadsKMajorWeights<Ids>()}...};
}
template <int... Ids>
std::vector<Compiled> FusedLaunchers() {
  return {{Ids,
           &jax_swiglu::LaunchInterleaved<Ids, jax_swiglu::BF16, jax_swiglu::Activation::Silu>,
           false}...};
}
}  // namespace gemm_probe

#if __has_include("probe_ids.h")  // written by run.sh next to its copy of this file
#include "probe_ids.h"
#endif
#ifndef GEMM_PROBE_PLAIN_IDS
#define GEMM_PROBE_PLAIN_IDS 0, 1
#endif
#ifndef GEMM_PROBE_FUSED_IDS
#define GEMM_PROBE_FUSED_IDS 0, 1
#endif

#define CHECK_CUBLAS(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t st_ = (call);                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #call,      \
                   static_cast<int>(st_));                                                 \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

constexpr int kReps = 10;
constexpr int kRounds = 7;

__device__ float Bf16ToFloat(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// max |a - b| and max |b| over `count` bf16 values (non-negative floats order as their bits).
__global__ void MaxDifference(const uint16_t* a, const uint16_t* b, size_t count,
                              unsigned* max_diff, unsigned* max_ref) {
  float diff = 0.0f, ref = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
    diff = fmaxf(diff, fabsf(x - y));
    ref = fmaxf(ref, fabsf(y));
  }
  atomicMax(max_diff, __float_as_uint(diff));
  atomicMax(max_ref, __float_as_uint(ref));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT.json IDLE_MS [M ...]\n", argv[0]);
    return 2;
  }
  const int idle_ms = std::atoi(argv[2]);
  std::vector<int> ms;
  for (int i = 3; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {512, 2048, 8192};

  jax_swiglu::DeviceFacts facts{};
  CHECK_CUDA(cudaGetDevice(&facts.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, facts.device));
  facts.sm_count = prop.multiProcessorCount;
  facts.cc_major = prop.major;
  facts.cc_minor = prop.minor;
  int cublas_version = 0;

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasGetVersion(handle, &cublas_version));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  void* cublas_workspace = nullptr;
  const size_t cublas_workspace_bytes = size_t(64) << 20;
  CHECK_CUDA(cudaMalloc(&cublas_workspace, cublas_workspace_bytes));
  CHECK_CUBLAS(cublasSetWorkspace(handle, cublas_workspace, cublas_workspace_bytes));
  unsigned* maxima = nullptr;
  CHECK_CUDA(cudaMalloc(&maxima, 2 * sizeof(unsigned)));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  FILE* json = std::fopen(argv[1], "w");
  if (!json) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(json,
               "{\"gpu\": \"%s\", \"sm_count\": %d, \"cublas_version\": %d, \"reps\": %d, "
               "\"rounds\": %d, \"idle_ms\": %d, \"rotation_bytes\": %zu, \"rows\": [",
               prop.name, facts.sm_count, cublas_version, kReps, kRounds, idle_ms, kRotationBytes);
  std::printf("GPU idle after each block of %d launches: %d ms\n\n", kReps, idle_ms);
  const std::vector<gemm_probe::Compiled> plain = gemm_probe::PlainLaunchers<GEMM_PROBE_PLAIN_IDS>();
  const std::vector<gemm_probe::Compiled> fused = gemm_probe::FusedLaunchers<GEMM_PROBE_FUSED_IDS>();
  // With K-major candidates, cuBLAS also runs on the weights read that way ("cublas_tn",
  // their reference; the table's ratios stay against "cublas").
  const bool any_k_major = std::any_of(plain.begin(), plain.end(),
                                       [](const gemm_probe::Compiled& c) { return c.weights_k_major; });
  std::mt19937 shuffle_rng(2026);
  bool first_row = true;
  const std::vector<Model> shapes = ProbeShapes();
  for (int m : ms) {
    for (const Model& model : shapes) {
      const int k = model.hidden, n = model.intermediate, n2 = 2 * n;
      const RotatingInputs inputs(m, k, n2);
      const int sets = inputs.sets;
      const std::vector<uint16_t*>& xs = inputs.xs;
      const std::vector<uint16_t*>& ws = inputs.ws;
      uint16_t *out_plain = nullptr, *out_cublas = nullptr, *out_cublas_tn = nullptr,
               *out_fused = nullptr;
      CHECK_CUDA(cudaMalloc(&out_plain, size_t(m) * n2 * sizeof(uint16_t)));
      CHECK_CUDA(cudaMalloc(&out_cublas, size_t(m) * n2 * sizeof(uint16_t)));
      CHECK_CUDA(cudaMalloc(&out_cublas_tn, size_t(m) * n2 * sizeof(uint16_t)));
      CHECK_CUDA(cudaMalloc(&out_fused, size_t(m) * n * sizeof(uint16_t)));

      auto problem = [&](int s, void* out) {
        jax_swiglu::SwigluProblem p{};
        p.x = xs[s];
        p.packed = ws[s];  // timing only: any [K, 2N] data is a valid packed matrix
        p.out = out;
        p.m = m;
        p.n = n;
        p.n_packed = n;  // timing only: N is taken as its own padded width
        p.k = k;
        p.swizzle = 1;
        p.raster = 0;
        return p;
      };
      auto check = [](const std::string& error) {
        if (!error.empty()) {
          std::fprintf(stderr, "%s\n", error.c_str());
          std::exit(1);
        }
      };
      const float alpha = 1.0f, beta = 0.0f;
      struct Variant {
        std::string name;
        std::function<void(int)> launch;
      };
      std::vector<Variant> variants;
      variants.push_back({"cublas", [&](int s) {
        CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n2, m, k, &alpha, ws[s],
                                  CUDA_R_16BF, n2, xs[s], CUDA_R_16BF, k, &beta, out_cublas,
                                  CUDA_R_16BF, n2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }});
      if (any_k_major)
        variants.push_back({"cublas_tn", [&](int s) {
          // The weight buffer as [2N, K] row-major: column-major [K, 2N], transposed.
          CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n2, m, k, &alpha, ws[s],
                                    CUDA_R_16BF, k, xs[s], CUDA_R_16BF, k, &beta, out_cublas_tn,
                                    CUDA_R_16BF, n2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }});
      const size_t first_plain = variants.size();
      for (const auto& c : plain)
        variants.push_back({"plain:" + std::to_string(c.config),
                            [&, c](int s) { check(c.launch(problem(s, out_plain), facts, stream)); }});
      for (const auto& c : fused)
        variants.push_back({"fused:" + std::to_string(c.config),
                            [&, c](int s) { check(c.launch(problem(s, out_fused), facts, stream)); }});
      if (first_row) {
        std::printf("| model | M |");
        for (auto& v : variants) std::printf(" %s |", v.name.c_str());
        for (size_t v = 1; v < variants.size(); ++v) std::printf(" %s/cublas |", variants[v].name.c_str());
        std::printf(" plain vs cublas max diff |\n|---|---|");
        for (size_t v = 1; v < 2 * variants.size(); ++v) std::printf("---|");
        std::printf("\n");
      }

      // Does every plain kernel compute the product? (Against cuBLAS on the weights read the
      // same way, on set 0; the largest difference over them is reported.)
      for (size_t v = 0; v < first_plain; ++v) variants[v].launch(0);
      float max_diff = 0.0f, max_ref = 0.0f;
      for (size_t i = 0; i < plain.size(); ++i) {
        variants[first_plain + i].launch(0);
        CHECK_CUDA(cudaMemsetAsync(maxima, 0, 2 * sizeof(unsigned), stream));
        MaxDifference<<<1024, 256, 0, stream>>>(
            out_plain, plain[i].weights_k_major ? out_cublas_tn : out_cublas, size_t(m) * n2,
            maxima, maxima + 1);
        unsigned host_maxima[2];
        CHECK_CUDA(cudaMemcpyAsync(host_maxima, maxima, sizeof(host_maxima),
                                   cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        float diff, ref;
        std::memcpy(&diff, &host_maxima[0], 4);
        std::memcpy(&ref, &host_maxima[1], 4);
        max_diff = std::max(max_diff, diff);
        max_ref = std::max(max_ref, ref);
      }

      // Each fused kernel's output on set 0, hashed (FNV-1a over its bytes): two builds of one
      // row in different forms (GEMM_PROBE_FLAGS) compute the same fp32 sums, so their digests
      // agree exactly when both pair and store every element alike.
      std::vector<uint64_t> digests;
      std::vector<uint16_t> host_out(size_t(m) * n);
      for (size_t i = 0; i < fused.size(); ++i) {
        CHECK_CUDA(cudaMemsetAsync(out_fused, 0xFF, host_out.size() * sizeof(uint16_t), stream));
        variants[variants.size() - fused.size() + i].launch(0);
        CHECK_CUDA(cudaMemcpyAsync(host_out.data(), out_fused, host_out.size() * sizeof(uint16_t),
                                   cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        uint64_t hash = 1469598103934665603ull;
        for (uint16_t value : host_out) {
          hash = (hash ^ (value & 0xFF)) * 1099511628211ull;
          hash = (hash ^ (value >> 8)) * 1099511628211ull;
        }
        digests.push_back(hash);
      }

      for (auto& v : variants)
        for (int i = 0; i < 3; ++i) v.launch(i % sets);  // warm-up
      std::vector<std::vector<double>> times(variants.size());
      std::vector<size_t> order(variants.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      int next_set = 0;
      for (int round = 0; round < kRounds; ++round) {
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        for (size_t v : order) {
          CHECK_CUDA(cudaEventRecord(start, stream));
          for (int r = 0; r < kReps; ++r) {
            variants[v].launch(next_set);
            next_set = (next_set + 1) % sets;
          }
          CHECK_CUDA(cudaEventRecord(stop, stream));
          CHECK_CUDA(cudaEventSynchronize(stop));
          float ms_total = 0.0f;
          CHECK_CUDA(cudaEventElapsedTime(&ms_total, start, stop));
          times[v].push_back(1000.0 * ms_total / kReps);
          if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
        }
      }
      CHECK_CUDA(cudaGetLastError());

      std::vector<double> us(variants.size());
      for (size_t v = 0; v < variants.size(); ++v) us[v] = Median(times[v]);
      std::printf("| %s | %d |", model.name, m);
      for (double t : us) std::printf(" %.1f |", t);
      for (size_t v = 1; v < us.size(); ++v) std::printf(" %.3f |", us[v] / us[0]);
      std::printf(" %.3g of %.3g |", max_diff, max_ref);
      for (size_t i = 0; i < fused.size(); ++i)
        std::printf(" fused:%d %016llx", fused[i].config, (unsigned long long)digests[i]);
      std::printf("\n");
      std::fflush(stdout);
      std::fprintf(json, "%s\n {\"model\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"sets\": %d, "
                   "\"plain_vs_cublas_max_abs_diff\": %g, \"cublas_max_abs\": %g, \"us\": {",
                   first_row ? "" : ",", model.name, m, k, n, sets, max_diff, max_ref);
      for (size_t v = 0; v < variants.size(); ++v)
        std::fprintf(json, "%s\"%s\": %.3f", v ? ", " : "", variants[v].name.c_str(), us[v]);
      std::fprintf(json, "}, \"fused_digests\": {");
      for (size_t i = 0; i < fused.size(); ++i)
        std::fprintf(json, "%s\"fused:%d\": \"%016llx\"", i ? ", " : "", fused[i].config,
                     (unsigned long long)digests[i]);
      std::fprintf(json, "}, \"rounds_us\": {");
      for (size_t v = 0; v < variants.size(); ++v) {
        std::fprintf(json, "%s\"%s\": [", v ? ", " : "", variants[v].name.c_str());
        for (size_t r = 0; r < times[v].size(); ++r)
          std::fprintf(json, "%s%.3f", r ? ", " : "", times[v][r]);
        std::fprintf(json, "]");
      }
      std::fprintf(json, "}}");
      first_row = false;

      CHECK_CUDA(cudaFree(out_plain));
      CHECK_CUDA(cudaFree(out_cublas));
      CHECK_CUDA(cudaFree(out_cublas_tn));
      CHECK_CUDA(cudaFree(out_fused));
    }
  }
  std::fprintf(json, "\n]}\n");
  std::fclose(json);
  return 0;
}
