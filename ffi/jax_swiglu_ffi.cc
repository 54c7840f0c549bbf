// XLA FFI handlers for the fused gated-MLP kernels and the nanobind module that hands them
// to Python (jax_swiglu/_native.py registers every capsule in `registrations()`). One
// target per (kernel family, operands, activation, dtype); its name says all four, and its
// `config` attribute is a row of the one table (kernel_configs.h).
//
// Handlers are typed, take the stream from PlatformStream<cudaStream_t>, validate
// everything they are given (the row's CannotRun, can_implement.h, which Python asks too),
// and report problems as ffi::Error values: they never throw, abort, synchronize or
// allocate, so they are safe inside XLA's command buffers.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "can_implement.h"
#include "dispatch.h"
#include "kernel_configs.h"
#include "launch.h"
#include "timing.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jax_swiglu {
namespace {

template <ffi::DataType T>
using ElementTagFor = std::conditional_t<T == ffi::DataType::BF16, BF16, F16>;

// Runtime row id -> `launch(std::integral_constant<int, id>)` for a row of `kFamily` on
// `kOperands` that this build compiled (an instantiation exists only for those), or why not.
template <Family kFamily, Operands kOperands, int Id = 0, class Launch>
std::string WithRow(int64_t config, Launch&& launch) {
  if constexpr (Id == kConfigCount) {
    return "unknown kernel config " + std::to_string(config) + " (the table has rows 0.." +
           std::to_string(kConfigCount - 1) + ")";
  } else {
    if (config == Id) {
      constexpr KernelConfig row = kConfigs[Id];
      if constexpr (row.family == kFamily && row.operands == kOperands && row.compiled()) {
        return launch(std::integral_constant<int, Id>{});
      } else if constexpr (row.family == kFamily && row.operands == kOperands) {
        return RowName(row) + " is not compiled in this build (install with "
               "JAX_SWIGLU_ALL_CONFIGS=1)";
      } else {
        return RowName(row) + " is not a row of this target's kernel (" +
               FamilyName(kFamily) +
               (kOperands == Operands::Fp8E4m3 ? ", e4m3" : ", 16-bit") + " operands)";
      }
    }
    return WithRow<kFamily, kOperands, Id + 1>(config, launch);
  }
}

// A call of `f(std::integral_constant<Activation, a>)` for the activation named `name`
// (kernel_configs.h's names), or an error message.
template <class F>
std::string WithActivation(const std::string& name, F&& f) {
#define JAX_SWIGLU_ACTIVATION_CASE(activation, activation_name)                      \
  if (name == activation_name) {                                                     \
    return f(std::integral_constant<Activation, Activation::activation>{});          \
  }
  JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_ACTIVATION_CASE)
#undef JAX_SWIGLU_ACTIVATION_CASE
  return "unknown activation " + name;
}

// A call of `f(element tag)` for the dtype named `dtype`, or an error message.
template <class F>
std::string WithElement(const std::string& dtype, F&& f) {
  if (dtype == "bfloat16") return f(BF16{});
  if (dtype == "float16") return f(F16{});
  return "unknown dtype " + dtype + " (bfloat16 or float16)";
}

template <class Dimensions>
std::string Dims(Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The shapes every kernel takes: x [M, K], the packed weights [K, 2 * n_packed] (or K-major,
// [2 * n_packed, K], for e4m3 operands) and out [M, N], with N in the last gate/up block.
template <class X, class Packed, class Out>
std::string DescribeProblem(const X& x, const Packed& packed, const Out& out, bool k_major,
                            SwigluProblem* problem) {
  auto xd = x.dimensions(), wd = packed.dimensions(), od = out.dimensions();
  const char* layout = k_major ? "[2N', K]" : "[K, 2N']";
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2) {
    return std::string("expected x [M, K], packed ") + layout + ", out [M, N]; got " +
           Dims(xd) + ", " + Dims(wd) + ", " + Dims(od);
  }
  const int64_t packed_k = k_major ? wd[1] : wd[0];
  const int64_t packed_columns = k_major ? wd[0] : wd[1];
  SwigluProblem& p = *problem;
  p = SwigluProblem{x.untyped_data(), packed.untyped_data(), out.untyped_data(),
                    xd[0], od[1], packed_columns / 2, xd[1], /*swizzle=*/1, /*raster=*/0};
  if (packed_k != p.k || od[0] != p.m || packed_columns % (2 * kGateUpBlock) != 0 ||
      p.n > p.n_packed || p.n <= p.n_packed - kGateUpBlock) {
    return "inconsistent shapes x " + Dims(xd) + ", packed " + Dims(wd) + ", out " + Dims(od);
  }
  return {};
}

// An int64 attribute as the int field it sets, or why it does not fit.
std::string SetInt(int64_t value, const char* name, int* field) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return std::string(name) + " is out of range: " + std::to_string(value);
  }
  *field = static_cast<int>(value);
  return {};
}

// The current device, which must be an SM90 GPU.
ffi::Error CheckDevice(DeviceFacts* device) {
  if (std::string err = CurrentDeviceFacts(device); !err.empty()) {
    return ffi::Error::Internal("jax_swiglu: " + err);
  }
  const DeviceFacts& facts = *device;
  if (facts.cc_major != 9 || facts.cc_minor != 0) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jax_swiglu: the fused kernels need an SM90 (Hopper) GPU; device " +
                          std::to_string(facts.device) + " is sm_" +
                          std::to_string(facts.cc_major) + std::to_string(facts.cc_minor));
  }
  return ffi::Error::Success();
}

