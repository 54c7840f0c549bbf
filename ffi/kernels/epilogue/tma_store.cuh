// The TMA store path of the SwiGLU epilogue (epilogue/swiglu_epilogue.cuh): registers ->
// swizzled shared memory -> one TMA store per tile. The store is not waited for: the next
// tile's mainloop runs while it drains, and only the next epilogue (or the kernel's
// store_tail) waits for it before reusing the shared-memory tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include <cstdint>

#include "../../kernel_configs.h"
#include "pairs.cuh"

namespace jax_swiglu {

// `Pairs` says where a thread's gate and up values sit (epilogue/pairs.cuh); the output tile
// is [kTileM, kTilePacked / 2] of ElementD.
template <class ElementD, int kTileM, int kTilePacked, class Pairs>
struct TmaStore {
  // The TMA store writes whole tiles at their own place, after a mainloop that loads them
  // there (no shifted edge rows: edge_tiles.cuh).
  static constexpr bool kShiftedRows = false;
  static constexpr int kTileN = kTilePacked / 2;  // output columns per tile

  // Output tile in shared memory, N-contiguous and swizzled, so the 16-byte stores of a warp
  // (8 rows x 64 bytes) hit every bank evenly and TMA reads it directly. The swizzle atom is
  // 8 rows x kAtomN columns: the 128-byte swizzle (64 columns) where the tile width allows,
  // else the 64-byte one (32 columns: a 96-column tile from 192 packed columns).
  static constexpr int kAtomN = kTileN % 64 == 0 ? 64 : 32;
  static_assert(kTileN % kAtomN == 0, "the output tile must be whole 32-column swizzle atoms");
  using SmemLayoutAtomD =
      cute::conditional_t<kAtomN == 64, cute::GMMA::Layout_K_SW128_Atom<ElementD>,
                          cute::GMMA::Layout_K_SW64_Atom<ElementD>>;
  using SmemLayoutD = decltype(cute::tile_to_shape(
      SmemLayoutAtomD{}, cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>>{}));

  // SmemLayoutD by hand, for the stores: (m, n)'s element offset before the swizzle, in
  // 8-row x kAtomN-column atoms placed M first. The swizzle (on byte addresses, from a
  // 1024-byte aligned tile) XORs the 16-byte chunk of a row (offset bits 3 on) with the
  // bits of the 128-byte line index (offset bits 6 on), 3 bits of each for the 128-byte
  // swizzle and 2 for the 64-byte one: Swizzled below.
  static constexpr int kSwizzleBits = kAtomN == 64 ? 3 : 2;
  CUTLASS_HOST_DEVICE static constexpr int LinearOffset(int m, int n) {
    return (m / 8) * 8 * kAtomN + (n / kAtomN) * kAtomN * kTileM + (m % 8) * kAtomN + n % kAtomN;
  }
  static constexpr int Swizzled(int offset) {
    return offset ^ (((offset >> 6) & ((1 << kSwizzleBits) - 1)) << 3);
  }
  static_assert(sizeof(ElementD) == 2 &&
                    cute::is_same_v<cute::remove_cvref_t<decltype(SmemLayoutD{}.layout_a())>,
                                    cute::Swizzle<kSwizzleBits, 4, 3>> &&
                    cute::is_same_v<cute::remove_cvref_t<decltype(SmemLayoutD{}.offset())>,
                                    cute::smem_ptr_flag_bits<16>>,
                "LinearOffset assumes a 128- or 64-byte swizzle on byte addresses of 16-bit "
                "elements");
  static_assert(SmemLayoutD{}.layout_b()(1, 0) == LinearOffset(1, 0) &&
                    SmemLayoutD{}.layout_b()(0, 9) == LinearOffset(0, 9) &&
                    SmemLayoutD{}.layout_b()(8, 0) == LinearOffset(8, 0) &&  // atoms M first
                    SmemLayoutD{}.layout_b()(9, 5) == LinearOffset(9, 5) &&
                    SmemLayoutD{}.layout_b()(kTileM - 1, kTileN - 1) ==
                        LinearOffset(kTileM - 1, kTileN - 1) &&
                    (kTileN <= kAtomN ||
                     SmemLayoutD{}.layout_b()(3, kAtomN) == LinearOffset(3, kAtomN)),
                "LinearOffset must match SmemLayoutD");

