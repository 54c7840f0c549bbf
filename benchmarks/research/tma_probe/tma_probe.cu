// TMA probe: can the swap-AB kernels load the packed weights with gate and up rows
// interleaved in runs of 8 (so that every thread of a wgmma holds the gate and the up
// accumulator of the same feature), and at what cost in TMA throughput?
//
// The packed layout keeps gate and up columns in runs of 32 (jax_swiglu/_layout.py). A wgmma
// thread holds rows r and r + 8 of its warp's 16 rows of A; with A = the packed weights
// (swap-AB), those two rows are one feature's gate and up only if shared memory holds the
// columns in runs of 8: g0-7, u0-7, g8-15, u8-15, ... That order is a 5-D view of the same
// [K, 2N] matrix, (8 columns, gate/up, 4 runs, K, 64-column blocks) with strides
// (1, 32, 8, 2N, 64), loaded with 16-byte inner rows instead of the plain 3-D view's
// (64 columns, K, 64-column blocks) 128-byte ones. This probe checks, on the GPU:
//   1. placement: one tile of each view, 128-byte swizzled, against where the wgmma's
//      MN-major 128B-swizzle layout expects each element (is a 16-byte inner box laid out
//      densely under the swizzle?);
//   2. throughput: every SM streaming tiles of each view through a ring of stages (alone
//      and beside a K-major x tile of 208 tokens, a mid-M stage), from an L2-resident matrix
//      and from one past the L2.
// Usage: tma_probe [out.json]; build: run.sh beside this file.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    cudaError_t error = (call);                                                           \
    if (error != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(error)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

constexpr int kTileColumns = 128;  // packed columns of a weight tile (two 64-row wgmma blocks)
constexpr int kTileK = 64;
constexpr int kTileBytes = kTileColumns * kTileK * 2;
constexpr int kTokens = 208;  // the x tile beside it (a mid-M swap-AB stage)
constexpr int kXBytes = kTokens * kTileK * 2;

enum class View { Plain, RunsOf8 };

const char* Name(View view) {
  return view == View::Plain ? "plain-3d-128B-rows" : "runs-of-8-5d-16B-rows";
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled Encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                              cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "no cuTensorMapEncodeTiled\n");
    std::exit(1);
  }
  return reinterpret_cast<EncodeTiled>(fn);
}

// The weights [K, packed] (packed contiguous) as one of the two views; box = one tile.
CUtensorMap WeightsMap(View view, void* weights, int64_t k, int64_t packed) {
  CUtensorMap map;
  CUresult result;
  const int64_t row = packed * 2;  // bytes
  if (view == View::Plain) {
    cuuint64_t dims[3] = {64, cuuint64_t(k), cuuint64_t(packed / 64)};
    cuuint64_t strides[2] = {cuuint64_t(row), 128};
    cuuint32_t box[3] = {64, kTileK, kTileColumns / 64};
    cuuint32_t unit[3] = {1, 1, 1};
    result = Encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, weights, dims, strides, box,
                       unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    cuuint64_t dims[5] = {8, 2, 4, cuuint64_t(k), cuuint64_t(packed / 64)};
    cuuint64_t strides[4] = {64, 16, cuuint64_t(row), 128};
    cuuint32_t box[5] = {8, 2, 4, kTileK, kTileColumns / 64};
    cuuint32_t unit[5] = {1, 1, 1, 1, 1};
    result = Encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, weights, dims, strides, box,
                       unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "encode %s failed: %d\n", Name(view), int(result));
    std::exit(1);
  }
  return map;
}

// x [tokens, K] (K contiguous), box = 64 k x kTokens tokens, 128B swizzle.
CUtensorMap XMap(void* x, int64_t tokens, int64_t k) {
  CUtensorMap map;
  cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(tokens)};
  cuuint64_t strides[1] = {cuuint64_t(k * 2)};
  cuuint32_t box[2] = {kTileK, kTokens};
  cuuint32_t unit[2] = {1, 1};
  CUresult result =
      Encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, x, dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "encode x failed: %d\n", int(result));
    std::exit(1);
  }
  return map;
}

__device__ void LoadWeightsTile(View view, const CUtensorMap* map, uint64_t* barrier, void* smem,
                                int column_block, int k_block) {
  if (view == View::Plain) {
    cute::SM90_TMA_LOAD_3D::copy(map, barrier, 0, smem, 0, k_block * kTileK,
                                 column_block * (kTileColumns / 64));
  } else {
    cute::SM90_TMA_LOAD_5D::copy(map, barrier, 0, smem, 0, 0, 0, k_block * kTileK,
                                 column_block * (kTileColumns / 64));
  }
}