// What both handlers do once the operands are described: the launch attributes and the
// workspace into `problem`, then the launch on the current (SM90) device.
template <Family kFamily, Operands kOperands, Activation kActivation, ffi::DataType T>
ffi::Error Run(cudaStream_t stream, SwigluProblem problem,
               std::optional<ffi::Result<ffi::AnyBuffer>>& workspace, int64_t config,
               int64_t swizzle, int64_t raster, int64_t splits, int64_t promotion) {
  std::string err = SetInt(swizzle, "swizzle", &problem.swizzle);
  if (err.empty()) err = SetInt(raster, "raster", &problem.raster);
  if (err.empty()) err = SetInt(splits, "splits", &problem.splits);
  if (err.empty()) err = SetInt(promotion, "promotion", &problem.fp8_promotion);
  if (!err.empty()) return ffi::Error::InvalidArgument("jax_swiglu: " + err);
  if (workspace.has_value()) {
    problem.workspace = (*workspace)->untyped_data();
    problem.workspace_bytes = (*workspace)->size_bytes();
  }
  if (problem.m == 0) return ffi::Error::Success();  // nothing to write
  DeviceFacts device;
  if (ffi::Error e = CheckDevice(&device); e.failure()) return e;
  err = WithRow<kFamily, kOperands>(config, [&](auto id) {
    return LaunchRow<decltype(id)::value, ElementTagFor<T>, kActivation>(problem, device, stream);
  });
  if (!err.empty()) return ffi::Error::Internal("jax_swiglu: " + err);
  return ffi::Error::Success();
}

// 16-bit operands: x [M, K] and packed [K, 2 * n_packed] of the output's dtype. `workspace`:
// present where the config needs one (the lowering sizes it with workspace_bytes below); the
// launcher checks that it is large enough.
template <Family kFamily, Activation kActivation, ffi::DataType T>
ffi::Error Swiglu(cudaStream_t stream, ffi::Buffer<T> x, ffi::Buffer<T> packed,
                  ffi::Result<ffi::Buffer<T>> out,
                  std::optional<ffi::Result<ffi::AnyBuffer>> workspace, int64_t config,
                  int64_t swizzle, int64_t raster, int64_t splits) {
  SwigluProblem problem;
  if (std::string err = DescribeProblem(x, packed, *out, /*k_major=*/false, &problem);
      !err.empty()) {
    return ffi::Error::InvalidArgument("jax_swiglu: " + err);
  }
  return Run<kFamily, Operands::Bits16, kActivation, T>(stream, problem, workspace, config,
                                                        swizzle, raster, splits,
                                                        /*promotion=*/4);
}

// e4m3 operands: x_q [M, K] and packed [2 * n_packed, K] (K-major), x_scale [M], w_scale
// [2 * n_packed] (a scale per packed column) or [1] / [] (one for all), out [M, N] in
// bfloat16 or float16; a row of the interleaved or the gemv family. (x and packed come as
// AnyBuffer, their element type checked here: the FFI has no native C++ type for fp8
// buffers.)
template <Family kFamily, Activation kActivation, ffi::DataType T>
ffi::Error SwigluFp8(cudaStream_t stream, ffi::AnyBuffer x,
                     ffi::Buffer<ffi::DataType::F32> x_scale, ffi::AnyBuffer packed,
                     ffi::Buffer<ffi::DataType::F32> w_scale, ffi::Result<ffi::Buffer<T>> out,
                     std::optional<ffi::Result<ffi::AnyBuffer>> workspace, int64_t config,
                     int64_t swizzle, int64_t raster, int64_t splits, int64_t promotion) {
  if (x.element_type() != ffi::DataType::F8E4M3FN ||
      packed.element_type() != ffi::DataType::F8E4M3FN) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: x and packed must be float8_e4m3fn");
  }
  SwigluProblem problem;
  if (std::string err = DescribeProblem(x, packed, *out, /*k_major=*/true, &problem);
      !err.empty()) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: " + err);
  }
  if (static_cast<int64_t>(x_scale.element_count()) != problem.m) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: x_scale " + Dims(x_scale.dimensions()) +
                                       " must hold one scale per row of x " +
                                       Dims(x.dimensions()));
  }
  const int64_t w_scales = static_cast<int64_t>(w_scale.element_count());
  if (w_scales != 1 && w_scales != 2 * problem.n_packed) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: w_scale " + Dims(w_scale.dimensions()) +
                                       " must hold one scale, or one per packed column (" +
                                       std::to_string(2 * problem.n_packed) + ")");
  }
  problem.x_scale = x_scale.typed_data();
  problem.w_scale = w_scale.typed_data();
  problem.w_scale_stride = w_scales == 1 ? 0 : 1;
  return Run<kFamily, Operands::Fp8E4m3, kActivation, T>(stream, problem, workspace, config,
                                                         swizzle, raster, splits, promotion);
}

// Grouped (mixture-of-experts) calls on 16-bit operands: x [T, K] with its rows sorted by
// expert, the experts' packed weights [E, K, 2 * n_packed], group_sizes [E] int32 (rows per
// expert, read on the device) and out [T, N]; a row of the Grouped scheduler.
template <Activation kActivation, ffi::DataType T>
ffi::Error SwigluGrouped(cudaStream_t stream, ffi::Buffer<T> x, ffi::Buffer<T> experts,
                         ffi::Buffer<ffi::DataType::S32> group_sizes,
                         ffi::Result<ffi::Buffer<T>> out, int64_t config, int64_t swizzle,
                         int64_t raster, int64_t splits) {
  auto xd = x.dimensions(), ed = experts.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || ed.size() != 3 || od.size() != 2 || ed[0] <= 0 ||
      static_cast<int64_t>(group_sizes.element_count()) != ed[0]) {
    return ffi::Error::InvalidArgument(
        "jax_swiglu grouped: expected x [T, K], experts [E, K, 2N'], group_sizes [E], out "
        "[T, N]; got " + Dims(xd) + ", " + Dims(ed) + ", " + Dims(group_sizes.dimensions()) +
        ", " + Dims(od));
  }
  SwigluProblem problem{x.untyped_data(), experts.untyped_data(), out->untyped_data(),
                        xd[0], od[1], ed[2] / 2, xd[1], /*swizzle=*/1, /*raster=*/0};
  if (ed[1] != problem.k || od[0] != problem.m || ed[2] % (2 * kGateUpBlock) != 0 ||
      problem.n > problem.n_packed || problem.n <= problem.n_packed - kGateUpBlock) {
    return ffi::Error::InvalidArgument("jax_swiglu grouped: inconsistent shapes x " + Dims(xd) +
                                       ", experts " + Dims(ed) + ", out " + Dims(od));
  }
  problem.experts = ed[0];
  problem.group_sizes = group_sizes.typed_data();
  std::optional<ffi::Result<ffi::AnyBuffer>> no_workspace;
  return Run<Family::Interleaved, Operands::Bits16, kActivation, T>(
      stream, problem, no_workspace, config, swizzle, raster, splits, /*promotion=*/4);
}