  // The stores' address split (store()): lane q of a quad, in row m0 (m0 < 16: a thread's
  // first row), stores its 16 bytes of the run at tile-local output column dn (a multiple
  // of 32) in row m0 + dm (dm a multiple of 8) at columns dn + 8q. The 16-byte chunk is
  // what the swizzle XORs, with bits of m % 8 = m0 % 8, so the swizzled offset is a
  // per-thread base plus one XOR with a per-thread constant, ChunkXor(m0, q).
  CUTLASS_HOST_DEVICE static constexpr int ChunkXor(int m0, int q) {
    return (8 * q) ^ ((((m0 % 8) * kAtomN >> 6) & ((1 << kSwizzleBits) - 1)) << 3);
  }
  static constexpr bool AddressSplitHolds() {
    for (int m0 = 0; m0 < 16; ++m0)
      for (int q = 0; q < 4; ++q)
        for (int dm = 0; m0 + dm < kTileM; dm += 8)
          for (int dn = 0; dn < kTileN; dn += kGateUpBlock)
            if (Swizzled(LinearOffset(m0 + dm, dn + 8 * q)) !=
                LinearOffset(m0, 0) + (LinearOffset(dm, dn) ^ ChunkXor(m0, q)))
              return false;
    return true;
  }
  static_assert(AddressSplitHolds(), "the per-thread address split must match the swizzle");
  // ... and a gate run starts an output run: its output column is a multiple of 32.
  static constexpr bool GateRunsStartOutputRuns() {
    for (int p = 0; p < kTilePacked; p += kGateUpBlock)
      if (Pairs::OutputColumn(p) % kGateUpBlock != 0) return false;
    return true;
  }
  static_assert(GateRunsStartOutputRuns(), "OutputColumn maps runs to runs");

  struct TensorStorage {
    alignas(1024) cute::ArrayEngine<ElementD, cute::cosize_v<SmemLayoutD>> smem_d;
  };
  static constexpr int kSharedBytes = static_cast<int>(sizeof(TensorStorage));

