// Per-device facts (SM count, compute capability, the PDL switch), read once per device.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "launch.h"

namespace jax_swiglu {

namespace {

// JAX_SWIGLU_GROUPED_BANDS as DeviceFacts::grouped_band: unset or not a whole number, 0 (the
// rule's bands); "0", -1 (whole experts); "N", N.
int GroupedBandFromEnvironment() {
  const char* text = std::getenv("JAX_SWIGLU_GROUPED_BANDS");
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value >= (1L << 20)) return 0;
  return value == 0 ? -1 : static_cast<int>(value);
}

}  // namespace

std::string CurrentDeviceFacts(DeviceFacts* facts) {
  static std::mutex mutex;
  static std::map<int, DeviceFacts> cache;

  int device = -1;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    return std::string("cudaGetDevice failed: ") + cudaGetErrorString(err);
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(device); it != cache.end()) {
    *facts = it->second;
    return {};
  }
  DeviceFacts read{device, 0, 0, 0};
  const char* pdl = std::getenv("JAX_SWIGLU_PDL");
  read.programmatic_launch = pdl == nullptr || std::strcmp(pdl, "0") != 0;
  cudaError_t err = cudaDeviceGetAttribute(&read.sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&read.cc_major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&read.cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) {
    return std::string("cudaDeviceGetAttribute failed: ") + cudaGetErrorString(err);
  }
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) == cudaSuccess) {
    read.l2_bytes = l2;
  } else {
    (void)cudaGetLastError();  // an unknown L2 leaves the bands uncapped
  }
  read.grouped_band = GroupedBandFromEnvironment();
  cache[device] = read;
  *facts = read;
  return {};
}

}  // namespace jax_swiglu
