// Where the fp8 kernels' scales sit (jax_swiglu/_quantize.py): x row m's x_scale[m], packed
// column p's w_scale[p * w_scale_stride] (stride 1: a scale per packed column; 0: one for
// all). Plain CUDA, no CuTe, so the decode kernels' units include it too.
#pragma once

#include <cutlass/cutlass.h>

namespace jax_swiglu {

// Null for the 16-bit kernels.
struct ScaleParams {
  float const* x_scale = nullptr;
  float const* w_scale = nullptr;
  int w_scale_stride = 0;
};

CUTLASS_DEVICE float TokenScale(ScaleParams const& scales, int row) {
  return __ldg(scales.x_scale + row);
}
CUTLASS_DEVICE float ColumnScale(ScaleParams const& scales, int column) {
  return __ldg(scales.w_scale + column * scales.w_scale_stride);
}

}  // namespace jax_swiglu
