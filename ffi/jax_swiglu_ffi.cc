// XLA FFI handlers for the fused gated-MLP kernels and the nanobind module that hands them
// to Python (jax_swiglu/_native.py registers every capsule in `registrations()`). One
// target per (kernel family, activation, dtype); its name says all three.
//
// Handlers are typed, take the stream from PlatformStream<cudaStream_t>, validate
// everything they are given, and report problems as ffi::Error values: they never throw,
// abort, synchronize or allocate, so they are safe inside XLA's command buffers.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

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

// Runtime config id -> the instantiation `launch(std::integral_constant<int, id>)`, for the
// rows of `table` this build compiled.
template <int Id, int Count, const KernelConfig (&table)[Count], class Launch>
std::string DispatchConfig(const char* kernel, int64_t config, Launch&& launch) {
  if constexpr (Id == Count) {
    return std::string("unknown ") + kernel + " kernel config " + std::to_string(config);
  } else {
    if (config == Id) {
      if constexpr (table[Id].compiled()) {
        return launch(std::integral_constant<int, Id>{});
      } else {
        return std::string(kernel) + " kernel config " + std::to_string(config) +
               " is not compiled in this build (rebuild with -DJAX_SWIGLU_ALL_CONFIGS=ON)";
      }
    }
    return DispatchConfig<Id + 1, Count, table>(kernel, config, launch);
  }
}

// The kernel families: name, config id -> launch, and config id -> workspace bytes (an
// error message for an unknown id), over each one's config table. A family `Kernel` has the
// table k<Kernel>Configs of JAX_SWIGLU_NUM_<TABLE>_CONFIGS rows (kernel_configs.h) and the
// launch.h templates Launch<Kernel> and <Kernel>WorkspaceBytes; the fp8 family's element
// tag is the output's.
#define JAX_SWIGLU_KERNEL_FAMILY(Kernel, name, TABLE)                                        \
  struct Kernel {                                                                           \
    static constexpr const char* kName = name;                                              \
    template <class ElementTag, Activation kActivation>                                     \
    static std::string Launch(int64_t config, const SwigluProblem& problem,                 \
                              const DeviceFacts& device, cudaStream_t stream) {             \
      return DispatchConfig<0, JAX_SWIGLU_NUM_##TABLE##_CONFIGS, k##Kernel##Configs>(       \
          kName, config, [&](auto id) {                                                     \
            return Launch##Kernel<decltype(id)::value, ElementTag, kActivation>(problem,    \
                                                                                device,     \
                                                                                stream);    \
          });                                                                               \
    }                                                                                       \
    template <class ElementTag, Activation kActivation>                                     \
    static std::string WorkspaceBytes(int64_t config, const SwigluProblem& problem,         \
                                      const DeviceFacts& device, size_t* bytes) {           \
      return DispatchConfig<0, JAX_SWIGLU_NUM_##TABLE##_CONFIGS, k##Kernel##Configs>(       \
          kName, config, [&](auto id) {                                                     \
            *bytes = Kernel##WorkspaceBytes<decltype(id)::value, ElementTag, kActivation>(  \
                problem, device);                                                           \
            return std::string();                                                           \
          });                                                                               \
    }                                                                                       \
  };
JAX_SWIGLU_KERNEL_FAMILY(Interleaved, "interleaved", INTERLEAVED)
JAX_SWIGLU_KERNEL_FAMILY(Pingpong, "pingpong", PINGPONG)
JAX_SWIGLU_KERNEL_FAMILY(Fp8, "fp8", FP8)
JAX_SWIGLU_KERNEL_FAMILY(Gemv, "gemv", GEMV)
#undef JAX_SWIGLU_KERNEL_FAMILY

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

