// Pairing gate with up in a wgmma accumulator fragment: where a thread's gate and up values
// sit for each kernel (a `Pairs` policy), and the rounded output words of a pair and of a
// 32-column run, which both stores write.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>

#include <cstdint>

#include "../../kernel_configs.h"
#include "../activations.cuh"

namespace jax_swiglu {

// Where a thread's gate and up accumulators pair up, for each kernel. Accumulator
// fragments of a wgmma are ((2 adjacent columns, 2 rows 8 apart, kBlocks blocks of 8
// columns), MMA_M, MMA_N), MMA_N counting atoms of 8 * kBlocks columns along N; a policy
// says which (block, mma_n) hold gate values, where their up partners are, which output
// column a gate's tile-local packed column is, and how the pair combines.

// How every policy combines a gate with its up partner: act(g) * u in fp32.
// kAlternateReciprocal: the sigmoid's reciprocal alternates Newton (even columns) and
// MUFU.RCP (odd), for the cooperative schedule, or is MUFU.RCP on both, for pingpong (see
// Sigmoid). kActivation: the gate's activation (Activate). `column`: 0 or 1, which of a
// thread's two adjacent columns.
template <bool kAlternateReciprocal, Activation kActivation>
struct GatedProduct {
  template <int column>
  CUTLASS_DEVICE static float Combine(float gate, float up) {
    return Activate<kActivation, kAlternateReciprocal && column == 0>(gate) * up;
  }
};

// Interleaved kernel: the tile spans [gate block | up block | ...] of kGateUpBlock columns
// each, so the up partner of 8-column block q of the tile (q = mma_n * kBlocks + block) is
// block q + kGateUpBlock / 8, and the activation is still due. In every compiled config the
// atom holds whole pairs (config 8's 320-wide tile runs 64-wide atoms), so the partner is in
// the same atom; an atom width that is not a multiple of 64 (say 160) would put it in the next.
template <bool kAlternateReciprocal, Activation kActivation>
struct InterleavedPairs : GatedProduct<kAlternateReciprocal, kActivation> {
  static constexpr int kBlocksPerHalf = kGateUpBlock / 8;
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int block, int mma_n) {
    return ((mma_n * kBlocks + block) / kBlocksPerHalf) % 2 == 0;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block, int mma_n) {
    return (mma_n * kBlocks + block + kBlocksPerHalf) % kBlocks;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int block, int mma_n) {
    return (mma_n * kBlocks + block + kBlocksPerHalf) / kBlocks;
  }
  CUTLASS_HOST_DEVICE static constexpr int OutputColumn(int packed_n) {
    return (packed_n / (2 * kGateUpBlock)) * kGateUpBlock + packed_n % kGateUpBlock;
  }
};

// (The pairing depends on neither the activation nor the reciprocal: checked on two.)
namespace pairing_check {
using Straddling = InterleavedPairs<true, Activation::Silu>;
using WithinAtom = InterleavedPairs<false, Activation::GeluTanh>;
}  // namespace pairing_check
// The pairing, checked where a pair straddles two atoms: with 160-wide atoms (20 blocks),
// packed columns 128-159 (atom 0, blocks 16-19) are gate and their up partners are columns
// 160-191 (atom 1, blocks 0-3); columns 160-191 themselves are up.
static_assert(pairing_check::Straddling::IsGate<20>(16, 0) &&
                  pairing_check::Straddling::UpBlock<20>(16, 0) == 0 &&
                  pairing_check::Straddling::UpMmaN<20>(16, 0) == 1 &&
                  pairing_check::Straddling::UpBlock<20>(19, 0) == 3 &&
                  !pairing_check::Straddling::IsGate<20>(0, 1) &&
                  pairing_check::Straddling::IsGate<20>(4, 1) &&
                  pairing_check::Straddling::UpBlock<20>(4, 1) == 8 &&
                  pairing_check::Straddling::UpMmaN<20>(4, 1) == 1,
              "gate/up pairing across MMA atoms");
// ... and within one 64-wide atom (8 blocks): blocks 0-3 gate, partners 4-7.
static_assert(pairing_check::WithinAtom::IsGate<8>(3, 2) &&
                  !pairing_check::WithinAtom::IsGate<8>(4, 2) &&
                  pairing_check::WithinAtom::UpBlock<8>(3, 2) == 7 &&
                  pairing_check::WithinAtom::UpMmaN<8>(3, 2) == 2,
              "gate/up pairing within an MMA atom");