// An e4m3 call's 16-bit tokens, quantized per row before its fused kernel: x [M, K] ->
// x_q [M, K] float8_e4m3fn and x_scale [M] float32, jax_swiglu.quantize_tokens' values bit
// for bit (kernels/quantize_rows.cuh).
template <ffi::DataType T>
ffi::Error QuantizeRows(cudaStream_t stream, ffi::Buffer<T> x, ffi::Result<ffi::AnyBuffer> x_q,
                        ffi::Result<ffi::Buffer<ffi::DataType::F32>> x_scale) {
  auto xd = x.dimensions(), qd = x_q->dimensions();
  if (xd.size() != 2 || qd.size() != 2 || qd[0] != xd[0] || qd[1] != xd[1] ||
      static_cast<int64_t>(x_scale->element_count()) != xd[0]) {
    return ffi::Error::InvalidArgument(
        "jax_swiglu quantize_rows: expected x [M, K], x_q [M, K], x_scale [M]; got " +
        Dims(xd) + ", " + Dims(qd) + ", " + Dims(x_scale->dimensions()));
  }
  if (x_q->element_type() != ffi::DataType::F8E4M3FN) {
    return ffi::Error::InvalidArgument("jax_swiglu quantize_rows: x_q must be float8_e4m3fn");
  }
  if (xd[0] == 0) return ffi::Error::Success();  // nothing to write
  DeviceFacts device;
  if (ffi::Error e = CheckDevice(&device); e.failure()) return e;
  if (std::string err = LaunchQuantizeRows<ElementTagFor<T>>(
          x.untyped_data(), xd[0], xd[1], x_q->untyped_data(), x_scale->typed_data(), device,
          stream);
      !err.empty()) {
    return ffi::Error::Internal("jax_swiglu: " + err);
  }
  return ffi::Error::Success();
}

// What both projection handlers do once the operands are described: the launch on the
// current (SM90) device with gemv row `config`.
template <Operands kOperands, ffi::DataType T>
ffi::Error RunProjection(cudaStream_t stream, ProjectionProblem problem, int64_t config,
                         int64_t splits, int64_t promotion) {
  std::string err = SetInt(splits, "splits", &problem.splits);
  if (err.empty()) err = SetInt(promotion, "promotion", &problem.fp8_promotion);
  if (!err.empty()) return ffi::Error::InvalidArgument("jax_swiglu projection: " + err);
  if (problem.m == 0) return ffi::Error::Success();  // nothing to write
  DeviceFacts device;
  if (ffi::Error e = CheckDevice(&device); e.failure()) return e;
  err = WithRow<Family::Gemv, kOperands>(config, [&](auto id) {
    return LaunchGemvProjection<decltype(id)::value, ElementTagFor<T>>(problem, device, stream);
  });
  if (!err.empty()) return ffi::Error::Internal("jax_swiglu projection: " + err);
  return ffi::Error::Success();
}

// x [M, K] and w [K, N] with out [M, N] (each column of w an output column) of the
// projection's shapes, or why not.
template <class X, class W, class Out>
std::string DescribeProjection(const X& x, const W& w, const Out& out, bool k_major,
                               ProjectionProblem* problem) {
  auto xd = x.dimensions(), wd = w.dimensions(), od = out.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2 || od[0] != xd[0] ||
      (k_major ? wd[1] : wd[0]) != xd[1] || (k_major ? wd[0] : wd[1]) != od[1]) {
    return std::string("expected x [M, K], w ") + (k_major ? "[N, K]" : "[K, N]") +
           ", out [M, N]; got " + Dims(xd) + ", " + Dims(wd) + ", " + Dims(od);
  }
  *problem = ProjectionProblem{x.untyped_data(), w.untyped_data(), out.untyped_data(),
                               xd[0], od[1], xd[1]};
  return {};
}

// A plain projection on the decode form (a gated MLP's down projection at a few tokens):
// 16-bit x [M, K] and w [K, N], out [M, N], all of one dtype; a gemv row of 16-bit operands.
template <ffi::DataType T>
ffi::Error Projection(cudaStream_t stream, ffi::Buffer<T> x, ffi::Buffer<T> w,
                      ffi::Result<ffi::Buffer<T>> out, int64_t config, int64_t splits) {
  ProjectionProblem problem;
  if (std::string err = DescribeProjection(x, w, *out, /*k_major=*/false, &problem);
      !err.empty()) {
    return ffi::Error::InvalidArgument("jax_swiglu projection: " + err);
  }
  return RunProjection<Operands::Bits16, T>(stream, problem, config, splits, /*promotion=*/4);
}

