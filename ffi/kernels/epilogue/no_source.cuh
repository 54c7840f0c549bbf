// What CUTLASS's SM90 warp-specialized kernels ask of an epilogue that loads no source tensor
// (no C): empty load and store pipelines, no workspace, no producer load. Both SwiGLU
// epilogues derive from it, so each says only how it pairs and stores.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include <cstddef>
#include <cstdint>

namespace jax_swiglu {

// What the assemblies pass both SwiGLU epilogues (kernels/launch_gemm.cuh, GemmArguments).
template <class ElementD>
struct SwiGluArguments {
  ElementD* ptr_d;  // [M, n] row-major
  int n;            // output columns
  // The fp8 kernels only: x_scale[M], and w_scale[packed column * w_scale_stride] (launch.h).
  float const* x_scale = nullptr;
  float const* w_scale = nullptr;
  int w_scale_stride = 0;
};

template <class ElementD_>
struct EpilogueWithoutSource {
  using ElementD = ElementD_;
  using ElementC = void;  // no source tensor
  using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideD = cute::Stride<int64_t, cute::_1, int64_t>;

  // The kernel instantiates load/store pipelines from these; nothing is loaded and a TMA
  // store is tracked with bulk-async groups, so they are the empty ones.
  using LoadPipeline = cutlass::PipelineTransactionAsync<0>;
  using LoadPipelineState = cutlass::PipelineState<0>;
  using StorePipeline = cutlass::PipelineTmaStore<0>;
  using StorePipelineState = cutlass::PipelineState<0>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  static constexpr bool RequiresTransactionBytes = false;

  using Arguments = SwiGluArguments<ElementD>;

  // Whether the output [M, n] fits a GEMM of `packed_n` packed columns: 16-byte rows and base
  // (TMA and the 16-byte stores need them), n within the packed width.
  static bool OutputFits(int packed_n, Arguments const& args) {
    constexpr int kAlign = 16 / sizeof(ElementD);
    return args.n > 0 && args.n % kAlign == 0 && 2 * args.n <= packed_n &&
           reinterpret_cast<uintptr_t>(args.ptr_d) % 16 == 0;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_load_pipe_increment(CtaTileMNK) {
    return 1;
  }
  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_store_pipe_increment(CtaTileMNK) {
    return 1;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }

  template <class... Ts>
  CUTLASS_DEVICE LoadPipelineState load(LoadPipeline, LoadPipelineState state, Ts&&...) {
    return state;
  }
  CUTLASS_DEVICE LoadPipelineState load_tail(LoadPipeline, LoadPipelineState state) {
    return state;
  }
};

}  // namespace jax_swiglu
