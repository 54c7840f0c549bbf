// A row of the config table launched through its family's launcher, after the one check of
// whether it can run the problem (can_implement.h): what the FFI handlers and the tuning
// timer call. Plain C++; the launchers it names are instantiated in the kernel translation
// units.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "can_implement.h"
#include "kernel_configs.h"
#include "launch.h"

namespace jax_swiglu {

// Why row `config`'s kernel of `Element` and `kActivation` is not in this build, or "".
template <class Element, Activation kActivation>
std::string NotCompiled(const KernelConfig& config) {
  constexpr bool kFloat16 = std::is_same_v<Element, F16>;
  if (config.compiled(kFloat16, kActivation)) return {};
  return RowName(config) + " has no " + (kFloat16 ? "float16" : "bfloat16") + " " +
         ActivationName(kActivation) + " kernel in this build (install with "
         "JAX_SWIGLU_ALL_CONFIGS=1)";
}

template <int ConfigId, class Element, Activation kActivation>
std::string LaunchRow(const SwigluProblem& problem, const DeviceFacts& device,
                      cudaStream_t stream) {
  constexpr KernelConfig config = kConfigs[ConfigId];
  if (std::string err = CannotRun(config, problem); !err.empty()) return err;
  if constexpr (!config.compiled(std::is_same_v<Element, F16>, kActivation)) {
    return NotCompiled<Element, kActivation>(config);
  } else if constexpr (config.family == Family::Interleaved) {
    return LaunchInterleaved<ConfigId, Element, kActivation>(problem, device, stream);
  } else if constexpr (config.family == Family::GateThenUp) {
    return LaunchGateThenUp<ConfigId, Element, kActivation>(problem, device, stream);
  } else {
    return LaunchGemv<ConfigId, Element, kActivation>(problem, device, stream);
  }
}

template <int ConfigId, class Element, Activation kActivation>
size_t RowWorkspaceBytes(const SwigluProblem& problem, const DeviceFacts& device) {
  constexpr Family family = kConfigs[ConfigId].family;
  if constexpr (!kConfigs[ConfigId].compiled(std::is_same_v<Element, F16>, kActivation)) {
    return 0;  // never launched: LaunchRow says why
  } else if constexpr (family == Family::Interleaved) {
    return InterleavedWorkspaceBytes<ConfigId, Element, kActivation>(problem, device);
  } else if constexpr (family == Family::GateThenUp) {
    return GateThenUpWorkspaceBytes<ConfigId, Element, kActivation>(problem, device);
  } else {
    return GemvWorkspaceBytes<ConfigId, Element, kActivation>(problem, device);
  }
}

}  // namespace jax_swiglu