// The e4m3 projection: x_q [M, K] float8_e4m3fn with x_scale [M], w K-major [N, K]
// float8_e4m3fn with w_scale [N] (one per output column) or [1] / [] (one for all), out
// [M, N] in bfloat16 or float16; a gemv row of e4m3 operands.
template <ffi::DataType T>
ffi::Error ProjectionFp8(cudaStream_t stream, ffi::AnyBuffer x,
                         ffi::Buffer<ffi::DataType::F32> x_scale, ffi::AnyBuffer w,
                         ffi::Buffer<ffi::DataType::F32> w_scale,
                         ffi::Result<ffi::Buffer<T>> out, int64_t config, int64_t splits,
                         int64_t promotion) {
  if (x.element_type() != ffi::DataType::F8E4M3FN ||
      w.element_type() != ffi::DataType::F8E4M3FN) {
    return ffi::Error::InvalidArgument(
        "jax_swiglu fp8 projection: x and w must be float8_e4m3fn");
  }
  ProjectionProblem problem;
  if (std::string err = DescribeProjection(x, w, *out, /*k_major=*/true, &problem);
      !err.empty()) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8 projection: " + err);
  }
  const int64_t w_scales = static_cast<int64_t>(w_scale.element_count());
  if (static_cast<int64_t>(x_scale.element_count()) != problem.m ||
      (w_scales != 1 && w_scales != problem.n)) {
    return ffi::Error::InvalidArgument(
        "jax_swiglu fp8 projection: x_scale " + Dims(x_scale.dimensions()) +
        " must hold one scale per row of x " + Dims(x.dimensions()) + ", w_scale " +
        Dims(w_scale.dimensions()) + " one, or one per column (" + std::to_string(problem.n) +
        ")");
  }
  problem.x_scale = x_scale.typed_data();
  problem.w_scale = w_scale.typed_data();
  problem.w_scale_stride = w_scales == 1 ? 0 : 1;
  return RunProjection<Operands::Fp8E4m3, T>(stream, problem, config, splits, promotion);
}

}  // namespace
}  // namespace jax_swiglu

#define JAX_SWIGLU_DEFINE_PROJECTION_HANDLER(symbol, dtype)                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, jax_swiglu::Projection<dtype>,                   \
                                ffi::Ffi::Bind()                                         \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()            \
                                    .Arg<ffi::Buffer<dtype>>()                           \
                                    .Arg<ffi::Buffer<dtype>>()                           \
                                    .Ret<ffi::Buffer<dtype>>()                           \
                                    .Attr<int64_t>("config")                             \
                                    .Attr<int64_t>("splits"),                            \
                                {ffi::Traits::kCmdBufferCompatible})
#define JAX_SWIGLU_DEFINE_PROJECTION_FP8_HANDLER(symbol, dtype)                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, jax_swiglu::ProjectionFp8<dtype>,                \
                                ffi::Ffi::Bind()                                         \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()            \
                                    .Arg<ffi::AnyBuffer>()                               \
                                    .Arg<ffi::Buffer<ffi::DataType::F32>>()              \
                                    .Arg<ffi::AnyBuffer>()                               \
                                    .Arg<ffi::Buffer<ffi::DataType::F32>>()              \
                                    .Ret<ffi::Buffer<dtype>>()                           \
                                    .Attr<int64_t>("config")                             \
                                    .Attr<int64_t>("splits")                             \
                                    .Attr<int64_t>("promotion"),                         \
                                {ffi::Traits::kCmdBufferCompatible})
JAX_SWIGLU_DEFINE_PROJECTION_HANDLER(JaxSwigluProjectionBf16, ffi::DataType::BF16);
JAX_SWIGLU_DEFINE_PROJECTION_HANDLER(JaxSwigluProjectionF16, ffi::DataType::F16);
JAX_SWIGLU_DEFINE_PROJECTION_FP8_HANDLER(JaxSwigluProjectionFp8Bf16, ffi::DataType::BF16);
JAX_SWIGLU_DEFINE_PROJECTION_FP8_HANDLER(JaxSwigluProjectionFp8F16, ffi::DataType::F16);
#undef JAX_SWIGLU_DEFINE_PROJECTION_HANDLER
#undef JAX_SWIGLU_DEFINE_PROJECTION_FP8_HANDLER

#define JAX_SWIGLU_DEFINE_QUANTIZE_HANDLER(symbol, dtype)                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, jax_swiglu::QuantizeRows<dtype>,                 \
                                ffi::Ffi::Bind()                                         \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()            \
                                    .Arg<ffi::Buffer<dtype>>()                           \
                                    .Ret<ffi::AnyBuffer>()                               \
                                    .Ret<ffi::Buffer<ffi::DataType::F32>>(),             \
                                {ffi::Traits::kCmdBufferCompatible})
JAX_SWIGLU_DEFINE_QUANTIZE_HANDLER(JaxSwigluQuantizeRowsBf16, ffi::DataType::BF16);
JAX_SWIGLU_DEFINE_QUANTIZE_HANDLER(JaxSwigluQuantizeRowsF16, ffi::DataType::F16);
#undef JAX_SWIGLU_DEFINE_QUANTIZE_HANDLER

#define JAX_SWIGLU_DEFINE_GROUPED_HANDLER(symbol, activation, dtype)                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      symbol, (jax_swiglu::SwigluGrouped<jax_swiglu::Activation::activation, dtype>),    \
      ffi::Ffi::Bind()                                                                   \
          .Ctx<ffi::PlatformStream<cudaStream_t>>()                                      \
          .Arg<ffi::Buffer<dtype>>()                                                     \
          .Arg<ffi::Buffer<dtype>>()                                                     \
          .Arg<ffi::Buffer<ffi::DataType::S32>>()                                        \
          .Ret<ffi::Buffer<dtype>>()                                                     \
          .Attr<int64_t>("config")                                                       \
          .Attr<int64_t>("swizzle")                                                      \
          .Attr<int64_t>("raster")                                                       \
          .Attr<int64_t>("splits"),                                                      \
      {ffi::Traits::kCmdBufferCompatible})

#define JAX_SWIGLU_DEFINE_FP8_HANDLER(symbol, family, activation, dtype)                  \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      symbol,                                                                            \
      (jax_swiglu::SwigluFp8<jax_swiglu::Family::family,                                 \
                             jax_swiglu::Activation::activation, dtype>),                \
      ffi::Ffi::Bind()                                                                   \
          .Ctx<ffi::PlatformStream<cudaStream_t>>()                                      \
          .Arg<ffi::AnyBuffer>()                                                         \
          .Arg<ffi::Buffer<ffi::DataType::F32>>()                                        \
          .Arg<ffi::AnyBuffer>()                                                         \
          .Arg<ffi::Buffer<ffi::DataType::F32>>()                                        \
          .Ret<ffi::Buffer<dtype>>()                                                     \
          .OptionalRet<ffi::AnyBuffer>()                                                 \
          .Attr<int64_t>("config")                                                       \
          .Attr<int64_t>("swizzle")                                                      \
          .Attr<int64_t>("raster")                                                       \
          .Attr<int64_t>("splits")                                                       \
          .Attr<int64_t>("promotion"),                                                   \
      {ffi::Traits::kCmdBufferCompatible})

