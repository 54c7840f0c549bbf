// GPU timing of kernel launches by CUDA-graph replay (timing.h says why).
#include "timing.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace jax_swiglu {
namespace {

std::string Check(cudaError_t err, const char* what) {
  return err == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(err);
}

// Owns the stream, graph, executable graph and events of one timing, whatever happens.
struct TimingResources {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~TimingResources() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

std::string TimeGraphReplays(const std::function<std::string(int, cudaStream_t)>& launch,
                             int calls, int samples, void* poison, size_t poison_bytes,
                             std::vector<double>* microseconds) {
  if (calls < 1 || samples < 1) return "calls and samples must be at least 1";
  TimingResources r;
  std::string err = Check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking),
                          "cudaStreamCreate");
  if (err.empty()) err = Check(cudaEventCreate(&r.start), "cudaEventCreate");
  if (err.empty()) err = Check(cudaEventCreate(&r.stop), "cudaEventCreate");
  if (!err.empty()) return err;

  if (poison_bytes > 0) {
    err = Check(cudaMemsetAsync(poison, 0xFF, poison_bytes, r.stream), "cudaMemsetAsync");
    if (!err.empty()) return err;
  }
  // One launch outside the graph first: the launchers' one-time host work (shared-memory
  // limits, occupancy queries) must not happen during capture.
  if (err = launch(0, r.stream); !err.empty()) return err;
  if (err = Check(cudaStreamSynchronize(r.stream), "first launch"); !err.empty()) return err;

  if (err = Check(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal),
                  "cudaStreamBeginCapture");
      !err.empty()) {
    return err;
  }
  std::string launch_error;
  for (int i = 0; i < calls && launch_error.empty(); ++i) launch_error = launch(i, r.stream);
  err = Check(cudaStreamEndCapture(r.stream, &r.graph), "cudaStreamEndCapture");
  if (!launch_error.empty()) return launch_error;
  if (!err.empty()) return err;
  if (err = Check(cudaGraphInstantiate(&r.exec, r.graph, 0), "cudaGraphInstantiate");
      !err.empty()) {
    return err;
  }

  // A warm-up replay, then the timed ones.
  if (err = Check(cudaGraphLaunch(r.exec, r.stream), "cudaGraphLaunch"); !err.empty()) return err;
  microseconds->clear();
  for (int s = 0; s < samples; ++s) {
    err = Check(cudaEventRecord(r.start, r.stream), "cudaEventRecord");
    if (err.empty()) err = Check(cudaGraphLaunch(r.exec, r.stream), "cudaGraphLaunch");
    if (err.empty()) err = Check(cudaEventRecord(r.stop, r.stream), "cudaEventRecord");
    if (err.empty()) err = Check(cudaEventSynchronize(r.stop), "cudaEventSynchronize");
    float ms = 0;
    if (err.empty()) err = Check(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime");
    if (!err.empty()) return err;
    microseconds->push_back(1e3 * ms / calls);
  }
  return {};
}

}  // namespace jax_swiglu
