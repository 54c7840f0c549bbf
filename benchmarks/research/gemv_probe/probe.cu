// The gemv kernel's forms side by side with cuBLAS's bare GEMM at decode sizes, in one
// process (bf16, SiLU, random data, weights rotated through more than the L2): the
// CUDA-core form (the table's gemv configs), the tensor-core form (wgmma fed by TMA) with
// its stream's parameters varied (CTAs an SM, hence stages; the weights' L2 promotion and
// eviction priority), and with -DGEMV_PROBE_MMA the mma.sync forms of an earlier question
// (other token tiles, chunks per thread, unrolling and occupancy), each at every cluster
// split. It answers "which gemv form streams the weights fastest at M tokens?", and checks
// every form's output against an fp32 reference of the packed layout first.
//
// Usage: probe OUT.json M,M,... KxN [KxN ...]
// Times: a CUDA graph of kReps launches over the rotating buffers, replayed kRounds times;
// the median replay, per launch (the same regime as jax_swiglu.tuning.measure's replay).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemv_mma.cuh"
#include "kernels/gemv/wgmma_gemv.cuh"
#include "probe_common.cuh"

namespace {

using jax_swiglu::Activation;
using jax_swiglu::BF16;
using jax_swiglu::DeviceFacts;
using jax_swiglu::SwigluProblem;
using Launcher = std::string (*)(const SwigluProblem&, const DeviceFacts&, cudaStream_t);

struct Form {
  std::string name;
  int max_m;
  Launcher launch;
  bool checked = true;  // a stream-only form computes no product
};

template <int kTokenTiles, int kChunks, int kUnroll, int kMinBlocks>
Form Mma() {
  return {"mma t" + std::to_string(8 * kTokenTiles) + " c" + std::to_string(kChunks) + " u" +
              std::to_string(kUnroll) + " b" + std::to_string(kMinBlocks),
          8 * kTokenTiles,
          &gemv_probe::LaunchGemvMma<kTokenTiles, kChunks, kUnroll, kMinBlocks>};
}
template <int kChunks, int kUnroll, int kMinBlocks>
Form StreamOnly() {
  return {"stream only c" + std::to_string(kChunks) + " u" + std::to_string(kUnroll) + " b" +
              std::to_string(kMinBlocks),
          8, &gemv_probe::LaunchGemvMma<1, kChunks, kUnroll, kMinBlocks, true>, false};
}
// The tensor-core form for 16 tokens and kColumns packed columns a CTA, with its stream's
// parameters (the product's: 2 CTAs an SM, 128-byte L2 promotion, normal eviction).
template <int kColumns, int kCtasPerSm, int kL2PromotionBytes, bool kEvictFirst>
Form TensorCores() {
  return {"tensor-cores n" + std::to_string(kColumns) + " b" + std::to_string(kCtasPerSm) +
              " l2:" + std::to_string(kL2PromotionBytes) + (kEvictFirst ? " evict-first" : ""),
          16,
          &jax_swiglu::LaunchWgmmaGemv<16, kColumns, BF16, false, Activation::Silu, kCtasPerSm,
                                       kL2PromotionBytes, kEvictFirst>};
}
// The i-th gemv row of the product's table.
constexpr int GemvRow(int i) {
  for (int id = 0; id < jax_swiglu::kConfigCount; ++id) {
    if (jax_swiglu::kConfigs[id].family == jax_swiglu::Family::Gemv && i-- == 0) return id;
  }
  return -1;
}

template <int ConfigId>
Form CudaCores() {
  static_assert(ConfigId >= 0, "no such gemv row");
  return {"cuda-cores config " + std::to_string(ConfigId),
          jax_swiglu::kConfigs[ConfigId].tile_m,
          &jax_swiglu::LaunchGemv<ConfigId, BF16, Activation::Silu>};
}

std::vector<Form> Forms() {
  return {CudaCores<GemvRow(0)>(), CudaCores<GemvRow(1)>(), CudaCores<GemvRow(2)>(),
          CudaCores<GemvRow(3)>(),
          TensorCores<128, 2, 128, false>(), TensorCores<128, 2, 256, false>(),
          TensorCores<128, 2, 128, true>(), TensorCores<128, 2, 256, true>(),
          TensorCores<128, 3, 256, false>(), TensorCores<128, 4, 256, false>(),
          TensorCores<128, 3, 128, false>(),
          TensorCores<256, 2, 128, false>(), TensorCores<256, 2, 256, false>(),
          TensorCores<256, 3, 256, false>(),
#ifdef GEMV_PROBE_MMA
          Mma<1, 2, 2, 1>(), Mma<1, 2, 2, 2>(), Mma<1, 2, 4, 1>(), Mma<1, 4, 2, 1>(),
          Mma<1, 1, 4, 2>(), Mma<2, 2, 2, 1>(), Mma<2, 2, 1, 2>(), Mma<4, 1, 1, 2>(),
          Mma<4, 2, 1, 1>(),
#endif
          StreamOnly<2, 2, 2>(), StreamOnly<4, 2, 1>()};
}

#define CHECK_CUBLAS(call)                                                     \
  do {                                                                         \
    cublasStatus_t st_ = (call);                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::fprintf(stderr, "%s:%d cuBLAS error %d\n", __FILE__, __LINE__, st_); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

float Bf16(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The packed column of gate (or up) output column n (jax_swiglu/_layout.py).
int64_t PackedColumn(int64_t n, bool up) {
  const int64_t block = n / 32, c = n % 32;
  const int64_t q = c / 8, j = (c % 8) / 2, e = c % 2;
  return 64 * block + (up ? 32 : 0) + 8 * j + 2 * q + e;
}

constexpr int kReps = 20;
constexpr int kRounds = 7;
constexpr int kMaxTokens = 32;

struct Buffers {
  int k, n, n_packed;
  RotatingInputs inputs;
  uint16_t* out = nullptr;
  Buffers(int k_, int n_)
      : k(k_), n(n_), n_packed((n_ + 31) / 32 * 32), inputs(kMaxTokens, k_, 2 * n_packed) {
    // The product's [M, N], or a stream-only form's word per thread (64-column CTAs, 8 splits).
    CHECK_CUDA(cudaMalloc(&out, std::max(size_t(kMaxTokens) * 2 * n_packed * sizeof(uint16_t),
                                         size_t(2 * n_packed) / 64 * 8 * 256 * sizeof(uint32_t))));
  }
  ~Buffers() { CHECK_CUDA(cudaFree(out)); }
  SwigluProblem Problem(int set, int m, int splits) const {
    SwigluProblem p{};
    p.x = inputs.xs[set];
    p.packed = inputs.ws[set];
    p.out = out;
    p.m = m;
    p.n = n;
    p.n_packed = n_packed;
    p.k = k;
    p.splits = splits;
    return p;
  }
};

// Per-launch microseconds of `body(set)` over the rotating sets, as a replayed graph.
template <class Body>
double TimeGraph(const Buffers& b, cudaStream_t stream, Body body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < kReps; ++r) body(r % b.inputs.sets);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> times;
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  for (int round = 0; round < kRounds; ++round) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1e3 * ms / kReps);
  }
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return Median(times);
}

