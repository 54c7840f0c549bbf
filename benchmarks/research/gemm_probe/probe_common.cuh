// What the probe programs (probe.cu, trace.cu) share: error checks, the Qwen2.5 MLP shapes
// (or GEMM_PROBE_SHAPES),
// and random bf16 inputs rotated through more than the L2 (RotatingInputs). Included by one
// translation unit per program.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(err_));                                         \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr size_t kRotationBytes = size_t(192) << 20;  // > 3 x the 60 MB L2

struct Model {
  const char* name;
  int hidden, intermediate;
};
constexpr Model kModels[] = {{"qwen2.5-0.5b", 896, 4864},   {"qwen2.5-1.5b", 1536, 8960},
                             {"qwen2.5-3b", 2048, 11008},   {"qwen2.5-7b", 3584, 18944},
                             {"qwen2.5-14b", 5120, 13824},  {"qwen2.5-32b", 5120, 27648},
                             {"qwen2.5-72b", 8192, 29568}};

// Uniform in [-1, 1) from a hash of the index, as bf16 bits.
__global__ void FillRandom(uint16_t* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    const float value = (h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    data[i] = static_cast<uint16_t>(__float_as_uint(value) >> 16);
  }
}

uint16_t* AllocRandom(size_t count, uint32_t seed) {
  uint16_t* data = nullptr;
  CHECK_CUDA(cudaMalloc(&data, count * sizeof(uint16_t)));
  FillRandom<<<1024, 256>>>(data, count, seed);
  CHECK_CUDA(cudaGetLastError());
  return data;
}

// Sets of random x [m, k] and packed weights [k, n2] (bf16) for one row: enough sets that
// cycling through them streams more than kRotationBytes (2 to 32 sets), so the weights come
// from HBM as in a real model. Freed when it goes out of scope.
struct RotatingInputs {
  std::vector<uint16_t*> xs, ws;
  int sets;
  RotatingInputs(int m, int k, int n2) {
    const size_t set_bytes = (size_t(m) * k + size_t(k) * n2) * sizeof(uint16_t);
    sets = static_cast<int>(
        std::min<size_t>(32, std::max<size_t>(2, (kRotationBytes + set_bytes - 1) / set_bytes)));
    for (int s = 0; s < sets; ++s) {
      xs.push_back(AllocRandom(size_t(m) * k, 17 + 2 * s));
      ws.push_back(AllocRandom(size_t(k) * n2, 18 + 2 * s));
    }
  }
  RotatingInputs(const RotatingInputs&) = delete;
  RotatingInputs& operator=(const RotatingInputs&) = delete;
  ~RotatingInputs() {
    for (auto* p : xs) CHECK_CUDA(cudaFree(p));
    for (auto* p : ws) CHECK_CUDA(cudaFree(p));
  }
};

// The shapes a probe runs: GEMM_PROBE_SHAPES="KxN,KxN,..." (named by it), else kModels.
std::vector<Model> ProbeShapes() {
  static std::vector<std::string> names;
  std::vector<Model> shapes;
  const char* text = std::getenv("GEMM_PROBE_SHAPES");
  if (text == nullptr || *text == '\0') return {std::begin(kModels), std::end(kModels)};
  std::string list(text);
  names.clear();
  names.reserve(list.size());  // no reallocation: the Models point into these strings
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    names.push_back(list.substr(start, end - start));
    int k = 0, n = 0;
    if (std::sscanf(names.back().c_str(), "%dx%d", &k, &n) != 2 || k <= 0 || n <= 0) {
      std::fprintf(stderr, "GEMM_PROBE_SHAPES: '%s' is not KxN\n", names.back().c_str());
      std::exit(2);
    }
    shapes.push_back({names.back().c_str(), k, n});
    start = end + 1;
  }
  return shapes;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace
