// The per-row e4m3 quantization of 16-bit tokens (quantize_rows.cuh), for both dtypes.
#include "quantize_rows.cuh"

namespace jax_swiglu {

template std::string LaunchQuantizeRows<BF16>(const void*, int64_t, int64_t, void*, float*,
                                              const DeviceFacts&, cudaStream_t);
template std::string LaunchQuantizeRows<F16>(const void*, int64_t, int64_t, void*, float*,
                                             const DeviceFacts&, cudaStream_t);

}  // namespace jax_swiglu