// One tile at (column_block, k_block), its shared-memory bytes copied out.
__global__ void PlacementKernel(const __grid_constant__ CUtensorMap map, View view,
                                int column_block, int k_block, uint8_t* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t barrier;
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&barrier, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&barrier, kTileBytes);
    LoadWeightsTile(view, &map, &barrier, smem, column_block, k_block);
  }
  cutlass::arch::ClusterTransactionBarrier::wait(&barrier, 0);
  for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) out[i] = smem[i];
}

// Every CTA streams `iterations` stages (a weights tile, and an x tile with with_x) through
// `stages` buffers, one thread issuing, as a mainloop's producer with consumers that never
// hold a stage.
__global__ void StreamKernel(const __grid_constant__ CUtensorMap weights,
                             const __grid_constant__ CUtensorMap x, View view, bool with_x,
                             int stages, int iterations, int column_blocks, int k_blocks,
                             int token_tiles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t barriers[16];
  const int stage_bytes = kTileBytes + (with_x ? kXBytes : 0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&barriers[s], 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int i = 0; i < iterations; ++i) {
    const int s = i % stages;
    if (i >= stages) {
      cutlass::arch::ClusterTransactionBarrier::wait(&barriers[s], ((i / stages) - 1) & 1);
    }
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&barriers[s], stage_bytes);
    const int tile = (blockIdx.x + i * gridDim.x) % (column_blocks * k_blocks);
    uint8_t* buffer = smem + s * stage_bytes;
    LoadWeightsTile(view, &weights, &barriers[s], buffer, tile / k_blocks, tile % k_blocks);
    if (with_x) {
      cute::SM90_TMA_LOAD_2D::copy(&x, &barriers[s], 0, buffer + kTileBytes,
                                   (tile % k_blocks) * kTileK,
                                   ((blockIdx.x + i) % token_tiles) * kTokens);
    }
  }
  for (int i = iterations; i < iterations + stages; ++i) {
    const int s = i % stages;
    if (i >= stages) {
      cutlass::arch::ClusterTransactionBarrier::wait(&barriers[s], ((i / stages) - 1) & 1);
    }
  }
}

uint16_t Bits(int column, int k) { return uint16_t((k * 131 + column * 7) & 0xFFFF) | 1u; }

// Where the wgmma's MN-major 128B-swizzled layout wants element (tile row r, k) of a tile:
// 64-row blocks of 64 x 64 elements, each k a 128-byte row, 16-byte chunks XORed by k % 8.
int SwizzledOffset(int row, int k) {
  const int linear = ((row / 64) * kTileK * 64 + k * 64 + row % 64) * 2;
  return linear ^ (((linear >> 7) & 7) << 4);
}

// The packed column that tile row `row` holds in a view.
int ColumnOf(View view, int row) {
  if (view == View::Plain) return row;
  const int block = row / 64, in_block = row % 64;
  const int run = in_block / 16, half = (in_block / 8) % 2, lane = in_block % 8;
  return block * 64 + half * 32 + run * 8 + lane;
}

