// How many thread-block clusters of a size the current GPU holds at once, for a kernel that
// fills an SM (one CTA per SM: the fused kernels' case). A cluster runs inside one GPC, and a
// part's GPCs need not hold equal SM counts, so the count can be below SMs / size; the
// selection's cost model rounds its tiles by it (jax_swiglu/selection/_model.py,
// round_ctas), as the persistent kernels size their grids by the same query
// (kernels/launch_gemm.cuh, MaxActiveClusters).
#include <cuda_runtime_api.h>

#include "launch.h"

namespace jax_swiglu {
namespace {

__global__ void FillsAnSm() {
  extern __shared__ char shared[];
  if (threadIdx.x == 0) shared[0] = 0;
}

}  // namespace

int ClusterSlots(int cluster_size) {
  int device = 0, sms = 0, shared_bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&shared_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncSetAttribute(FillsAnSm, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           shared_bytes) != cudaSuccess ||
      cudaFuncSetAttribute(FillsAnSm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster_size * sms), 1, 1);
  config.blockDim = dim3(384, 1, 1);  // the fused kernels' warp specialization
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, FillsAnSm, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the model falls back to SMs / size
    return 0;
  }
  return clusters;
}

}  // namespace jax_swiglu
