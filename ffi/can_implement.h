// Whether a row of the config table can run a problem: the one statement of it.
//
// The launchers refuse a problem with this function's message before they touch the GPU, and
// the nanobind module exports it (with the split choices below), so the Python selection asks
// the same question before it picks a candidate and a forced launch fails at trace time with
// the same words. What only a launch can see (the buffers' alignment, CUTLASS's own
// can_implement on the built arguments) stays in the launchers.
//
// Plain C++, no CUDA: the nanobind module includes it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernel_configs.h"
#include "launch.h"

namespace jax_swiglu {

// Split-K factors the handlers accept for a stream-K row, and the ones worth trying (the
// selection's candidates, measured by the calibration).
inline constexpr int kMaxSplits = 16;
inline constexpr int kStreamKSplitChoices[] = {1, 2, 4};
// Cluster sizes the gemv kernel splits K over (the portable maximum is 8).
inline constexpr int kGemvSplitChoices[] = {1, 2, 4, 8};

// K a row needs a multiple of: 16-byte rows of its operands for TMA (8 elements of 16 bits,
// 16 of fp8) and the gemv kernel's 16-byte loads.
constexpr int64_t KMultiple(const KernelConfig& c) {
  return c.operands == Operands::Fp8E4m3 ? 16 : 8;
}

// K steps of a row's split unit: the gemv kernel's warp steps, a stream-K tile's k tiles.
constexpr int64_t KSteps(const KernelConfig& c, int64_t k) {
  return (k + c.tile_k - 1) / c.tile_k;
}

inline const char* FamilyName(Family f) {
  switch (f) {
    case Family::GateThenUp:
      return "gate_then_up";
    case Family::Gemv:
      return "gemv";
    default:
      return "interleaved";
  }
}

// "config <id> (<family>)": how messages name a row.
inline std::string RowName(const KernelConfig& c) {
  return std::string("config ") + std::to_string(c.id) + " (" + FamilyName(c.family) +
         (c.operands == Operands::Fp8E4m3 ? ", e4m3" : "") +
         (c.accumulation == Accumulation::Fast               ? ", fast accumulation"
          : c.accumulation == Accumulation::PromotedInHalves ? ", promoted in halves"
                                                             : "") +
         ")";
}

// The splits a row may run with on K: the selection's candidates.
inline std::vector<int> SplitChoices(const KernelConfig& c, int64_t k) {
  std::vector<int> choices;
  if (c.scheduler == TileScheduler::ClusterSplitK) {
    for (int s : kGemvSplitChoices) {
      if (s <= KSteps(c, k)) choices.push_back(s);
    }
  } else if (c.scheduler == TileScheduler::StreamK) {
    for (int s : kStreamKSplitChoices) {
      if (s == 1 || s <= KSteps(c, k)) choices.push_back(s);
    }
  } else {
    choices.push_back(1);
  }
  return choices;
}

// Why row `c` cannot take x [m, k] and n outputs from `columns` streamed weight columns: the
// sizes its 32-bit indices hold, 16-byte rows for TMA and the 16-byte loads, a compiled row;
// or "".
inline std::string CannotTakeShapes(const KernelConfig& c, int64_t m, int64_t n, int64_t k,
                                    int64_t columns) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (m < 0 || n <= 0 || k <= 0 || m > kMax || k > kMax || columns > kMax) {
    return "M, N and K must be in 0..2^31 - 1 (N and K positive); got M=" + std::to_string(m) +
           " N=" + std::to_string(n) + " K=" + std::to_string(k);
  }
  if (k % KMultiple(c) != 0 || n % 8 != 0) {
    return RowName(c) + " needs K a multiple of " + std::to_string(KMultiple(c)) +
           " and N a multiple of 8 (16-byte rows); got K=" + std::to_string(k) +
           ", N=" + std::to_string(n);
  }
  if (!c.compiled()) {
    return RowName(c) + " is not compiled in this build (install with JAX_SWIGLU_ALL_CONFIGS=1)";
  }
  return {};
}

// Why gemv row `c` cannot split K=k over a cluster of `splits` CTAs, or "".
inline std::string CannotSplitClusterK(const KernelConfig& c, int64_t k, int splits) {
  bool cluster_size = false;
  for (int s : kGemvSplitChoices) cluster_size |= splits == s;
  if (!cluster_size) {
    return RowName(c) + " splits K over a cluster of 1, 2, 4 or 8 CTAs; got splits=" +
           std::to_string(splits);
  }
  if (splits > KSteps(c, k)) {
    return RowName(c) + " cannot split K=" + std::to_string(k) + " " + std::to_string(splits) +
           " ways (a step of " + std::to_string(c.tile_k) + " rows per split at least)";
  }
  return {};
}

