// XLA FFI handlers for the fused SwiGLU kernels and the nanobind module that hands them
// to Python (jax_swiglu/_native.py registers every capsule in `registrations()`).
//
// Handlers are typed, take the stream from PlatformStream<cudaStream_t>, validate
// everything they are given, and report problems as ffi::Error values: they never throw,
// abort, synchronize or allocate, so they are safe inside XLA's command buffers.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <optional>
#include <string>
#include <type_traits>

#include "kernel_configs.h"
#include "launch.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jax_swiglu {
namespace {

template <ffi::DataType T>
using ElementTagFor = std::conditional_t<T == ffi::DataType::BF16, BF16, F16>;

// Runtime config id -> the instantiation `launch(std::integral_constant<int, id>)`.
template <int Id, int Count, class Launch>
std::string DispatchConfig(const char* kernel, int64_t config, Launch&& launch) {
  if constexpr (Id == Count) {
    return std::string("unknown ") + kernel + " kernel config " + std::to_string(config);
  } else {
    if (config == Id) return launch(std::integral_constant<int, Id>{});
    return DispatchConfig<Id + 1, Count>(kernel, config, launch);
  }
}

// The kernel families: name, config id -> launch, and config id -> workspace bytes (an
// error message for an unknown id), over each one's config table.
struct Interleaved {
  static constexpr const char* kName = "interleaved";
  template <class ElementTag>
  static std::string Launch(int64_t config, const SwigluProblem& problem,
                            const DeviceFacts& device, cudaStream_t stream) {
    return DispatchConfig<0, JAX_SWIGLU_NUM_INTERLEAVED_CONFIGS>(kName, config, [&](auto id) {
      return LaunchInterleaved<decltype(id)::value, ElementTag>(problem, device, stream);
    });
  }
  template <class ElementTag>
  static std::string WorkspaceBytes(int64_t config, const SwigluProblem& problem,
                                    const DeviceFacts& device, size_t* bytes) {
    return DispatchConfig<0, JAX_SWIGLU_NUM_INTERLEAVED_CONFIGS>(kName, config, [&](auto id) {
      *bytes = InterleavedWorkspaceBytes<decltype(id)::value, ElementTag>(problem, device);
      return std::string();
    });
  }
};

struct Pingpong {
  static constexpr const char* kName = "pingpong";
  template <class ElementTag>
  static std::string Launch(int64_t config, const SwigluProblem& problem,
                            const DeviceFacts& device, cudaStream_t stream) {
    return DispatchConfig<0, JAX_SWIGLU_NUM_PINGPONG_CONFIGS>(kName, config, [&](auto id) {
      return LaunchPingpong<decltype(id)::value, ElementTag>(problem, device, stream);
    });
  }
  template <class ElementTag>
  static std::string WorkspaceBytes(int64_t config, const SwigluProblem& problem,
                                    const DeviceFacts& device, size_t* bytes) {
    return DispatchConfig<0, JAX_SWIGLU_NUM_PINGPONG_CONFIGS>(kName, config, [&](auto id) {
      *bytes = PingpongWorkspaceBytes<decltype(id)::value, ElementTag>(problem, device);
      return std::string();
    });
  }
};

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

// `workspace`: present where the config needs one (the lowering sizes it with
// workspace_bytes below); the launcher checks that it is large enough.
template <class Family, ffi::DataType T>
ffi::Error Swiglu(cudaStream_t stream, ffi::Buffer<T> x, ffi::Buffer<T> packed,
                  ffi::Result<ffi::Buffer<T>> out,
                  std::optional<ffi::Result<ffi::AnyBuffer>> workspace, int64_t config,
                  int64_t swizzle, int64_t raster) {
  SwigluProblem problem;
  if (ffi::Error err = DescribeProblem(x, packed, *out, &problem); err.failure()) return err;
  if (workspace.has_value()) {
    problem.workspace = (*workspace)->untyped_data();
    problem.workspace_bytes = (*workspace)->size_bytes();
  }
  if ((swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) || raster < 0 ||
      raster > 2) {
    return ffi::Error::InvalidArgument("jax_swiglu: swizzle must be 1, 2, 4 or 8 and raster "
                                       "0, 1 or 2; got " + std::to_string(swizzle) + ", " +
                                       std::to_string(raster));
  }
  problem.swizzle = static_cast<int>(swizzle);
  problem.raster = static_cast<int>(raster);
  if (problem.m == 0) return ffi::Error::Success();  // nothing to write
  DeviceFacts device;
  if (ffi::Error err = CheckDevice(&device); err.failure()) return err;
  std::string err = Family::template Launch<ElementTagFor<T>>(config, problem, device, stream);
  if (!err.empty()) return ffi::Error::Internal("jax_swiglu: " + err);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_swiglu

#define JAX_SWIGLU_DEFINE_HANDLER(symbol, family, dtype)                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, (jax_swiglu::Swiglu<family, dtype>),    \
                                ffi::Ffi::Bind()                                \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()   \
                                    .Arg<ffi::Buffer<dtype>>()                  \
                                    .Arg<ffi::Buffer<dtype>>()                  \
                                    .Ret<ffi::Buffer<dtype>>()                  \
                                    .OptionalRet<ffi::AnyBuffer>()              \
                                    .Attr<int64_t>("config")                    \
                                    .Attr<int64_t>("swizzle")                   \
                                    .Attr<int64_t>("raster"),                   \
                                {ffi::Traits::kCmdBufferCompatible})

JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleavedBf16, jax_swiglu::Interleaved, ffi::DataType::BF16);
JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluInterleavedF16, jax_swiglu::Interleaved, ffi::DataType::F16);
JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluPingpongBf16, jax_swiglu::Pingpong, ffi::DataType::BF16);
JAX_SWIGLU_DEFINE_HANDLER(JaxSwigluPingpongF16, jax_swiglu::Pingpong, ffi::DataType::F16);