template <class Dimensions>
std::string Dims(Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Shape checks shared by every kernel: x [M, K], packed [K, 2 * n_packed], out [M, N].
template <class Buffer>
ffi::Error DescribeProblem(const Buffer& x, const Buffer& packed, const Buffer& out,
                           SwigluProblem* problem) {
  auto xd = x.dimensions(), wd = packed.dimensions(), od = out.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument("jax_swiglu: expected x [M, K], packed [K, 2N'], out [M, N]; got " +
                                       Dims(xd) + ", " + Dims(wd) + ", " + Dims(od));
  }
  SwigluProblem& p = *problem;
  p = SwigluProblem{x.untyped_data(), packed.untyped_data(), out.untyped_data(),
                    xd[0], od[1], wd[1] / 2, xd[1], /*swizzle=*/1, /*raster=*/0};
  if (wd[0] != p.k || od[0] != p.m || wd[1] % (2 * kGateUpBlock) != 0 || p.n > p.n_packed ||
      p.n <= p.n_packed - kGateUpBlock) {
    return ffi::Error::InvalidArgument("jax_swiglu: inconsistent shapes x " + Dims(xd) +
                                       ", packed " + Dims(wd) + ", out " + Dims(od));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (p.m > kMax || p.k > kMax || 2 * p.n_packed > kMax) {
    return ffi::Error::InvalidArgument("jax_swiglu: a dimension exceeds 2^31 - 1");
  }
  return ffi::Error::Success();
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

// Split-K factors the handler accepts (the selection asks for a few at most).
constexpr int64_t kMaxSplits = 16;

// The tile-order and split attributes every handler takes, checked into `problem`.
ffi::Error SetTileOrder(int64_t swizzle, int64_t raster, int64_t splits, SwigluProblem* problem) {
  if ((swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) || raster < 0 ||
      raster > 2) {
    return ffi::Error::InvalidArgument("jax_swiglu: swizzle must be 1, 2, 4 or 8 and raster "
                                       "0, 1 or 2; got " + std::to_string(swizzle) + ", " +
                                       std::to_string(raster));
  }
  if (splits < 1 || splits > kMaxSplits) {
    return ffi::Error::InvalidArgument("jax_swiglu: splits must be in 1.." +
                                       std::to_string(kMaxSplits) + "; got " +
                                       std::to_string(splits));
  }
  problem->swizzle = static_cast<int>(swizzle);
  problem->raster = static_cast<int>(raster);
  problem->splits = static_cast<int>(splits);
  return ffi::Error::Success();
}

// `workspace`: present where the config needs one (the lowering sizes it with
// workspace_bytes below); the launcher checks that it is large enough.
template <class Family, Activation kActivation, ffi::DataType T>
ffi::Error Swiglu(cudaStream_t stream, ffi::Buffer<T> x, ffi::Buffer<T> packed,
                  ffi::Result<ffi::Buffer<T>> out,
                  std::optional<ffi::Result<ffi::AnyBuffer>> workspace, int64_t config,
                  int64_t swizzle, int64_t raster, int64_t splits) {
  SwigluProblem problem;
  if (ffi::Error err = DescribeProblem(x, packed, *out, &problem); err.failure()) return err;
  if (workspace.has_value()) {
    problem.workspace = (*workspace)->untyped_data();
    problem.workspace_bytes = (*workspace)->size_bytes();
  }
  if (ffi::Error err = SetTileOrder(swizzle, raster, splits, &problem); err.failure()) {
    return err;
  }
  if (problem.m == 0) return ffi::Error::Success();  // nothing to write
  DeviceFacts device;
  if (ffi::Error err = CheckDevice(&device); err.failure()) return err;
  std::string err =
      Family::template Launch<ElementTagFor<T>, kActivation>(config, problem, device, stream);
  if (!err.empty()) return ffi::Error::Internal("jax_swiglu: " + err);
  return ffi::Error::Success();
}

// The fp8 kernel: x_q [M, K] and packed [2 * n_packed, K] in e4m3 (K-major), x_scale [M],
// w_scale [2 * n_packed] (a scale per packed column) or [1] / [] (one for all), out [M, N].
template <Activation kActivation, ffi::DataType T>
// (x and packed come as AnyBuffer, their element type checked here: the FFI has no native
// C++ type for fp8 buffers.)
ffi::Error SwigluFp8(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::DataType::F32> x_scale,
                     ffi::AnyBuffer packed, ffi::Buffer<ffi::DataType::F32> w_scale,
                     ffi::Result<ffi::Buffer<T>> out,
                     std::optional<ffi::Result<ffi::AnyBuffer>> workspace, int64_t config,
                     int64_t swizzle, int64_t raster, int64_t splits, int64_t promotion) {
  if (x.element_type() != ffi::DataType::F8E4M3FN ||
      packed.element_type() != ffi::DataType::F8E4M3FN) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: x and packed must be float8_e4m3fn");
  }
  auto xd = x.dimensions(), wd = packed.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument(
        "jax_swiglu fp8: expected x [M, K], packed [2N', K], out [M, N]; got " + Dims(xd) +
        ", " + Dims(wd) + ", " + Dims(od));
  }
  SwigluProblem problem{x.untyped_data(), packed.untyped_data(), out->untyped_data(),
                        xd[0], od[1], wd[0] / 2, xd[1], /*swizzle=*/1, /*raster=*/0};
  if (wd[1] != problem.k || od[0] != problem.m || wd[0] % (2 * kGateUpBlock) != 0 ||
      problem.n > problem.n_packed || problem.n <= problem.n_packed - kGateUpBlock) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: inconsistent shapes x " + Dims(xd) +
                                       ", packed " + Dims(wd) + ", out " + Dims(od));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (problem.m > kMax || problem.k > kMax || 2 * problem.n_packed > kMax) {
    return ffi::Error::InvalidArgument("jax_swiglu: a dimension exceeds 2^31 - 1");
  }
  if (static_cast<int64_t>(x_scale.element_count()) != problem.m) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: x_scale " + Dims(x_scale.dimensions()) +
                                       " must hold one scale per row of x " + Dims(xd));
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
  if (promotion < 2 || promotion > 64 || promotion % 2 != 0) {
    return ffi::Error::InvalidArgument("jax_swiglu fp8: promotion must be even, in 2..64; got " +
                                       std::to_string(promotion));
  }
  problem.fp8_promotion = static_cast<int>(promotion);
  if (workspace.has_value()) {
    problem.workspace = (*workspace)->untyped_data();
    problem.workspace_bytes = (*workspace)->size_bytes();
  }
  if (ffi::Error err = SetTileOrder(swizzle, raster, splits, &problem); err.failure()) {
    return err;
  }
  if (problem.m == 0) return ffi::Error::Success();
  DeviceFacts device;
  if (ffi::Error err = CheckDevice(&device); err.failure()) return err;
  std::string err =
      Fp8::template Launch<ElementTagFor<T>, kActivation>(config, problem, device, stream);
  if (!err.empty()) return ffi::Error::Internal("jax_swiglu: " + err);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_swiglu