// Why row `c` cannot run with the promotion interval `promotion`
// (SwigluProblem::fp8_promotion), or "".
inline std::string CannotPromote(const KernelConfig& c, int promotion) {
  if (c.accumulation == Accumulation::Fast) {
    if (promotion != kFastAccumulation) {
      return RowName(c) + " accumulates in the tensor cores (fast accumulation) and cannot "
                          "promote; got promotion=" + std::to_string(promotion) +
             " (0 is its only value)";
    }
  } else if (c.operands == Operands::Fp8E4m3) {
    // CUTLASS promotes after whole k tiles: an interval of their wgmma (32 of K each), or
    // once at the end (kFastAccumulation).
    const int per_tile = c.tile_k / 32;
    if (promotion != kFastAccumulation &&
        (promotion < 2 || promotion > 64 || promotion % per_tile != 0)) {
      return RowName(c) + " promotes after whole k tiles of " + std::to_string(per_tile) +
             " wgmma (an interval in 2..64, or 0 for fast accumulation); got promotion=" +
             std::to_string(promotion);
    }
  }
  return {};
}

// Why row `c` cannot run `p` (its shapes and launch attributes; pointers unread), or "" if it
// can.
inline std::string CannotRun(const KernelConfig& c, const SwigluProblem& p) {
  const std::string name = RowName(c);
  if (std::string err = CannotTakeShapes(c, p.m, p.n, p.k, 2 * p.n_packed); !err.empty()) {
    return err;
  }
  if (c.max_m() > 0 && p.m > c.max_m()) {
    return name + " runs at most " + std::to_string(c.max_m()) + " tokens; got M=" +
           std::to_string(p.m);
  }
  if (p.m % c.m_multiple() != 0) {
    return name + " runs M in " + std::to_string(c.m_bands) +
           " bands and needs M to be a multiple of " + std::to_string(c.m_multiple()) +
           "; got M=" + std::to_string(p.m);
  }
  if (c.grouped() != (p.experts > 0)) {
    return c.grouped() ? name + " runs grouped (expert) calls only: it needs the experts' "
                                "weights and group sizes"
                       : name + " is not a grouped row: it cannot run a call over " +
                             std::to_string(p.experts) + " experts";
  }
  if (c.grouped()) {
    // The tile coordinates pack an expert in an int32 (ExpertTile) and the walk counts tiles
    // in 32 bits (expert_groups.cuh).
    const int64_t tiles_n = (2 * p.n_packed + c.tile_n - 1) / c.tile_n;
    const int64_t groups = (p.experts < p.m ? p.experts : p.m) + 1;
    const int64_t max_tiles = ((p.m + c.tile_m - 1) / c.tile_m + groups) * tiles_n;
    if (p.experts >= (int64_t(1) << 21) || max_tiles >= (int64_t(1) << 31)) {
      return name + " runs fewer than 2^21 experts and 2^31 tiles; got " +
             std::to_string(p.experts) + " experts of M=" + std::to_string(p.m) + " rows";
    }
    if (p.swizzle != 1 || p.raster != 0) {
      return name + " walks the experts' tiles in its own order and takes no swizzle or "
                    "raster; got swizzle=" + std::to_string(p.swizzle) + " raster=" +
             std::to_string(p.raster);
    }
  }
  if (p.swizzle != 1 && p.swizzle != 2 && p.swizzle != 4 && p.swizzle != 8) {
    return "swizzle must be 1, 2, 4 or 8; got " + std::to_string(p.swizzle);
  }
  if (p.raster < 0 || p.raster > 2) {
    return "raster must be 0 (heuristic), 1 (along M) or 2 (along N); got " +
           std::to_string(p.raster);
  }
  if (c.scheduler == TileScheduler::SplitTail && p.swizzle != 1) {
    // The mainloop plans the split on tiles padded to whole clusters, not to swizzle groups.
    return name + " splits its last round of tiles and takes no swizzle; got swizzle=" +
           std::to_string(p.swizzle);
  }
  if (c.scheduler == TileScheduler::ClusterSplitK) {
    if (std::string err = CannotSplitClusterK(c, p.k, p.splits); !err.empty()) return err;
  } else if (c.scheduler == TileScheduler::StreamK) {
    if (p.splits < 1 || p.splits > kMaxSplits) {
      return name + " takes splits in 1.." + std::to_string(kMaxSplits) + "; got splits=" +
             std::to_string(p.splits);
    }
  } else if (p.splits != 1) {
    return name + " has no split-K (only stream-K and gemv rows take splits); got splits=" +
           std::to_string(p.splits);
  }
  return CannotPromote(c, p.fp8_promotion);
}

// Why gemv row `c` cannot run the plain projection `p` (the decode form's down projection:
// LaunchGemvProjection), or "" if it can.
inline std::string CannotRunProjection(const KernelConfig& c, const ProjectionProblem& p) {
  const std::string name = RowName(c);
  if (c.family != Family::Gemv) {
    return name + " is not a gemv row: only the decode form runs a plain projection";
  }
  if (std::string err = CannotTakeShapes(c, p.m, p.n, p.k, p.n); !err.empty()) return err;
  if (p.m > c.max_m()) {
    return name + " runs at most " + std::to_string(c.max_m()) + " tokens; got M=" +
           std::to_string(p.m);
  }
  if (std::string err = CannotSplitClusterK(c, p.k, p.splits); !err.empty()) return err;
  return CannotPromote(c, p.fp8_promotion);
}

}  // namespace jax_swiglu