namespace {

const char* ScheduleName(jax_swiglu::Schedule s) {
  return s == jax_swiglu::Schedule::Cooperative ? "cooperative" : "pingpong";
}

const char* SchedulerName(jax_swiglu::TileScheduler s) {
  switch (s) {
    case jax_swiglu::TileScheduler::StreamK:
      return "stream-k";
    case jax_swiglu::TileScheduler::SplitTail:
      return "split-tail";
    default:
      return "persistent";
  }
}

// Every FFI target: its name (which says what runs), the kernel and dtype it runs, and
// its handler. The one list that both functions below read.
struct Target {
  const char* name;
  const char* kernel;
  const char* dtype;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};
const Target kTargets[] = {
    {"jax_swiglu_interleaved_bf16", "interleaved", "bfloat16", JaxSwigluInterleavedBf16},
    {"jax_swiglu_interleaved_f16", "interleaved", "float16", JaxSwigluInterleavedF16},
    {"jax_swiglu_pingpong_bf16", "pingpong", "bfloat16", JaxSwigluPingpongBf16},
    {"jax_swiglu_pingpong_f16", "pingpong", "float16", JaxSwigluPingpongF16},
};

// A family's workspace size for a dtype given by name ("" or an error message).
template <class Family>
std::string WorkspaceBytes(const std::string& dtype, int64_t config,
                           const jax_swiglu::SwigluProblem& problem,
                           const jax_swiglu::DeviceFacts& device, size_t* bytes) {
  if (dtype == "bfloat16") {
    return Family::template WorkspaceBytes<jax_swiglu::BF16>(config, problem, device, bytes);
  }
  if (dtype == "float16") {
    return Family::template WorkspaceBytes<jax_swiglu::F16>(config, problem, device, bytes);
  }
  return "unknown dtype " + dtype;
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "jax_swiglu native kernels: XLA FFI handlers and their configuration table.";

  // FFI target name -> handler capsule, for jax.ffi.register_ffi_target.
  m.def("registrations", []() {
    nb::dict d;
    for (const Target& t : kTargets) d[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
    return d;
  });

  // (name, kernel, dtype) of every target, so Python never spells a target name itself.
  m.def("targets", []() {
    nb::list l;
    for (const Target& t : kTargets) {
      nb::dict d;
      d["name"] = t.name;
      d["kernel"] = t.kernel;
      d["dtype"] = t.dtype;
      l.append(d);
    }
    return l;
  });

  // The compiled tile configurations (ffi/kernel_configs.h), by kernel.
  m.def("kernel_configs", []() {
    nb::list l;
    auto add = [&l](const char* kernel, const auto& table) {
      for (const jax_swiglu::KernelConfig& c : table) {
        nb::dict d;
        d["kernel"] = kernel;
        d["id"] = c.id;
        d["schedule"] = ScheduleName(c.schedule);
        d["tile_m"] = c.tile_m;
        d["tile_n"] = c.tile_n;
        d["tile_k"] = c.tile_k;
        d["cluster_m"] = c.cluster_m;
        d["cluster_n"] = c.cluster_n;
        d["scheduler"] = SchedulerName(c.scheduler);
        d["store"] = c.store == jax_swiglu::OutputStore::DirectStore ? "direct" : "tma";
        d["m_bands"] = c.m_bands;
        l.append(d);
      }
    };
    add(jax_swiglu::Interleaved::kName, jax_swiglu::kInterleavedConfigs);
    add(jax_swiglu::Pingpong::kName, jax_swiglu::kPingpongConfigs);
    return l;
  });

  // Bytes of workspace one call needs (0 for most configs): the lowering adds a scratch
  // output of this size to the custom call. `sm_count` is the GPU's (the stream-K split
  // depends on it); the handler rechecks the size against the GPU it runs on.
  m.def(
      "workspace_bytes",
      [](const std::string& kernel, const std::string& dtype, int64_t config, int64_t m,
         int64_t n, int64_t n_packed, int64_t k, int64_t swizzle, int64_t raster,
         int sm_count) -> size_t {
        constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
        if (m > kMax || k > kMax || 2 * n_packed > kMax) {
          throw std::invalid_argument("jax_swiglu: a dimension exceeds 2^31 - 1");
        }
        if (m <= 0) return 0;  // the handler launches nothing
        jax_swiglu::SwigluProblem problem{nullptr, nullptr, nullptr, m,
                                          n, n_packed, k, static_cast<int>(swizzle),
                                          static_cast<int>(raster)};
        jax_swiglu::DeviceFacts device{0, sm_count, 9, 0};
        size_t bytes = 0;
        std::string err = kernel == jax_swiglu::Interleaved::kName
                              ? WorkspaceBytes<jax_swiglu::Interleaved>(dtype, config, problem,
                                                                        device, &bytes)
                          : kernel == jax_swiglu::Pingpong::kName
                              ? WorkspaceBytes<jax_swiglu::Pingpong>(dtype, config, problem,
                                                                     device, &bytes)
                              : "unknown kernel " + kernel;
        if (!err.empty()) throw std::invalid_argument("jax_swiglu: " + err);
        return bytes;
      },
      nb::arg("kernel"), nb::arg("dtype"), nb::arg("config"), nb::arg("m"), nb::arg("n"),
      nb::arg("n_packed"), nb::arg("k"), nb::arg("swizzle"), nb::arg("raster"),
      nb::arg("sm_count"));

  // The current CUDA device's SM count, or 0 when there is none (no GPU, no driver).
  m.def("device_sm_count", []() {
    jax_swiglu::DeviceFacts facts;
    return jax_swiglu::CurrentDeviceFacts(&facts).empty() ? facts.sm_count : 0;
  });

  m.attr("gate_up_block") = jax_swiglu::kGateUpBlock;
}