// The largest error of `form` against an fp32 reference, relative to the output's scale,
// over every M and split, on a K x N problem (set 0).
double CheckForm(const Form& form, int k, int n, const DeviceFacts& facts, cudaStream_t stream) {
  Buffers b(k, n);
  const size_t wcount = size_t(k) * 2 * b.n_packed;
  std::vector<uint16_t> w(wcount), x(size_t(kMaxTokens) * k), out(size_t(kMaxTokens) * n);
  CHECK_CUDA(cudaMemcpy(w.data(), b.inputs.ws[0], wcount * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(x.data(), b.inputs.xs[0], x.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> ref(size_t(kMaxTokens) * n);
  double scale = 0;
  for (int t = 0; t < kMaxTokens; ++t)
    for (int c = 0; c < n; ++c) {
      double g = 0, u = 0;
      const int64_t gc = PackedColumn(c, false), uc = PackedColumn(c, true);
      for (int r = 0; r < k; ++r) {
        const double xv = Bf16(x[size_t(t) * k + r]);
        g += xv * Bf16(w[size_t(r) * 2 * b.n_packed + gc]);
        u += xv * Bf16(w[size_t(r) * 2 * b.n_packed + uc]);
      }
      ref[size_t(t) * n + c] = float(g / (1 + std::exp(-g)) * u);
      scale = std::max(scale, std::fabs(double(ref[size_t(t) * n + c])));
    }
  double worst = 0;
  for (int m = 1; m <= form.max_m; ++m)
    for (int splits : {1, 2, 4, 8}) {
      CHECK_CUDA(cudaMemset(b.out, 0xff, size_t(kMaxTokens) * n * 2));
      std::string err = form.launch(b.Problem(0, m, splits), facts, stream);
      if (!err.empty()) continue;
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaMemcpy(out.data(), b.out, size_t(m) * n * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < size_t(m) * n; ++i) {
        const double e = std::fabs(double(Bf16(out[i])) - ref[i]) / scale;
        worst = std::max(worst, std::isnan(e) ? 1e9 : e);
      }
    }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s OUT.json M,M,... KxN [KxN ...]\n", argv[0]);
    return 2;
  }
  std::vector<int> ms;
  for (char* tok = std::strtok(argv[2], ","); tok; tok = std::strtok(nullptr, ","))
    ms.push_back(std::atoi(tok));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  DeviceFacts facts{0, prop.multiProcessorCount, prop.major, prop.minor};
  // As in the extension: JAX_SWIGLU_PDL=0 launches without programmatic dependent launch, so
  // a graph's launch starts only when the previous one has finished.
  const char* pdl = std::getenv("JAX_SWIGLU_PDL");
  facts.programmatic_launch = pdl == nullptr || std::strcmp(pdl, "0") != 0;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  void* cublas_workspace;
  CHECK_CUDA(cudaMalloc(&cublas_workspace, 32 << 20));
  CHECK_CUBLAS(cublasSetWorkspace(handle, cublas_workspace, 32 << 20));
  const std::vector<Form> forms = Forms();

  std::printf("# gemv probe on %s (%d SMs), programmatic dependent launch %s\n\n", prop.name,
              prop.multiProcessorCount, facts.programmatic_launch ? "on" : "off");
  std::printf("## check (max |error| / max |ref|, every M and split)\n\n");
  for (const Form& f : forms) {
    if (!f.checked) continue;
    const double a = CheckForm(f, 1032, 1000, facts, stream);
    const double c = CheckForm(f, 896, 480, facts, stream);
    const bool failed = a > 1e-2 || c > 1e-2;
    std::printf("- %s: %.2e, %.2e%s\n", f.name.c_str(), a, c, failed ? "  FAILED" : "");
  }
  FILE* json = std::fopen(argv[1], "w");
  std::fprintf(json, "{\"gpu\": \"%s\", \"rows\": [\n", prop.name);
  bool first_row = true;
  std::printf("\n## times (us per launch; best split in brackets; TB/s of the packed weights)\n\n");
  for (int a = 3; a < argc; ++a) {
    int k = 0, n = 0;
    std::sscanf(argv[a], "%dx%d", &k, &n);
    Buffers b(k, n);
    const double mb = double(k) * 2 * b.n_packed * 2 / 1e6;
    for (int m : ms) {
      const float alpha = 1, beta = 0;
      const double cublas = TimeGraph(b, stream, [&](int s) {
        CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2 * b.n_packed, m, k, &alpha,
                                  b.inputs.ws[s], CUDA_R_16BF, 2 * b.n_packed, b.inputs.xs[s],
                                  CUDA_R_16BF, k, &beta, b.out, CUDA_R_16BF, 2 * b.n_packed,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      std::printf("%dx%d (%.0f MB) M=%d: cublas %.1f (%.2f TB/s)", k, n, mb, m, cublas,
                  mb / cublas);
      std::fprintf(json, "%s{\"k\": %d, \"n\": %d, \"m\": %d, \"cublas_us\": %.3f, \"forms\": {",
                   first_row ? "" : ",\n", k, n, m, cublas);
      first_row = false;
      bool first_form = true;
      for (const Form& f : forms) {
        if (m > f.max_m) continue;
        double best = 1e30;
        int best_split = 0;
        std::fprintf(json, "%s\"%s\": {", first_form ? "" : ", ", f.name.c_str());
        first_form = false;
        bool first_split = true;
        for (int splits : {1, 2, 4, 8}) {
          if (!f.launch(b.Problem(0, m, splits), facts, stream).empty()) continue;
          const double us = TimeGraph(b, stream, [&](int s) {
            std::string err = f.launch(b.Problem(s, m, splits), facts, stream);
            if (!err.empty()) std::fprintf(stderr, "%s\n", err.c_str());
          });
          std::fprintf(json, "%s\"%d\": %.3f", first_split ? "" : ", ", splits, us);
          first_split = false;
          if (us < best) best = us, best_split = splits;
        }
        std::fprintf(json, "}");
        std::printf(" | %s %.1f [%d] %.2f", f.name.c_str(), best, best_split, mb / best);
      }
      std::fprintf(json, "}}");
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::fprintf(json, "\n]}\n");
  std::fclose(json);
  CHECK_CUDA(cudaGetLastError());
  return 0;
}