template <class Pairs>
inline constexpr bool kIsInterleavedPairs = false;
template <bool kAlternateReciprocal, Activation kActivation>
inline constexpr bool kIsInterleavedPairs<InterleavedPairs<kAlternateReciprocal, kActivation>> =
    true;

// Gate-then-up kernel: the gate pass accumulates into MMA_N index 0 and the up pass into
// index 1; the activation is due here, as in InterleavedPairs, so it runs in the epilogue,
// outside the mainloop's ordered region of the pingpong schedule.
template <bool kAlternateReciprocal, Activation kActivation>
struct SequentialPairs : GatedProduct<kAlternateReciprocal, kActivation> {
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr bool IsGate(int /*block*/, int mma_n) {
    return mma_n == 0;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpBlock(int block, int /*mma_n*/) {
    return block;
  }
  template <int kBlocks>
  CUTLASS_HOST_DEVICE static constexpr int UpMmaN(int /*block*/, int /*mma_n*/) {
    return 1;
  }
  CUTLASS_HOST_DEVICE static constexpr int OutputColumn(int packed_n) { return packed_n; }
};

// A 32-column run of the layout is 4 of a wgmma fragment's 8-column blocks; in each, lane
// q of a quad holds columns 2q and 2q + 1, so its 4 pairs of a run are the run's output
// columns 8q .. 8q + 7 (the quad transpose, jax_swiglu/_layout.py): one 16-byte store.
inline constexpr int kRunBlocks = kGateUpBlock / 8;

// One output pair: the gate accumulators (0 | 1, row, block) of atom (mma_m, mma_n) and
// their up partners (where `Pairs` puts them), combined in fp32 and rounded once into one
// 4-byte word, output columns n and n + 1 (n even).
template <class Pairs, class ElementD, int kBlocks, class AccEngine, class AccLayout>
CUTLASS_DEVICE uint32_t RoundedPair(cute::Tensor<AccEngine, AccLayout> const& accumulators,
                                    int row, int block, int mma_m, int mma_n) {
  using cute::make_coord;
  static_assert(kGateUpBlock == 32 && sizeof(ElementD) == 2, "4 pairs of 2 bytes per run");
  const int up_block = Pairs::template UpBlock<kBlocks>(block, mma_n);
  const int up_mma_n = Pairs::template UpMmaN<kBlocks>(block, mma_n);
  auto gate0 = make_coord(make_coord(0, row, block), mma_m, mma_n);
  auto gate1 = make_coord(make_coord(1, row, block), mma_m, mma_n);
  auto up0 = make_coord(make_coord(0, row, up_block), mma_m, up_mma_n);
  auto up1 = make_coord(make_coord(1, row, up_block), mma_m, up_mma_n);
  cutlass::Array<float, 2> value;
  value[0] = Pairs::template Combine<0>(accumulators(gate0), accumulators(up0));
  value[1] = Pairs::template Combine<1>(accumulators(gate1), accumulators(up1));
  cutlass::NumericArrayConverter<ElementD, float, 2, cutlass::FloatRoundStyle::round_to_nearest>
      convert;
  cutlass::Array<ElementD, 2> rounded = convert(value);
  return reinterpret_cast<uint32_t const&>(rounded);
}

// The 4 pairs of the 32-column run starting at gate block `block`: 8 output columns.
template <class Pairs, class ElementD, int kBlocks, class AccEngine, class AccLayout>
CUTLASS_DEVICE uint4 RunWords(cute::Tensor<AccEngine, AccLayout> const& accumulators, int row,
                              int block, int mma_m, int mma_n) {
  return {RoundedPair<Pairs, ElementD, kBlocks>(accumulators, row, block + 0, mma_m, mma_n),
          RoundedPair<Pairs, ElementD, kBlocks>(accumulators, row, block + 1, mma_m, mma_n),
          RoundedPair<Pairs, ElementD, kBlocks>(accumulators, row, block + 2, mma_m, mma_n),
          RoundedPair<Pairs, ElementD, kBlocks>(accumulators, row, block + 3, mma_m, mma_n)};
}

}  // namespace jax_swiglu