  using TmaStoreD = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{},
      cute::make_tensor(cute::make_gmem_ptr<ElementD>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0)),
                                          cute::make_stride(int64_t(0), cute::_1{}))),
      SmemLayoutD{}));

  struct Params {
    TmaStoreD tma_store_d;
    int n;  // output columns
  };

  // The TMA descriptor of out [m, n] (row-major).
  static Params Make(int m, ElementD* ptr_d, int n) {
    using namespace cute;
    Tensor tensor_d = make_tensor(make_gmem_ptr(ptr_d),
                                  make_layout(make_shape(int32_t(m), int32_t(n)),
                                              make_stride(int64_t(n), _1{})));
    return {make_tma_copy(SM90_TMA_STORE{}, tensor_d, SmemLayoutD{}), n};
  }

  CUTLASS_DEVICE static void Prefetch(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_store_d.get_tma_descriptor());
  }

  template <int kBlocks, class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL,
            class AccEngine, class AccLayout, class TiledMma>
  CUTLASS_DEVICE static void Store(Params const& params, ProblemShapeMNKL problem_shape_mnkl,
                                    TileShapeMNK tile_shape_mnk, TileCoordMNKL tile_coord_mnkl,
                                    cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                    TiledMma tiled_mma, int thread_idx,
                                    TensorStorage& shared_tensors) {
    using namespace cute;

    constexpr int kThreads = size(TiledMma{});
    auto sync_epilogue_threads = [] {
      cutlass::arch::NamedBarrier::sync(kThreads,
                                        cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    };

    // The previous tile's TMA store must be done reading shared memory before we
    // overwrite it. Only the issuing thread has a bulk group to wait on; for the others
    // the wait returns at once and the barrier holds them.
    tma_store_wait<0>();
    sync_epilogue_threads();

    // (m, packed n) tile coordinate of every accumulator this thread holds. The thread
    // index goes through an opaque move first: otherwise the compiler hoists these
    // loop-invariant values out of the persistent tile loop, and they sit in registers
    // through every mainloop, next to the accumulators (spilling in the pingpong kernel).
    int opaque_thread_idx;
    asm volatile("mov.b32 %0, %1;" : "=r"(opaque_thread_idx) : "r"(thread_idx));
    Tensor tAcc_coord = tiled_mma.get_slice(opaque_thread_idx)
                            .partition_C(make_identity_tensor(take<0, 2>(tile_shape_mnk)));
    static_assert(decltype(size(tAcc_coord))::value == decltype(size(accumulators))::value);

    // Shared-memory addresses without the generic layout arithmetic, which costs integer
    // instructions per store (the epilogue is issue-bound: the tensor cores wait). A
    // thread's runs sit at (m0 + dm, 8q + dn) for its first accumulator at (m0, p0 = 2q),
    // dm and dn compile-time: AddressSplitHolds.
    const int m0 = get<0>(tAcc_coord(0));
    const int p0 = get<1>(tAcc_coord(0));
    const int chunk_xor = ChunkXor(m0, p0 / 2);
    const uint32_t thread_base = cute::cast_smem_ptr_to_uint(shared_tensors.smem_d.begin()) +
                                 sizeof(ElementD) * LinearOffset(m0, 0);

    CUTLASS_PRAGMA_UNROLL
    for (int mma_n = 0; mma_n < size<2>(accumulators); ++mma_n) {
      CUTLASS_PRAGMA_UNROLL
      for (int mma_m = 0; mma_m < size<1>(accumulators); ++mma_m) {
        CUTLASS_PRAGMA_UNROLL
        for (int row = 0; row < 2; ++row) {
          CUTLASS_PRAGMA_UNROLL
          for (int block = 0; block < kBlocks; block += kRunBlocks) {
            if (!Pairs::template IsGate<kBlocks>(block, mma_n)) continue;
            const uint4 words = RunWords<Pairs, ElementD, kBlocks>(accumulators, row, block, mma_m, mma_n);
            auto coord = tAcc_coord(make_coord(make_coord(0, row, block), mma_m, mma_n));
            const int dm = get<0>(coord) - m0;                        // compile-time
            const int dn = Pairs::OutputColumn(get<1>(coord) - p0);   // compile-time
            const uint32_t address =
                thread_base + sizeof(ElementD) * (LinearOffset(dm, dn) ^ chunk_xor);
            // No "memory" clobber needed: the fence and barrier after the loop are volatile
            // asm too, so the stores stay before them.
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
                         :
                         : "r"(address), "r"(words.x), "r"(words.y), "r"(words.z), "r"(words.w));
          }
        }
      }
    }

    // Make the generic-proxy smem writes visible to the TMA (async proxy), then let one
    // thread issue the store of the whole tile. Rows/columns past (M, n) are clipped by TMA.
    cutlass::arch::fence_view_async_shared();
    sync_epilogue_threads();
    if (thread_idx == 0) {
      auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
      int m_total = get<0>(problem_shape_mnkl);
      Tensor mD = params.tma_store_d.get_tma_tensor(make_shape(m_total, params.n));
      Tensor gD = local_tile(mD, Shape<Int<kTileM>, Int<kTileN>>{}, make_coord(m_coord, n_coord));
      Tensor sD = make_tensor(make_smem_ptr(shared_tensors.smem_d.begin()), SmemLayoutD{});
      auto cta_tma = params.tma_store_d.get_slice(Int<0>{});
      copy(params.tma_store_d, cta_tma.partition_S(sD), cta_tma.partition_D(gD));
      tma_store_arrive();
    }
  }

  // Shared memory must outlive every TMA store that reads it (and, in the pingpong kernel,
  // the other warpgroup reuses the tile next).
  CUTLASS_DEVICE static void Drain() { cute::tma_store_wait<0>(); }
};

}  // namespace jax_swiglu
