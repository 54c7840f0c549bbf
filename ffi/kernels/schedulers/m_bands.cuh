// Tiles visited in bands of M: a persistent tile order that keeps x's band in L2.
//
// CUTLASS's persistent scheduler walks the tiles down M first when there are more columns of
// tiles than rows (every Qwen2.5 shape at M = 8192): each round of tiles (one per CTA) covers
// all of M for a few columns, so every round reads all of x again. Once x outgrows the L2 (tens
// of MB at M = 8192) it is read from DRAM round after round, and the kernel moves a good deal
// more DRAM traffic than cuBLAS's GEMM on the same shape (Nsight Compute; docs/design.md).
// With kBands bands, the scheduler runs the problem as if it were kBands problems of M / kBands
// rows one after the other, in the same order within each: a band's x (16 MB at 3B) is what
// the rounds read again, and each weight column is read once per band.
//
// It orders a virtual problem of M / kBands rows and kBands times the columns of tiles (CUTLASS's
// scheduler, unchanged, on that shape), and maps its tile (m, n) to band n / tiles_n: rows
// m + band * (M / kBands), column n % tiles_n. So M must be a multiple of kBands whole
// clusters of tiles (the launcher refuses other M), and clusters must not span columns.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include <climits>
#include <cstdint>

namespace jax_swiglu {

template <int kBands>
class MBandsScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  struct Params : Base::Params {
    int32_t tiles_n = INT_MAX;  // columns of tiles of the real problem, one band's worth
    int32_t band_tiles_m = 0;   // rows of tiles in a band
  };

  // The virtual problem: M / kBands rows, kBands bands of whole columns of tiles side by side.
  template <class ProblemShapeMNKL, class TileShape>
  CUTLASS_HOST_DEVICE static auto VirtualShape(ProblemShapeMNKL problem_shape_mnkl, TileShape) {
    auto shape = cute::append<4>(problem_shape_mnkl, cute::Int<1>{});
    constexpr int kTileN = cute::size<1>(TileShape{});
    const int n_tiles = (static_cast<int>(cute::get<1>(shape)) + kTileN - 1) / kTileN;
    return cute::make_shape(static_cast<int>(cute::get<0>(shape)) / kBands, kBands * n_tiles * kTileN,
                            static_cast<int>(cute::get<2>(shape)), static_cast<int>(cute::get<3>(shape)));
  }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    static_assert(cute::size<1>(ClusterShape{}) == 1, "a cluster must not span two bands");
    constexpr int kTileM = cute::size<0>(TileShape{});
    constexpr int kTileN = cute::size<1>(TileShape{});
    auto shape = cute::append<4>(problem_shape_mnkl, cute::Int<1>{});
    Params params;
    static_cast<Base::Params&>(params) = Base::to_underlying_arguments(
        VirtualShape(problem_shape_mnkl, tile_shape), tile_shape, cluster_shape, hw_info, arguments,
        workspace, epilogue_subtile, ktile_start_alignment_count);
    params.tiles_n = (static_cast<int>(cute::get<1>(shape)) + kTileN - 1) / kTileN;
    params.band_tiles_m = static_cast<int>(cute::get<0>(shape)) / kBands / kTileM;
    return params;
  }

  // The grid for the virtual problem (the same count of tiles).
  template <class ProblemShapeMNK, class BlockShape, class ClusterShape>
  CUTLASS_HOST_DEVICE static dim3 get_grid_shape(Params const& params,
                                                 ProblemShapeMNK problem_shape_mnk,
                                                 BlockShape cta_shape, ClusterShape cluster_shape,
                                                 cutlass::KernelHardwareInfo hw_info,
                                                 Arguments arguments = Arguments{},
                                                 bool truncate_by_problem_size = true) {
    return Base::get_grid_shape(params, VirtualShape(problem_shape_mnk, cta_shape), cta_shape,
                                cluster_shape, hw_info, arguments, truncate_by_problem_size);
  }

  // M must split into kBands bands of whole clusters of tiles.
  CUTLASS_HOST_DEVICE static bool BandsFit(int m, int tile_m, int cluster_m) {
    return m % (kBands * tile_m * cluster_m) == 0;
  }

  CUTLASS_HOST_DEVICE MBandsScheduler() {}

  CUTLASS_DEVICE explicit MBandsScheduler(Params const& params)
      : Base(params), tiles_n_(params.tiles_n), band_tiles_m_(params.band_tiles_m) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape cluster_shape) {
    return ToReal(Base::initial_work_tile_info(cluster_shape));
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return ToReal(Base::get_current_work()); }

  template <class WorkTileInfo_>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo_ work_tile_info) {
    auto [next, increment] = Base::fetch_next_work(work_tile_info);
    return cute::make_tuple(ToReal(next), increment);
  }

  template <class WorkTileInfo_, class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo_ work_tile_info, Pipeline&, PipelineState) {
    return fetch_next_work(work_tile_info);
  }

 private:
  // Virtual tile -> real tile. At most kBands - 1 steps: no division on the producer's path
  // between two tiles' loads.
  CUTLASS_DEVICE WorkTileInfo ToReal(WorkTileInfo work) const {
    if (!work.is_valid()) return work;
    CUTLASS_PRAGMA_UNROLL
    for (int band = 1; band < kBands; ++band) {
      if (work.N_idx >= tiles_n_) {
        work.N_idx -= tiles_n_;
        work.M_idx += band_tiles_m_;
      }
    }
    return work;
  }

  int32_t tiles_n_ = INT_MAX;
  int32_t band_tiles_m_ = 0;
};

// The tag GemmUniversal takes, resolved below.
template <int kBands>
struct MBandsPersistentScheduler {};

}  // namespace jax_swiglu

namespace cutlass::gemm::kernel::detail {

template <int kBands, class ArchTag, class TileShape, class ClusterShape,
          uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_swiglu::MBandsPersistentScheduler<kBands>, ArchTag, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = jax_swiglu::MBandsScheduler<kBands>;
};

}  // namespace cutlass::gemm::kernel::detail