#define JAX_SWIGLU_DEFINE_FP8_HANDLER(symbol, activation, dtype)                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      symbol, (jax_swiglu::SwigluFp8<jax_swiglu::Activation::activation, dtype>),        \
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

#define JAX_SWIGLU_DEFINE_FP8_HANDLERS(activation, name)                                   \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluFp8##activation##Bf16, activation,                \
                                ffi::DataType::BF16);                                      \
  JAX_SWIGLU_DEFINE_FP8_HANDLER(JaxSwigluFp8##activation##F16, activation, ffi::DataType::F16);
JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_DEFINE_FP8_HANDLERS)
#undef JAX_SWIGLU_DEFINE_FP8_HANDLERS

#define JAX_SWIGLU_DEFINE_HANDLER(symbol, family, activation, dtype)                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                         \
      symbol, (jax_swiglu::Swiglu<family, jax_swiglu::Activation::activation, dtype>),  \
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

// Every (family, dtype) handler of one activation.
#define JAX_SWIGLU_DEFINE_HANDLERS(activation, name)                                      \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleaved##activation##Bf16, jax_swiglu::Interleaved, \
                            activation, ffi::DataType::BF16);                              \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleaved##activation##F16, jax_swiglu::Interleaved,  \
                            activation, ffi::DataType::F16);                               \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluPingpong##activation##Bf16, jax_swiglu::Pingpong,       \
                            activation, ffi::DataType::BF16);                              \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluPingpong##activation##F16, jax_swiglu::Pingpong,        \
                            activation, ffi::DataType::F16);                               \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGemv##activation##Bf16, jax_swiglu::Gemv, activation,   \
                            ffi::DataType::BF16);                                          \
  JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluGemv##activation##F16, jax_swiglu::Gemv, activation,    \
                            ffi::DataType::F16);
JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_DEFINE_HANDLERS)
#undef JAX_SWIGLU_DEFINE_HANDLERS

namespace {

const char* ScheduleName(jax_swiglu::Schedule s) {
  switch (s) {
    case jax_swiglu::Schedule::Cooperative:
      return "cooperative";
    case jax_swiglu::Schedule::CudaCores:
      return "cuda-cores";
    case jax_swiglu::Schedule::MmaSync:
      return "mma-sync";
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
    default:
      return "persistent";
  }
}

// Every FFI target: its name (which says what runs), the kernel, activation and dtype it
// runs, and its handler. The one list that both functions below read.
struct Target {
  const char* name;
  const char* kernel;
  const char* activation;
  const char* dtype;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};
#define JAX_SWIGLU_TARGETS(activation, name)                                               \
  {"jax_swiglu_interleaved_" name "_bf16", "interleaved", name, "bfloat16",                \
   JaxSwigluInterleaved##activation##Bf16},                                                \
      {"jax_swiglu_interleaved_" name "_f16", "interleaved", name, "float16",              \
       JaxSwigluInterleaved##activation##F16},                                             \
      {"jax_swiglu_pingpong_" name "_bf16", "pingpong", name, "bfloat16",                  \
       JaxSwigluPingpong##activation##Bf16},                                               \
      {"jax_swiglu_pingpong_" name "_f16", "pingpong", name, "float16",                    \
       JaxSwigluPingpong##activation##F16},                                                  \
      {"jax_swiglu_gemv_" name "_bf16", "gemv", name, "bfloat16",                          \
       JaxSwigluGemv##activation##Bf16},                                                     \
      {"jax_swiglu_gemv_" name "_f16", "gemv", name, "float16",                            \
       JaxSwigluGemv##activation##F16},
const Target kTargets[] = {JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_TARGETS)};
#undef JAX_SWIGLU_TARGETS
// The fp8 kernel's targets, by output dtype (its operands are e4m3).
#define JAX_SWIGLU_FP8_TARGETS(activation, name)                                           \
  {"jax_swiglu_interleaved_fp8_" name "_bf16", "fp8", name, "bfloat16",                    \
   JaxSwigluFp8##activation##Bf16},                                                        \
      {"jax_swiglu_interleaved_fp8_" name "_f16", "fp8", name, "float16",                  \
       JaxSwigluFp8##activation##F16},
const Target kFp8Targets[] = {JAX_SWIGLU_ACTIVATIONS(JAX_SWIGLU_FP8_TARGETS)};
#undef JAX_SWIGLU_FP8_TARGETS

// A family's workspace size for an activation and dtype given by name ("" or an error
// message).
template <class Family>
std::string WorkspaceBytes(const std::string& activation, const std::string& dtype,
                           int64_t config, const jax_swiglu::SwigluProblem& problem,
                           const jax_swiglu::DeviceFacts& device, size_t* bytes) {
  return jax_swiglu::WithActivation(activation, [&](auto act) -> std::string {
    if (dtype == "bfloat16") {
      return Family::template WorkspaceBytes<jax_swiglu::BF16, decltype(act)::value>(
          config, problem, device, bytes);
    }
    if (dtype == "float16") {
      return Family::template WorkspaceBytes<jax_swiglu::F16, decltype(act)::value>(
          config, problem, device, bytes);
    }
    return "unknown dtype " + dtype;
  });
}

// A family's launch for an activation and dtype given by name ("" or an error message).
template <class Family>
std::string LaunchByName(const std::string& activation, const std::string& dtype,
                         int64_t config, const jax_swiglu::SwigluProblem& problem,
                         const jax_swiglu::DeviceFacts& device, cudaStream_t stream) {
  return jax_swiglu::WithActivation(activation, [&](auto act) -> std::string {
    if (dtype == "bfloat16") {
      return Family::template Launch<jax_swiglu::BF16, decltype(act)::value>(config, problem,
                                                                              device, stream);
    }
    if (dtype == "float16") {
      return Family::template Launch<jax_swiglu::F16, decltype(act)::value>(config, problem,
                                                                             device, stream);
    }
    return "unknown dtype " + dtype;
  });
}

// The compiled rows of `table` as dicts (the columns of kernel_configs.h), onto `l`.
template <size_t N>
void AppendConfigs(const char* kernel, const jax_swiglu::KernelConfig (&table)[N], nb::list& l) {
  for (const jax_swiglu::KernelConfig& c : table) {
    if (!c.compiled()) continue;
    nb::dict d;
    d["kernel"] = kernel;
    d["id"] = c.id;
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
    l.append(d);
  }
}

void CheckDimensions(int64_t m, int64_t k, int64_t n_packed) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (m > kMax || k > kMax || 2 * n_packed > kMax) {
    throw std::invalid_argument("jax_swiglu: a dimension exceeds 2^31 - 1");
  }
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "jax_swiglu native kernels: XLA FFI handlers and their configuration table.";

  // FFI target name -> handler capsule, for jax.ffi.register_ffi_target.
  m.def("registrations", []() {
    nb::dict d;
    for (const Target& t : kTargets) d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    for (const Target& t : kFp8Targets) {
      d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    }
    return d;
  });

  // (name, kernel, activation, dtype) of every target, so Python never spells a target
  // name itself.
  auto target_list = [](const auto& targets) {
    nb::list l;
    for (const Target& t : targets) {
      nb::dict d;
      d["name"] = t.name;
      d["kernel"] = t.kernel;
      d["activation"] = t.activation;
      d["dtype"] = t.dtype;
      l.append(d);
    }
    return l;
  };
  m.def("targets", [target_list]() { return target_list(kTargets); });
  // The same for the fp8 kernel (its `dtype` is the output's; x and weights are e4m3).
  m.def("fp8_targets", [target_list]() { return target_list(kFp8Targets); });

  // The tile configurations this build compiled (ffi/kernel_configs.h), by kernel.
  m.def("kernel_configs", []() {
    nb::list l;
    AppendConfigs(jax_swiglu::Interleaved::kName, jax_swiglu::kInterleavedConfigs, l);
    AppendConfigs(jax_swiglu::Pingpong::kName, jax_swiglu::kPingpongConfigs, l);
    AppendConfigs(jax_swiglu::Gemv::kName, jax_swiglu::kGemvConfigs, l);
    return l;
  });
  // The fp8 kernel's configurations (a table of their own: they run other operands).
  m.def("fp8_configs", []() {
    nb::list l;
    AppendConfigs(jax_swiglu::Fp8::kName, jax_swiglu::kFp8Configs, l);
    return l;
  });

  // Bytes of workspace one call needs (0 for most configs): the lowering adds a scratch
  // output of this size to the custom call. `sm_count` is the GPU's (the stream-K split
  // depends on it); the handler rechecks the size against the GPU it runs on.
  m.def(
      "workspace_bytes",
      [](const std::string& kernel, const std::string& activation, const std::string& dtype,
         int64_t config, int64_t m, int64_t n, int64_t n_packed, int64_t k, int64_t swizzle,
         int64_t raster, int64_t splits, int sm_count) -> size_t {
        CheckDimensions(m, k, n_packed);
        if (m <= 0) return size_t(0);  // the handler launches nothing
        jax_swiglu::SwigluProblem problem{nullptr, nullptr, nullptr, m,
                                          n, n_packed, k, static_cast<int>(swizzle),
                                          static_cast<int>(raster), static_cast<int>(splits)};
        jax_swiglu::DeviceFacts device{0, sm_count, 9, 0};
        size_t bytes = 0;
        std::string err = kernel == jax_swiglu::Interleaved::kName
                              ? WorkspaceBytes<jax_swiglu::Interleaved>(activation, dtype, config,
                                                                        problem, device, &bytes)
                          : kernel == jax_swiglu::Pingpong::kName
                              ? WorkspaceBytes<jax_swiglu::Pingpong>(activation, dtype, config,
                                                                     problem, device, &bytes)
                          : kernel == jax_swiglu::Fp8::kName
                              ? WorkspaceBytes<jax_swiglu::Fp8>(activation, dtype, config,
                                                                problem, device, &bytes)
                          : kernel == jax_swiglu::Gemv::kName
                              ? WorkspaceBytes<jax_swiglu::Gemv>(activation, dtype, config,
                                                                 problem, device, &bytes)
                              : "unknown kernel " + kernel;
        if (!err.empty()) throw std::invalid_argument("jax_swiglu: " + err);
        return bytes;
      },
      nb::arg("kernel"), nb::arg("activation"), nb::arg("dtype"), nb::arg("config"),
      nb::arg("m"), nb::arg("n"), nb::arg("n_packed"), nb::arg("k"), nb::arg("swizzle"),
      nb::arg("raster"), nb::arg("splits"), nb::arg("sm_count"));

  // Per-launch GPU times (microseconds) of `samples` replays of a CUDA graph of `calls`
  // launches of one config, launch i reading input set i % len(xs) (device pointers the
  // caller owns: x [m, k] and packed [k, 2 n_packed] each, out [m, n] of a 2-byte dtype,
  // poisoned with NaN first, and the workspace the config needs). For tuning only
  // (ffi/timing.h); raises RuntimeError on a failure.
  m.def(
      "time_launches",
      [](const std::string& kernel, const std::string& activation, const std::string& dtype,
         int64_t config, int64_t m, int64_t n, int64_t n_packed, int64_t k, int64_t swizzle,
         int64_t raster, int64_t splits, const std::vector<uintptr_t>& xs, const std::vector<uintptr_t>& packed, uintptr_t out,
         uintptr_t workspace, size_t workspace_bytes, int calls, int samples) {
        CheckDimensions(m, k, n_packed);
        if (xs.empty() || xs.size() != packed.size() || m <= 0) {
          throw std::invalid_argument("jax_swiglu: time_launches needs m > 0 and as many x as "
                                      "packed buffers");
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
        auto launch = [&](int i, cudaStream_t stream) {
          const size_t set = static_cast<size_t>(i) % xs.size();
          jax_swiglu::SwigluProblem problem{reinterpret_cast<const void*>(xs[set]),
                                            reinterpret_cast<const void*>(packed[set]),
                                            reinterpret_cast<void*>(out),
                                            m, n, n_packed, k,
                                            static_cast<int>(swizzle), static_cast<int>(raster),
                                            static_cast<int>(splits),
                                            reinterpret_cast<void*>(workspace), workspace_bytes};
          return kernel == jax_swiglu::Interleaved::kName
                     ? LaunchByName<jax_swiglu::Interleaved>(activation, dtype, config, problem,
                                                             device, stream)
                 : kernel == jax_swiglu::Pingpong::kName
                     ? LaunchByName<jax_swiglu::Pingpong>(activation, dtype, config, problem,
                                                          device, stream)
                 : kernel == jax_swiglu::Gemv::kName
                     ? LaunchByName<jax_swiglu::Gemv>(activation, dtype, config, problem,
                                                      device, stream)
                     : "unknown kernel " + kernel;
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
      nb::arg("kernel"), nb::arg("activation"), nb::arg("dtype"), nb::arg("config"),
      nb::arg("m"), nb::arg("n"), nb::arg("n_packed"), nb::arg("k"), nb::arg("swizzle"),
      nb::arg("raster"), nb::arg("splits"), nb::arg("xs"), nb::arg("packed"), nb::arg("out"), nb::arg("workspace"),
      nb::arg("workspace_bytes"), nb::arg("calls"), nb::arg("samples"));

  // The current CUDA device's facts the selection reads (zeros when there is no GPU).
  m.def("device_facts", []() {
    nb::dict d;
    jax_swiglu::DeviceFacts facts{};
    const bool ok = jax_swiglu::CurrentDeviceFacts(&facts).empty();
    d["sm_count"] = ok ? facts.sm_count : 0;
    d["compute_capability"] = ok ? facts.cc_major * 10 + facts.cc_minor : 0;
    int l2 = 0, memory_khz = 0, bus_bits = 0;
    if (ok) {
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, facts.device);
      cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, facts.device);
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, facts.device);
      (void)cudaGetLastError();
    }
    d["l2_bytes"] = l2;
    // Peak DRAM bandwidth from the memory clock (double data rate) and the bus width.
    d["dram_bytes_per_s"] = 2.0 * 1e3 * memory_khz * (bus_bits / 8);
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
}