bool CheckPlacement(View view, void* weights, int64_t k, int64_t packed,
                    const std::vector<uint16_t>& host) {
  CUtensorMap map = WeightsMap(view, weights, k, packed);
  uint8_t* out;
  CHECK_CUDA(cudaMalloc(&out, kTileBytes));
  CHECK_CUDA(cudaFuncSetAttribute(PlacementKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kTileBytes));
  const int column_block = 1, k_block = 1;
  PlacementKernel<<<1, 128, kTileBytes>>>(map, view, column_block, k_block, out);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> tile(kTileBytes / 2);
  CHECK_CUDA(cudaMemcpy(tile.data(), out, kTileBytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(out));
  int wrong = 0;
  for (int row = 0; row < kTileColumns; ++row) {
    for (int kk = 0; kk < kTileK; ++kk) {
      const int column = column_block * kTileColumns + ColumnOf(view, row);
      const int gk = k_block * kTileK + kk;
      const uint16_t expected = host[size_t(gk) * packed + column];
      if (tile[SwizzledOffset(row, kk) / 2] != expected && wrong++ < 4) {
        std::printf("  %s: row %d k %d holds %04x, expected %04x (column %d)\n", Name(view),
                    row, kk, tile[SwizzledOffset(row, kk) / 2], expected, column);
      }
    }
  }
  std::printf("placement %s: %d of %d elements misplaced\n", Name(view), wrong,
              kTileColumns * kTileK);
  return wrong == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* out_path = argc > 1 ? argv[1] : "tma_probe.json";
  int device = 0, sms = 0, clock_khz = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

  // Small: 1024 x 8192 (16 MB, in L2); large: 4096 x 28672 (235 MB, past it).
  struct Matrix { int64_t k, packed; const char* where; };
  const Matrix matrices[2] = {{1024, 8192, "L2-resident"}, {4096, 28672, "past-L2"}};
  const int64_t tokens = 2048, x_k = 4096;
  void* x;
  CHECK_CUDA(cudaMalloc(&x, tokens * x_k * 2));
  CHECK_CUDA(cudaMemset(x, 0, tokens * x_k * 2));
  std::string json = "{\"gpu\": \"" + std::string(prop.name) + "\", \"sms\": " +
                     std::to_string(sms) + ", \"runs\": [";
  bool first = true, placed = true;
  for (const Matrix& matrix : matrices) {
    std::vector<uint16_t> host(size_t(matrix.k) * matrix.packed);
    for (int64_t kk = 0; kk < matrix.k; ++kk) {
      for (int64_t c = 0; c < matrix.packed; ++c) {
        host[kk * matrix.packed + c] = Bits(int(c), int(kk));
      }
    }
    void* weights;
    CHECK_CUDA(cudaMalloc(&weights, host.size() * 2));
    CHECK_CUDA(cudaMemcpy(weights, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    if (&matrix == &matrices[0]) {
      placed = CheckPlacement(View::Plain, weights, matrix.k, matrix.packed, host) && placed;
      placed = CheckPlacement(View::RunsOf8, weights, matrix.k, matrix.packed, host) && placed;
    }
    CUtensorMap x_map = XMap(x, tokens, x_k);
    for (bool with_x : {false, true}) {
      for (View view : {View::Plain, View::RunsOf8}) {
        const int stage_bytes = kTileBytes + (with_x ? kXBytes : 0);
        const int stages = std::min(16, (200 * 1024) / stage_bytes);
        CHECK_CUDA(cudaFuncSetAttribute(StreamKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        stages * stage_bytes));
        CUtensorMap map = WeightsMap(view, weights, matrix.k, matrix.packed);
        const int column_blocks = int(matrix.packed / kTileColumns);
        const int k_blocks = int(matrix.k / kTileK);
        const int iterations = 4000;
        cudaEvent_t start, stop;
        CHECK_CUDA(cudaEventCreate(&start));
        CHECK_CUDA(cudaEventCreate(&stop));
        float best_ms = 1e30f;
        for (int rep = 0; rep < 6; ++rep) {
          CHECK_CUDA(cudaEventRecord(start));
          StreamKernel<<<sms, 32, stages * stage_bytes>>>(map, x_map, view, with_x, stages,
                                                          iterations, column_blocks, k_blocks,
                                                          int(tokens / kTokens));
          CHECK_CUDA(cudaEventRecord(stop));
          CHECK_CUDA(cudaEventSynchronize(stop));
          float ms;
          CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
          if (rep > 0 && ms < best_ms) best_ms = ms;
        }
        CHECK_CUDA(cudaGetLastError());
        const double bytes = double(sms) * iterations * stage_bytes;
        const double per_sm_clock = bytes / sms / (best_ms * 1e-3 * clock_khz * 1e3);
        const double weight_tiles_per_us = double(sms) * iterations / (best_ms * 1e3);
        std::printf("%-12s %-24s %-7s stages %2d: %8.3f ms, %7.1f GB/s, %5.1f B/clk/SM, "
                    "%6.1f weight tiles/us\n", matrix.where, Name(view), with_x ? "+x" : "alone",
                    stages, best_ms, bytes / (best_ms * 1e6), per_sm_clock, weight_tiles_per_us);
        json += std::string(first ? "" : ", ") + "{\"matrix\": \"" + matrix.where +
                "\", \"view\": \"" + Name(view) + "\", \"with_x\": " + (with_x ? "true" : "false") +
                ", \"stages\": " + std::to_string(stages) + ", \"ms\": " + std::to_string(best_ms) +
                ", \"bytes_per_clock_per_sm\": " + std::to_string(per_sm_clock) + "}";
        first = false;
        CHECK_CUDA(cudaEventDestroy(start));
        CHECK_CUDA(cudaEventDestroy(stop));
      }
    }
    CHECK_CUDA(cudaFree(weights));
  }
  json += std::string("], \"placement_ok\": ") + (placed ? "true" : "false") + "}\n";
  FILE* f = std::fopen(out_path, "w");
  if (f) {
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return placed ? 0 : 2;
}
