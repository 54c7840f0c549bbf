"""The packed gate/up weight layout: the one place that defines it.

Both kernels read one packed matrix ``[K, 2 * N_pad]`` built from ``W_gate`` and
``W_up`` (each ``[K, N]``) by a *block interleave* of width ``GATE_UP_BLOCK = 32``::

    packed[:, 64*b      : 64*b + 32] = W_gate[:, 32*b : 32*b + 32]
    packed[:, 64*b + 32 : 64*b + 64] = W_up  [:, 32*b : 32*b + 32]

and, inside each 32-column run (of gate and of up alike), the columns are stored in
*quad-transposed* order: writing a run's column as ``c = 8 q + 2 j + e`` (``q, j`` in 0..3,
``e`` in 0..1), packed position ``8 j + 2 q + e`` holds column ``c``. The transpose swaps
``q`` and ``j``, so it is its own inverse. ``N`` is zero-padded up to a multiple of 32
(``N_pad``); the padded columns produce ``SiLU(0) * 0 = 0`` and are never stored.

Why this layout, and not the even/odd column interleave:

* Interleaved kernel (one GEMM over ``[M, 2N, K]``): a wgmma accumulator fragment keeps
  each 8-column block of a row in one thread. Since 32 is a multiple of 8, gate column
  ``n`` and up column ``n`` (32 packed columns apart, inside one 64-column pair) land in
  the same thread's registers, so the epilogue pairs them with no data movement, exactly
  as with even/odd interleave.
* The quad transpose: in a wgmma accumulator fragment, lane ``q`` of each 4-lane quad holds
  columns ``8 j + 2 q + e`` of a row (every 8-column block ``j``). Stored as they come, a
  thread's outputs are 4-byte pairs 16 bytes apart; with the transpose, positions
  ``8 j + 2 q + e`` hold a run's columns ``8 q .. 8 q + 7``, one 16-byte store per thread
  and run. With the direct store that measured faster on every small-model shape
  (docs/design.md); both kernels store this way.
* Pingpong kernel (gate then up over an ``[M, N]`` grid): the gate (or up) columns of an
  output tile are whole 32-column runs, 64-byte rows every other run: one TMA box with an
  outer mode over the runs fetches them, each run one 64-byte-swizzled atom in shared memory.
  Under even/odd interleave they would be strided 2-byte columns that no TMA box can fetch.
* Tile widths: a tile of the interleaved kernel must hold whole pairs, so its packed
  width is a multiple of 64: 128, 192, 256 and 320 all are. (Blocks of 64 allowed only
  multiples of 128, and 192-wide tiles measured faster as plain GEMMs on several shapes.)
* Sharding: a contiguous run of whole gate/up pairs (64 packed columns each) is itself a
  packed matrix, for its 32-column run of N. So the packed matrix shards along its last
  axis (column / tensor parallel) as long as every shard holds whole pairs and there is
  no padding: N a multiple of ``32 * shards`` (``shard_n``). Padding exists only at the
  global end of N, so a padded N cannot be sharded.

So one packed array serves any M at run time, whichever kernel the lowering picks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

GATE_UP_BLOCK = 32
LAYOUT = f"gate_up_block{GATE_UP_BLOCK}_quad_transposed"
# A run's columns as (quad lane q, 8-column block j, column in pair e): see the docstring.
_RUN_AXES = (4, 4, 2)

# Dtypes the kernels are built for. K and N must keep 16-byte aligned rows for TMA.
KERNEL_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
ALIGNMENT = 8  # elements of a 2-byte dtype per 16 bytes


def padded_n(n: int) -> int:
    """N rounded up to whole gate/up blocks."""
    return -(-n // GATE_UP_BLOCK) * GATE_UP_BLOCK


@jax.tree_util.register_pytree_node_class
class PackedWeights:
    """Gate and up weights in the kernels' packed layout (see module docstring).

    Build it once, at load time, with :func:`pack_weights`. It is a pytree whose only
    leaf is ``data`` (``[K, 2 * N_pad]``); the rest is static metadata, so it passes
    through ``jax.jit``, ``vmap``, ``shard_map`` and checkpointing like an array.

    ``n`` is stored only when ``data`` cannot tell it: when N was padded (N not a multiple
    of 32). Otherwise ``n`` is read off the data (``N = data.shape[-1] // 2``), so the same
    object describes the whole matrix and any shard of it along N, such as the one
    ``jax.shard_map`` hands to its body.
    """

    __slots__ = ("data", "_n", "layout")

    def __init__(self, data: Any, n: int | None = None, layout: str = LAYOUT):
        if n is not None and n % GATE_UP_BLOCK == 0:
            shape = getattr(data, "shape", None)
            if shape is None or shape[-1:] == (2 * n,):
                n = None  # the data says it; an inconsistent n stays, for validate()
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "_n", n)
        object.__setattr__(self, "layout", layout)

    def __setattr__(self, name, value):
        raise AttributeError(f"PackedWeights is immutable; cannot set {name!r}")

    def __repr__(self):
        n = "" if self._n is None else f", n={self._n}"
        return f"PackedWeights(data={self.data!r}{n}, layout={self.layout!r})"

    def tree_flatten(self):
        return (self.data,), (self._n, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    @property
    def n(self) -> int:
        return self.data.shape[-1] // 2 if self._n is None else self._n

    @property
    def k(self) -> int:
        return self.data.shape[0]

    @property
    def n_padded(self) -> int:
        return self.data.shape[-1] // 2

    @property
    def dtype(self):
        return self.data.dtype

    def validate(self) -> None:
        """Raises ValueError if ``data`` does not match the metadata and this layout."""
        shape = tuple(self.data.shape)
        if self.layout != LAYOUT:
            raise ValueError(
                f"PackedWeights uses layout {self.layout!r}, but this version of jax_swiglu "
                f"reads {LAYOUT!r}; pack the weights again with jax_swiglu.pack_weights")
        pair = 2 * GATE_UP_BLOCK
        if self._n is None:
            if len(shape) != 2 or shape[1] == 0 or shape[1] % pair:
                raise ValueError(
                    f"PackedWeights data has shape {shape}, but packed weights are "
                    f"[K, 2 * N_pad] with whole gate/up pairs of {pair} columns; it was not "
                    "built by jax_swiglu.pack_weights (or was modified, or split along its "
                    "last axis into pieces that are not whole pairs)")
        elif len(shape) != 2 or shape[1] != 2 * padded_n(self._n) or self._n <= 0:
            hint = (
                f"; N={self._n} was padded to a whole gate/up block, so this matrix cannot be "
                "split along N (a shard of it, e.g. inside shard_map, is not a packed matrix)"
                if self._n > 0 and self._n % GATE_UP_BLOCK else "")
            raise ValueError(
                f"PackedWeights data has shape {shape}, but n={self._n} needs "
                f"[K, {2 * padded_n(max(self._n, 1))}]; it was not built by "
                f"jax_swiglu.pack_weights (or was modified since){hint}")


def shard_n(n: int, shards: int) -> int:
    """N of each of ``shards`` equal shards of a packed matrix split along its last axis.

    A contiguous run of packed columns is a packed matrix of its own only if it holds
    whole gate/up pairs (32 columns of N, 64 packed columns) and no padding, so N must
    be a multiple of ``32 * shards``. Raises ValueError otherwise.
    """
    if shards == 1:
        return n
    if n % (GATE_UP_BLOCK * shards):
        raise ValueError(
            f"N={n} cannot be split into {shards} equal shards of whole gate/up pairs: "
            f"sharding the packed weights along N needs N to be a multiple of "
            f"{GATE_UP_BLOCK} * {shards} = {GATE_UP_BLOCK * shards}. Pad N (zero columns "
            "of W_gate and W_up, zero rows of W_down) or shard N fewer ways")
    return n // shards


def _shards_along_n(w) -> int:
    """Into how many equal shards the last axis of ``w`` is split, if that is known."""
    # A concrete array knows its sharding; a traced one only through its type (explicit
    # mesh axes); numpy arrays are unsharded.
    concrete = isinstance(w, jax.Array) and not isinstance(w, jax.core.Tracer)
    sharding = w.sharding if concrete else jax.typeof(w).sharding
    n = w.shape[-1]
    local = sharding.shard_shape(tuple(w.shape))[-1]
    if n % local:
        raise ValueError(
            f"a weight of shape {tuple(w.shape)} is split unevenly along N (shards of "
            f"{local} columns); the packed layout needs equal shards of whole gate/up pairs")
    return n // local


def _check_weight(name: str, w) -> None:
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {w.dtype}")


def pack_weights(w_gate, w_up=None, *, dtype=None) -> PackedWeights:
    """Packs gate and up projection weights for :func:`jax_swiglu.swiglu`.

    Args:
      w_gate: ``[K, N]`` gate weights (``x @ w_gate``), or the stacked ``[K, 2, N]``
        form (``[:, 0]`` gate, ``[:, 1]`` up) used by tokamax and TransformerEngine, in
        which case ``w_up`` must be omitted.
      w_up: ``[K, N]`` up weights.
      dtype: optional dtype to cast to (the kernels run bfloat16 and float16).

    Returns:
      A :class:`PackedWeights` holding ``[K, 2 * N_pad]`` with ``N_pad`` = N rounded up to
      32. Do this once when the weights are loaded, not per call.

    Weights sharded along N (column parallel) give packed data sharded the same way along
    its last axis, with no communication: each shard packs its own columns. That needs N to
    be a multiple of ``32 * shards`` (whole gate/up pairs on every shard); anything else is
    a ValueError, as a packing that split pairs across shards would be useless. (Inside
    ``jax.jit`` with automatic mesh axes the sharding is not known yet and this check
    cannot run: pack concrete arrays, at load time, or use explicit mesh axes.)
    """
    if w_up is None:
        _check_weight("w_gate", w_gate)
        if w_gate.ndim != 3 or w_gate.shape[1] != 2:
            raise ValueError(
                "pack_weights(w) takes the stacked [K, 2, N] form; got shape "
                f"{tuple(w_gate.shape)}. Pass separate weights as pack_weights(w_gate, w_up)")
        w_gate, w_up = w_gate[:, 0], w_gate[:, 1]
    _check_weight("w_gate", w_gate)
    _check_weight("w_up", w_up)
    if w_gate.ndim != 2 or w_up.ndim != 2:
        raise ValueError(
            "w_gate and w_up must be [K, N]; got shapes "
            f"{tuple(w_gate.shape)} and {tuple(w_up.shape)}")
    if w_gate.shape != w_up.shape:
        raise ValueError(
            f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must have the same shape")
    if w_gate.dtype != w_up.dtype and dtype is None:
        raise TypeError(
            f"w_gate ({w_gate.dtype}) and w_up ({w_up.dtype}) have different dtypes; "
            "pass dtype= to cast both")
    k, n = w_gate.shape
    check_alignment(k, n)
    for w in (w_gate, w_up):
        # Weights split along N pack shard by shard (the packed matrix comes out split
        # along its last axis) only if every shard holds whole gate/up pairs.
        shard_n(n, _shards_along_n(w))
    if dtype is not None:
        w_gate, w_up = w_gate.astype(dtype), w_up.astype(dtype)

    pad = [(0, 0), (0, padded_n(n) - n)]
    return PackedWeights(interleave_gate_up(jnp.pad(w_gate, pad), jnp.pad(w_up, pad)), n)


def interleave_gate_up(gate, up):
    """Packs ``[..., N_pad]`` gate and up columns into ``[..., 2 * N_pad]`` (inverse of
    :func:`split_gate_up` up to padding). Works on numpy arrays too (returns a jax array).
    """
    *lead, n_pad = gate.shape
    runs = (*lead, n_pad // GATE_UP_BLOCK, 1, GATE_UP_BLOCK)
    pairs = jnp.concatenate([_transpose_quads(gate.reshape(runs)),
                             _transpose_quads(up.reshape(runs))], axis=-2)
    return pairs.reshape(*lead, 2 * n_pad)


def _transpose_quads(runs):
    """The quad transpose of the last axis, 32-column runs (its own inverse)."""
    *lead, width = runs.shape
    assert width == GATE_UP_BLOCK == 4 * 4 * 2
    return runs.reshape(*lead, *_RUN_AXES).swapaxes(-3, -2).reshape(*lead, width)


def unpack_weights(packed: PackedWeights):
    """Inverse of :func:`pack_weights`: returns ``(w_gate, w_up)``, each ``[K, N]``."""
    packed = as_packed(packed, "packed")
    gate, up = split_gate_up(packed.data, packed.n)
    return gate, up


def split_gate_up(packed_cols, n: int):
    """Splits ``[..., 2 * N_pad]`` packed columns into gate and up ``[..., n]``.

    Works on the packed weights and, identically, on the product ``x @ packed`` (numpy
    arrays too).
    """
    *lead, width = packed_cols.shape
    blocks = width // (2 * GATE_UP_BLOCK)
    pairs = _transpose_quads(packed_cols.reshape(*lead, blocks, 2, GATE_UP_BLOCK))
    gate = pairs[..., 0, :].reshape(*lead, blocks * GATE_UP_BLOCK)[..., :n]
    up = pairs[..., 1, :].reshape(*lead, blocks * GATE_UP_BLOCK)[..., :n]
    return gate, up


def check_alignment(k: int, n: int) -> None:
    """K and N must keep every row 16-byte aligned, as the kernels' TMA copies need."""
    if k <= 0 or n <= 0:
        raise ValueError(f"K and N must be positive, got K={k}, N={n}")
    if k % ALIGNMENT or n % ALIGNMENT:
        raise ValueError(
            f"K={k} and N={n} must be multiples of {ALIGNMENT} (16-byte rows for the "
            "kernels' TMA copies); pad the weights (zero rows of W and zero columns of x "
            "for K, zero columns for N) to the next multiple")


def as_packed(packed, argname: str) -> PackedWeights:
    """Returns ``packed`` validated, or raises a TypeError that says what was passed."""
    if isinstance(packed, PackedWeights):
        packed.validate()
        return packed
    shape = getattr(packed, "shape", None)
    if shape is not None:
        hint = (
            "a stacked [K, 2, N] weight" if len(shape) == 3 and shape[1] == 2
            else f"an array of shape {tuple(shape)}")
        raise TypeError(
            f"{argname} must be PackedWeights from jax_swiglu.pack_weights(w_gate, w_up); got "
            f"{hint}. Pack the gate and up weights once, at load time")
    raise TypeError(
        f"{argname} must be PackedWeights from jax_swiglu.pack_weights, got {type(packed).__name__}")
