// Per-device facts (SM count, compute capability, the PDL switch), read once per device.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "launch.h"

namespace jax_swiglu {

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
  cache[device] = read;
  *facts = read;
  return {};
}

}  // namespace jax_swiglu
