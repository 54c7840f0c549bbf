// GPU timing of kernel launches, for tuning (benchmarks/calibrate.py, jax_swiglu.autotune).
//
// Timing through JAX compiles a program per candidate and shape, which makes a broad tuning
// grid hours of compile time. Here the candidates' launchers run directly on buffers the
// caller already holds: `calls` launches (the caller rotates its input sets between them, so
// the weights stream from HBM) are captured in one CUDA graph, and the graph is replayed
// `samples` times between events. Each sample is the replay's time over `calls`: a launch's
// GPU time plus the small gap between graph nodes, as in an XLA command buffer. Nothing here
// runs inside a custom call.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace jax_swiglu {

// `launch(i, stream)` enqueues launch i (0 <= i < calls) and returns "" or an error message.
// Before the first launch the `poison_bytes` at `poison` are set to 0xFF (a NaN in bf16 and
// f16), so the caller can check afterwards that the launches wrote every output element.
// Fills `microseconds` with `samples` per-launch times; returns "" or an error message.
std::string TimeGraphReplays(const std::function<std::string(int, cudaStream_t)>& launch,
                             int calls, int samples, void* poison, size_t poison_bytes,
                             std::vector<double>* microseconds);

}  // namespace jax_swiglu