#define JAX_SWIGLU_DEFINE_HANDLER(symbol, family, activation, dtype)                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      symbol,                                                                            \
      (jax_swiglu::Swiglu<jax_swiglu::Family::family, jax_swiglu::Activation::activation, \
                          dtype>),                                                       \
      ffi::Ffi::Bind()                                                                   \
          .Ctx<ffi::PlatformStream<cudaStream_t>>()                                      \
          .Arg<ffi::Buffer<dtype>>()                                                     \
          .Arg<ffi::Buffer<dtype>>()                                                     \
          .Ret<ffi::Buffer<dtype>>()                                                     \
          .OptionalRet<ffi::AnyBuffer>()                                                 \
          .Attr<int64_t>("config")                                                       \
          .Attr<int64_t>("swizzle")                                                      \
          .Attr<int64_t>("raster")                                                       \
          .Attr<int64_t>("splits"),                                                      \
      {ffi::Traits::kCmdBufferCompatible})

// Every handler of one activation: each 16-bit family in both dtypes, and the e4m3
// interleaved and gemv kernels with both output dtypes.
#define JAX_SWIGLU_DEFINE_HANDLERS(activation, name)                                        \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleaved##activation##Bf16, Interleaved, activation, \
                            ffi::DataType::BF16);                                          \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleaved##activation##F16, Interleaved, activation,  \
                            ffi::DataType::F16);                                           \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGateThenUp##activation##Bf16, GateThenUp, activation,   \
                            ffi::DataType::BF16);                                          \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGateThenUp##activation##F16, GateThenUp, activation,    \
                            ffi::DataType::F16);                                           \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGemv##activation##Bf16, Gemv, activation,               \
                            ffi::DataType::BF16);                                          \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGemv##activation##F16, Gemv, activation,                \
                            ffi::DataType::F16);                                           \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluFp8##activation##Bf16, Interleaved, activation,     \
                                ffi::DataType::BF16);                                      \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluFp8##activation##F16, Interleaved, activation,      \
                                ffi::DataType::F16);                                       \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluGemvFp8##activation##Bf16, Gemv, activation,        \
                                ffi::DataType::BF16);                                      \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluGemvFp8##activation##F16, Gemv, activation,         \
                                ffi::DataType::F16);                                       \
  JAX_SWIGLU_DEFINE_GROUPED_HANDLER(JaxSwigluGrouped##activation##Bf16, activation,         \
                                    ffi::DataType::BF16);                                 \
  JAX_SWIGLU_DEFINE_GROUPED_HANDLER(JaxSwigluGrouped##activation##F16, activation,          \
                                    ffi::DataType::F16);
JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_DEFINE_HANDLERS)
#undef JAX_SWIGLU_DEFINE_HANDLERS

