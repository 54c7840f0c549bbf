// How many thread-block clusters of each size an SM90 GPU holds at once, for a kernel that
// fills an SM (one CTA per SM: the fused kernels' case). The SMs sit in GPCs, and a cluster
// must fit inside one GPC, so the count can be less than SMs / cluster size; the cost model's
// rounds of tiles use it (jax_swiglu/selection/_model.py).
//
//   nvcc -arch=sm_90a -o cluster_slots benchmarks/research/cluster_slots.cu && ./cluster_slots
#include <cstdio>

#include <cuda_runtime.h>

__global__ void FillsAnSm() {
  extern __shared__ char shared[];
  shared[threadIdx.x] = 0;
}

int main() {
  int device = 0, sms = 0, smem = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaFuncSetAttribute(FillsAnSm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(FillsAnSm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("{\"sm_count\": %d, \"cluster_slots\": {", sms);
  for (int size = 1; size <= 16; size *= 2) {
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = size;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(size * sms, 1, 1);
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, FillsAnSm, &config);
    std::printf("%s\"%d\": %d", size > 1 ? ", " : "", size, err == cudaSuccess ? clusters : -1);
  }
  std::printf("}}\n");
  return 0;
}