namespace {

using jax_swiglu::KernelConfig;

const char* ScheduleName(jax_swiglu::Schedule s) {
  switch (s) {
    case jax_swiglu::Schedule::Cooperative:
      return "cooperative";
    case jax_swiglu::Schedule::CudaCores:
      return "cuda-cores";
    case jax_swiglu::Schedule::TensorCores:
      return "tensor-cores";
    default:
      return "pingpong";
  }
}

const char* SchedulerName(jax_swiglu::TileScheduler s) {
  switch (s) {
    case jax_swiglu::TileScheduler::StreamK:
      return "stream-k";
    case jax_swiglu::TileScheduler::SplitTail:
      return "split-tail";
    case jax_swiglu::TileScheduler::ClusterSplitK:
      return "cluster-split-k";
    case jax_swiglu::TileScheduler::Grouped:
      return "grouped";
    default:
      return "persistent";
  }
}

const char* OperandsName(jax_swiglu::Operands o) {
  return o == jax_swiglu::Operands::Fp8E4m3 ? "e4m3" : "16bit";
}

// Every FFI target: its name (which says what runs), the family, operands, activation and
// dtype (the output's) it runs, whether it runs grouped (expert) calls, and its handler. The
// one list the functions below read.
struct Target {
  const char* name;
  const char* family;
  const char* operands;
  const char* activation;
  const char* dtype;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
  bool grouped = false;
};
#define JAX_SWIGLU_TARGETS(activation, name)                                                 \
  {"jax_swiglu_interleaved_" name "_bf16", "interleaved", "16bit", name, "bfloat16",         \
   JaxSwigluInterleaved##activation##Bf16},                                                  \
      {"jax_swiglu_interleaved_" name "_f16", "interleaved", "16bit", name, "float16",       \
       JaxSwigluInterleaved##activation##F16},                                               \
      {"jax_swiglu_gate_then_up_" name "_bf16", "gate_then_up", "16bit", name, "bfloat16",   \
       JaxSwigluGateThenUp##activation##Bf16},                                               \
      {"jax_swiglu_gate_then_up_" name "_f16", "gate_then_up", "16bit", name, "float16",     \
       JaxSwigluGateThenUp##activation##F16},                                                \
      {"jax_swiglu_gemv_" name "_bf16", "gemv", "16bit", name, "bfloat16",                   \
       JaxSwigluGemv##activation##Bf16},                                                     \
      {"jax_swiglu_gemv_" name "_f16", "gemv", "16bit", name, "float16",                     \
       JaxSwigluGemv##activation##F16},                                                      \
      {"jax_swiglu_interleaved_fp8_" name "_bf16", "interleaved", "e4m3", name, "bfloat16",  \
       JaxSwigluFp8##activation##Bf16},                                                      \
      {"jax_swiglu_interleaved_fp8_" name "_f16", "interleaved", "e4m3", name, "float16",    \
       JaxSwigluFp8##activation##F16},                                                       \
      {"jax_swiglu_gemv_fp8_" name "_bf16", "gemv", "e4m3", name, "bfloat16",                \
       JaxSwigluGemvFp8##activation##Bf16},                                                  \
      {"jax_swiglu_gemv_fp8_" name "_f16", "gemv", "e4m3", name, "float16",                  \
       JaxSwigluGemvFp8##activation##F16},                                                   \
      {"jax_swiglu_grouped_" name "_bf16", "interleaved", "16bit", name, "bfloat16",         \
       JaxSwigluGrouped##activation##Bf16, true},                                            \
      {"jax_swiglu_grouped_" name "_f16", "interleaved", "16bit", name, "float16",           \
       JaxSwigluGrouped##activation##F16, true},
const Target kTargets[] = {JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_TARGETS)};
#undef JAX_SWIGLU_TARGETS

// The per-row token quantization before an e4m3 kernel: its target per input dtype.
struct QuantizeTarget {
  const char* name;
  const char* dtype;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};
const QuantizeTarget kQuantizeTargets[] = {
    {"jax_swiglu_quantize_rows_e4m3_bf16", "bfloat16", JaxSwigluQuantizeRowsBf16},
    {"jax_swiglu_quantize_rows_e4m3_f16", "float16", JaxSwigluQuantizeRowsF16},
};

// The decode form's plain projection (a down projection): its target per operands and
// output dtype.
struct ProjectionTarget {
  const char* name;
  const char* operands;
  const char* dtype;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};
const ProjectionTarget kProjectionTargets[] = {
    {"jax_swiglu_gemv_projection_bf16", "16bit", "bfloat16", JaxSwigluProjectionBf16},
    {"jax_swiglu_gemv_projection_f16", "16bit", "float16", JaxSwigluProjectionF16},
    {"jax_swiglu_gemv_projection_fp8_bf16", "e4m3", "bfloat16", JaxSwigluProjectionFp8Bf16},
    {"jax_swiglu_gemv_projection_fp8_f16", "e4m3", "float16", JaxSwigluProjectionFp8F16},
};

const KernelConfig& Row(int64_t config) {
  if (config < 0 || config >= jax_swiglu::kConfigCount) {
    throw std::invalid_argument("jax_swiglu: unknown kernel config " + std::to_string(config));
  }
  return jax_swiglu::kConfigs[config];
}

// Any compiled row by id: `f(std::integral_constant<int, id>)`, or an error message.
template <int Id = 0, class F>
std::string WithCompiledRow(int64_t config, F&& f) {
  if constexpr (Id == jax_swiglu::kConfigCount) {
    return "unknown kernel config " + std::to_string(config);
  } else {
    if (config == Id) {
      if constexpr (jax_swiglu::kConfigs[Id].compiled()) {
        return f(std::integral_constant<int, Id>{});
      } else {
        return jax_swiglu::RowName(jax_swiglu::kConfigs[Id]) +
               " is not compiled in this build (install with JAX_SWIGLU_ALL_CONFIGS=1)";
      }
    }
    return WithCompiledRow<Id + 1>(config, f);
  }
}

jax_swiglu::SwigluProblem ProblemOf(int64_t m, int64_t n, int64_t n_packed, int64_t k,
                                    int64_t swizzle, int64_t raster, int64_t splits,
                                    int64_t promotion, int64_t experts = 0) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {m, n, k, 2 * n_packed, swizzle, raster, splits, promotion}) {
    if (v > kMax || v < -kMax) throw std::invalid_argument("jax_swiglu: a dimension exceeds 2^31 - 1");
  }
  jax_swiglu::SwigluProblem p{nullptr, nullptr, nullptr, m, n, n_packed, k,
                              static_cast<int>(swizzle), static_cast<int>(raster),
                              static_cast<int>(splits)};
  p.fp8_promotion = static_cast<int>(promotion);
  p.experts = experts;
  return p;
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "jax_swiglu native kernels: XLA FFI handlers and their configuration table.";

  // FFI target name -> handler capsule, for jax.ffi.register_ffi_target.
  m.def("registrations", []() {
    nb::dict d;
    for (const Target& t : kTargets) d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    for (const QuantizeTarget& t : kQuantizeTargets) {
      d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    }
    for (const ProjectionTarget& t : kProjectionTargets) {
      d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    }
    return d;
  });

  // (operands, output dtype) -> the target of the decode form's plain projection.
  m.def("projection_targets", []() {
    nb::dict d;
    for (const ProjectionTarget& t : kProjectionTargets) {
      d[nb::make_tuple(t.operands, t.dtype)] = t.name;
    }
    return d;
  });

  // Input dtype -> the target that quantizes 16-bit tokens per row to e4m3.
  m.def("quantize_targets", []() {
    nb::dict d;
    for (const QuantizeTarget& t : kQuantizeTargets) d[t.dtype] = t.name;
    return d;
  });

  // (name, family, operands, activation, dtype) of every target, so Python never spells a
  // target name itself.
  m.def("targets", []() {
    nb::list l;
    for (const Target& t : kTargets) {
      nb::dict d;
      d["name"] = t.name;
      d["family"] = t.family;
      d["operands"] = t.operands;
      d["activation"] = t.activation;
      d["dtype"] = t.dtype;
      d["grouped"] = t.grouped;
      l.append(d);
    }
    return l;
  });

  // Every row of the table (kernel_configs.h), compiled in this build or not, with what
  // follows from it.
  m.def("kernel_configs", []() {
    nb::list l;
    for (const KernelConfig& c : jax_swiglu::kConfigs) {
      nb::dict d;
      d["id"] = c.id;
      d["family"] = jax_swiglu::FamilyName(c.family);
      d["operands"] = OperandsName(c.operands);
      d["accumulation"] = c.accumulation == jax_swiglu::Accumulation::Fast ? "fast"
                          : c.accumulation == jax_swiglu::Accumulation::PromotedInHalves
                              ? "promoted-in-halves"
                              : "promoted";
      d["schedule"] = ScheduleName(c.schedule);
      d["m_side"] = c.m_side == jax_swiglu::MmaMSide::Weights ? "weights" : "tokens";
      d["tile_m"] = c.tile_m;
      d["tile_n"] = c.tile_n;
      d["tile_k"] = c.tile_k;
      d["cluster_m"] = c.cluster_m;
      d["cluster_n"] = c.cluster_n;
      d["scheduler"] = SchedulerName(c.scheduler);
      d["store"] = c.store == jax_swiglu::OutputStore::DirectStore ? "direct" : "tma";
      d["m_bands"] = c.m_bands;
      d["optional"] = c.build == jax_swiglu::Build::Optional;
      d["compiled"] = c.compiled();
      d["max_m"] = c.max_m();
      d["m_multiple"] = c.m_multiple();
      d["ctas_per_sm"] = c.ctas_per_sm();
      d["takes_splits"] = c.takes_splits();
      d["grouped"] = c.grouped();
      l.append(d);
    }
    return l;
  });

  // Why row `config` cannot run a problem with these shapes and launch attributes ("" if it
  // can): the check every launch makes first.
  m.def(
      "can_implement",
      [](int64_t config, int64_t m, int64_t n, int64_t k, int64_t splits, int64_t swizzle,
         int64_t raster, int64_t promotion, int64_t experts) -> std::string {
        const KernelConfig& row = Row(config);
        const int64_t n_packed = (n + jax_swiglu::kGateUpBlock - 1) / jax_swiglu::kGateUpBlock *
                                 jax_swiglu::kGateUpBlock;
        return jax_swiglu::CannotRun(
            row, ProblemOf(m, n, n_packed, k, swizzle, raster, splits, promotion, experts));
      },
      nb::arg("config"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("splits") = 1,
      nb::arg("swizzle") = 1, nb::arg("raster") = 0, nb::arg("promotion") = 4,
      nb::arg("experts") = 0);

  // Why gemv row `config` cannot run the plain projection [m, k] x [k, n] ("" if it can).
  m.def(
      "can_implement_projection",
      [](int64_t config, int64_t m, int64_t n, int64_t k, int64_t splits,
         int64_t promotion) -> std::string {
        constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
        for (int64_t v : {splits, promotion}) {
          if (v > kMax || v < -kMax) return "splits and promotion must fit in 32 bits";
        }
        jax_swiglu::ProjectionProblem p{nullptr, nullptr, nullptr, m, n, k};
        p.splits = static_cast<int>(splits);
        p.fp8_promotion = static_cast<int>(promotion);
        return jax_swiglu::CannotRunProjection(Row(config), p);
      },
      nb::arg("config"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("splits") = 1,
      nb::arg("promotion") = 4);

  // The split-K factors (stream-K) or cluster sizes (gemv) worth trying for row `config` on K.
  m.def("split_choices", [](int64_t config, int64_t k) {
    return jax_swiglu::SplitChoices(Row(config), k);
  });

  // Bytes of workspace one call needs (0 for most configs): the lowering adds a scratch
  // output of this size to the custom call. `sm_count` is the GPU's (the stream-K split
  // depends on it); the handler rechecks the size against the GPU it runs on.
  m.def(
      "workspace_bytes",
      [](int64_t config, const std::string& activation, const std::string& dtype, int64_t m,
         int64_t n, int64_t n_packed, int64_t k, int64_t swizzle, int64_t raster,
         int64_t splits, int64_t promotion, int sm_count) -> size_t {
        jax_swiglu::SwigluProblem problem =
            ProblemOf(m, n, n_packed, k, swizzle, raster, splits, promotion);
        if (m <= 0) return size_t(0);  // the handler launches nothing
        if (std::string err = jax_swiglu::CannotRun(Row(config), problem); !err.empty()) {
          throw std::invalid_argument("jax_swiglu: " + err);
        }
        jax_swiglu::DeviceFacts device{0, sm_count, 9, 0};
        size_t bytes = 0;
        std::string err = WithCompiledRow(config, [&](auto id) {
          return jax_swiglu::WithActivation(activation, [&](auto act) {
            return jax_swiglu::WithElement(dtype, [&](auto element) {
              std::string why = jax_swiglu::NotCompiled<decltype(element), decltype(act)::value>(
                  jax_swiglu::kConfigs[decltype(id)::value]);
              if (!why.empty()) return why;
              bytes = jax_swiglu::RowWorkspaceBytes<decltype(id)::value, decltype(element),
                                                    decltype(act)::value>(problem, device);
              return std::string();
            });
          });
        });
        if (!err.empty()) throw std::invalid_argument("jax_swiglu: " + err);
        return bytes;
      },
      nb::arg("config"), nb::arg("activation"), nb::arg("dtype"), nb::arg("m"), nb::arg("n"),
      nb::arg("n_packed"), nb::arg("k"), nb::arg("swizzle"), nb::arg("raster"),
      nb::arg("splits"), nb::arg("promotion"), nb::arg("sm_count"));

  // Per-launch GPU times (microseconds) of `samples` replays of a CUDA graph of `calls`
  // launches of one config, launch i reading input set i % len(xs) (device pointers the
  // caller owns: x [m, k] and packed weights each, in the row's operand layout, out [m, n]
  // of a 2-byte dtype, poisoned with NaN first, the workspace the config needs, and for e4m3
  // rows the scales: x_scale [m], w_scale [1] or [2 n_packed] with its stride). For tuning
  // only (ffi/timing.h); raises RuntimeError on a failure.
  m.def(
      "time_launches",
      [](int64_t config, const std::string& activation, const std::string& dtype, int64_t m,
         int64_t n, int64_t n_packed, int64_t k, int64_t swizzle, int64_t raster,
         int64_t splits, int64_t promotion, const std::vector<uintptr_t>& xs,
         const std::vector<uintptr_t>& packed, uintptr_t out, uintptr_t workspace,
         size_t workspace_bytes, uintptr_t x_scale, uintptr_t w_scale, int w_scale_stride,
         int calls, int samples) {
        jax_swiglu::SwigluProblem base =
            ProblemOf(m, n, n_packed, k, swizzle, raster, splits, promotion);
        if (xs.empty() || xs.size() != packed.size() || m <= 0) {
          throw std::invalid_argument("jax_swiglu: time_launches needs m > 0 and as many x as "
                                      "packed buffers");
        }
        const KernelConfig& row = Row(config);
        if (row.operands == jax_swiglu::Operands::Fp8E4m3 && (!x_scale || !w_scale)) {
          throw std::invalid_argument("jax_swiglu: an e4m3 row needs x_scale and w_scale");
        }
        cudaPointerAttributes where{};
        if (cudaPointerGetAttributes(&where, reinterpret_cast<void*>(out)) != cudaSuccess ||
            where.type != cudaMemoryTypeDevice || cudaSetDevice(where.device) != cudaSuccess) {
          (void)cudaGetLastError();
          throw std::invalid_argument("jax_swiglu: time_launches needs device buffers");
        }
        jax_swiglu::DeviceFacts device;
        if (std::string err = jax_swiglu::CurrentDeviceFacts(&device); !err.empty()) {
          throw std::runtime_error("jax_swiglu: " + err);
        }
        // Each launch starts when the previous one has finished, as a call in a model does
        // (the kernel before ours there is XLA's, which never releases its dependents
        // early). Back to back under programmatic dependent launch our launches overlap one
        // another, which favours grids of several waves over one: a ranking of the splits
        // of K that no call in a model sees.
        device.programmatic_launch = false;
        auto launch = [&](int i, cudaStream_t stream) {
          const size_t set = static_cast<size_t>(i) % xs.size();
          jax_swiglu::SwigluProblem problem = base;
          problem.x = reinterpret_cast<const void*>(xs[set]);
          problem.packed = reinterpret_cast<const void*>(packed[set]);
          problem.out = reinterpret_cast<void*>(out);
          problem.workspace = reinterpret_cast<void*>(workspace);
          problem.workspace_bytes = workspace_bytes;
          problem.x_scale = reinterpret_cast<const float*>(x_scale);
          problem.w_scale = reinterpret_cast<const float*>(w_scale);
          problem.w_scale_stride = w_scale_stride;
          return WithCompiledRow(config, [&](auto id) {
            return jax_swiglu::WithActivation(activation, [&](auto act) {
              return jax_swiglu::WithElement(dtype, [&](auto element) {
                return jax_swiglu::LaunchRow<decltype(id)::value, decltype(element),
                                             decltype(act)::value>(problem, device, stream);
              });
            });
          });
        };
        std::vector<double> microseconds;
        std::string err;
        {
          nb::gil_scoped_release release;
          err = jax_swiglu::TimeGraphReplays(launch, calls, samples, reinterpret_cast<void*>(out),
                                             static_cast<size_t>(m * n) * 2, &microseconds);
        }
        if (!err.empty()) throw std::runtime_error("jax_swiglu: " + err);
        return microseconds;
      },
      nb::arg("config"), nb::arg("activation"), nb::arg("dtype"), nb::arg("m"), nb::arg("n"),
      nb::arg("n_packed"), nb::arg("k"), nb::arg("swizzle"), nb::arg("raster"),
      nb::arg("splits"), nb::arg("promotion"), nb::arg("xs"), nb::arg("packed"),
      nb::arg("out"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("x_scale"),
      nb::arg("w_scale"), nb::arg("w_scale_stride"), nb::arg("calls"), nb::arg("samples"));

  // The current CUDA device's facts the selection reads (zeros when there is no GPU).
  m.def("device_facts", []() {
    nb::dict d;
    jax_swiglu::DeviceFacts facts{};
    const bool ok = jax_swiglu::CurrentDeviceFacts(&facts).empty();
    d["sm_count"] = ok ? facts.sm_count : 0;
    d["compute_capability"] = ok ? facts.cc_major * 10 + facts.cc_minor : 0;
    int memory_khz = 0, bus_bits = 0;
    if (ok) {
      cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, facts.device);
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, facts.device);
      (void)cudaGetLastError();
    }
    d["l2_bytes"] = ok ? facts.l2_bytes : 0;
    // Peak DRAM bandwidth from the memory clock (double data rate) and the bus width.
    d["dram_bytes_per_s"] = 2.0 * 1e3 * memory_khz * (bus_bits / 8);
    // Clusters of 2-16 CTAs that fit at once (a size the part cannot hold is left out).
    nb::dict slots;
    for (int size = 2; ok && size <= 16; size *= 2) {
      if (const int clusters = jax_swiglu::ClusterSlots(size); clusters > 0) {
        slots[nb::int_(size)] = clusters;
      }
    }
    d["cluster_slots"] = slots;
    return d;
  });

  // The current CUDA device's SM count, or 0 when there is none (no GPU, no driver).
  m.def("device_sm_count", []() {
    jax_swiglu::DeviceFacts facts;
    return jax_swiglu::CurrentDeviceFacts(&facts).empty() ? facts.sm_count : 0;
  });

  m.attr("gate_up_block") = jax_swiglu::kGateUpBlock;

  // The activations every kernel is compiled for (kernel_configs.h), by name.
  m.def("activations", []() {
    nb::list l;
#define JAX_SWIGLU_ACTIVATION_NAME(activation, name) l.append(name);
    JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_ACTIVATION_NAME)
#undef JAX_SWIGLU_ACTIVATION_NAME
    return l;
  });
  // The activations whose float16 kernels this build compiled (every compiled row has its
  // bfloat16 kernel of each: kernel_configs.h, ActivationCompiled).
  m.def("float16_activations", []() {
    nb::list l;
#define JAX_SWIGLU_FLOAT16_NAME(activation, name)                                 \
  if (jax_swiglu::ActivationCompiled(true, jax_swiglu::Activation::activation)) { \
    l.append(name);                                                               \
  }
    JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_FLOAT16_NAME)
#undef JAX_SWIGLU_FLOAT16_NAME
    return l;
  });
}
