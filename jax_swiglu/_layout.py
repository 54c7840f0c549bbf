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

Only :func:`pack_weights` writes this layout. It reads gate and up in a layout the caller
names (:data:`SOURCE_LAYOUTS`: separate ``[K, N]`` matrices, the stacked ``[K, 2, N]`` form,
or the ``[K, 2N]`` concatenation ``[gate | up]``), because a concatenation and a packed
matrix have the same shape and nothing in the values tells them apart; for the same reason
:class:`PackedWeights` has no public constructor from an array, only
:meth:`PackedWeights.from_packed_data`, which states that the array is packed already.
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

    Build it once, at load time, with :func:`pack_weights` (or an adapter of
    :mod:`jax_swiglu.convert`). It is a pytree whose only leaf is ``data``
    (``[K, 2 * N_pad]``); the rest is static metadata, so it passes through ``jax.jit``,
    ``vmap``, ``shard_map`` and checkpointing like an array.

    There is no public constructor from an array: a ``[K, 2 N]`` array has the packed
    matrix's shape whatever its columns hold, and a plain ``[gate | up]`` concatenation
    (what Phi-3 and vLLM call ``gate_up_proj``) read as packed gives wrong outputs with no
    error. So the layout of the array is always named: :func:`pack_weights` takes gate and
    up in a named source layout (``layout="concatenated"`` for that concatenation), and
    :meth:`from_packed_data` takes an array that is already in this layout, such as a saved
    ``packed.data``.

    ``n`` is stored only when ``data`` cannot tell it: when N was padded (N not a multiple
    of 32). Otherwise ``n`` is read off the data (``N = data.shape[-1] // 2``), so the same
    object describes the whole matrix and any shard of it along N, such as the one
    ``jax.shard_map`` hands to its body.
    """

    __slots__ = ("data", "_n", "layout")

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "PackedWeights is not built from an array directly, since an array of the packed "
            "shape need not hold the packed layout (a [gate | up] concatenation has the same "
            "shape and gives wrong outputs). Use jax_swiglu.pack_weights(w_gate, w_up) for [K, N] "
            "gate and up weights, pack_weights(gate_up, layout='concatenated') for a [K, 2N] "
            "concatenation [gate | up] (Phi-3's and vLLM's gate_up_proj, [in, out]), the "
            "adapters of jax_swiglu.convert for model layouts, or "
            "PackedWeights.from_packed_data(data, n) for an array already in jax_swiglu's "
            "packed layout (a saved packed.data)")

    @classmethod
    def _wrap(cls, data: Any, n: int | None, layout: str) -> PackedWeights:
        """The object around ``data``, unchecked: for this module and the pytree rebuild
        (whose leaves may be tracers, shardings or other placeholders)."""
        if n is not None and n % GATE_UP_BLOCK == 0:
            shape = getattr(data, "shape", None)
            if shape is None or shape[-1:] == (2 * n,):
                n = None  # the data says it; an inconsistent n stays, for validate()
        packed = object.__new__(cls)
        object.__setattr__(packed, "data", data)
        object.__setattr__(packed, "_n", n)
        object.__setattr__(packed, "layout", layout)
        return packed

    @classmethod
    def from_packed_data(cls, data: Any, n: int, *, layout: str = LAYOUT) -> PackedWeights:
        """Wraps ``data`` that is **already** in jax_swiglu's packed layout.

        For a matrix this package packed before, such as ``packed.data`` saved to a
        checkpoint and loaded again: ``PackedWeights.from_packed_data(data, packed.n)``.
        Nothing here can tell a packed matrix from another one of the same shape, so this
        is your statement that it is one; gate and up in any other layout go through
        :func:`pack_weights`.

        Args:
          data: ``[K, 2 * N_pad]`` (an array, or a ``jax.ShapeDtypeStruct`` for
            :func:`jax_swiglu.explain`).
          n: N, the number of gate (and up) columns, before the padding to 32.
          layout: the layout tag saved with the data (``PackedWeights.layout``); data of
            another layout (an earlier version's) is refused.

        Raises:
          ValueError: if ``data``'s shape does not fit ``n`` or the layout is not this one.
        """
        if not (hasattr(data, "shape") and hasattr(data, "dtype")):
            raise TypeError(f"data must be an array [K, 2 * N_pad], got {type(data).__name__}")
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise TypeError(f"n must be an int (N, the gate and up columns), got {n!r}")
        n = int(n)
        _check_weight("data", data)
        packed = cls._wrap(data, n, layout)
        packed.validate()
        return packed

    def __setattr__(self, name, value):
        raise AttributeError(f"PackedWeights is immutable; cannot set {name!r}")

    def __reduce__(self):
        # Pickling and copy.deepcopy rebuild it around the same data, as the pytree does.
        return _rebuild_packed, (self.data, self._n, self.layout)

    def __repr__(self):
        n = "" if self._n is None else f", n={self._n}"
        return f"PackedWeights(data={self.data!r}{n}, layout={self.layout!r})"

    def tree_flatten(self):
        return (self.data,), (self._n, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._wrap(children[0], *aux)

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


def _rebuild_packed(data, n, layout) -> PackedWeights:
    return PackedWeights._wrap(data, n, layout)


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
    if not (hasattr(w, "shape") and hasattr(w, "dtype")):
        raise TypeError(f"{name} must be an array, got {type(w).__name__}")
    _check_packed_dtype(f"{name}'s dtype", w.dtype)


def _check_packed_dtype(what: str, dtype) -> None:
    """Packed weights are in a 16-bit or wider float: fp8 weights carry scales
    (quantize_weights)."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{what} must be a floating-point dtype, got {dtype}")
    if dtype.itemsize == 1:
        raise TypeError(f"{what} is {dtype}: fp8 weights need scales, which "
                        "jax_swiglu.quantize_weights computes (it packs them too)")


# The layouts in which pack_weights takes gate and up (and unpack_weights gives them back).
SOURCE_LAYOUTS = {
    "separate": "w_gate and w_up, [K, N] each",
    "stacked": "one [K, 2, N] array, gate at [:, 0] and up at [:, 1] (tokamax, TransformerEngine)",
    "concatenated": ("one [K, 2N] array [gate | up], gate in columns :N (Phi-3's and vLLM's "
                     "gate_up_proj, as an [in, out] kernel)"),
}


def _check_source_layout(layout) -> None:
    if layout not in SOURCE_LAYOUTS:
        raise ValueError(f"layout must be one of {tuple(SOURCE_LAYOUTS)}, got {layout!r}")


def _split_source(w_gate, w_up, layout):
    """(w_gate, w_up) out of pack_weights' arguments in the named (or evident) layout."""
    if w_up is not None:
        if layout not in (None, "separate"):
            _check_source_layout(layout)
            raise ValueError(
                f"layout={layout!r} is one array ({SOURCE_LAYOUTS[layout]}): pass it alone, "
                "pack_weights(w, layout=...); two arrays are layout='separate'")
        return w_gate, w_up
    if layout is not None:
        _check_source_layout(layout)
    if not (hasattr(w_gate, "shape") and hasattr(w_gate, "dtype")):
        raise TypeError(f"pack_weights takes arrays, got {type(w_gate).__name__}")
    _check_weight("w_gate", w_gate)
    shape = tuple(w_gate.shape)
    if layout == "concatenated":
        if len(shape) != 2 or shape[1] % 2:
            raise ValueError(
                f"layout='concatenated' is {SOURCE_LAYOUTS['concatenated']}; got shape {shape}")
        n = shape[1] // 2
        return w_gate[:, :n], w_gate[:, n:]
    if layout == "separate":
        raise ValueError("layout='separate' takes two arrays: pack_weights(w_gate, w_up)")
    if len(shape) == 3 and shape[1] == 2:  # stacked, named or not: no other reading of it
        return w_gate[:, 0], w_gate[:, 1]
    if layout == "stacked":
        raise ValueError(f"layout='stacked' is {SOURCE_LAYOUTS['stacked']}; got shape {shape}")
    if len(shape) == 2:
        raise ValueError(
            f"pack_weights(w) got one [K, 2N]-like array {shape}, which does not say its layout. "
            "If it is the concatenation [gate | up] (Phi-3's and vLLM's gate_up_proj, [in, out]), "
            "pass layout='concatenated'; if it is jax_swiglu's own packed data (a saved "
            "packed.data), wrap it with PackedWeights.from_packed_data(data, n); separate "
            "weights are pack_weights(w_gate, w_up)")
    raise ValueError(
        f"pack_weights(w) takes the stacked [K, 2, N] form or, with layout='concatenated', "
        f"[K, 2N]; got shape {shape}. Pass separate weights as pack_weights(w_gate, w_up)")


def pack_weights(w_gate, w_up=None, *, layout: str | None = None, dtype=None) -> PackedWeights:
    """Packs gate and up projection weights for :func:`jax_swiglu.swiglu`.

    The weights come in one of three layouts (:data:`SOURCE_LAYOUTS`), kernels ``[in, out]``
    (``x @ w``):

    * ``pack_weights(w_gate, w_up)``: ``[K, N]`` each (``layout="separate"``);
    * ``pack_weights(w)``: the stacked ``[K, 2, N]`` form (``[:, 0]`` gate, ``[:, 1]`` up)
      used by tokamax and TransformerEngine (``layout="stacked"``, evident from the shape);
    * ``pack_weights(w, layout="concatenated")``: ``[K, 2N]``, the concatenation
      ``[gate | up]`` along N, gate first, that Phi-3 and vLLM store as ``gate_up_proj``.
      A single 2-D array is refused without ``layout=``: it could as well be packed data
      already (:meth:`PackedWeights.from_packed_data` wraps that).

    Args:
      w_gate: ``[K, N]`` gate weights, or the one array of the stacked or concatenated form.
      w_up: ``[K, N]`` up weights, with separate ``w_gate``.
      layout: ``"separate"``, ``"stacked"`` or ``"concatenated"``; by default separate for
        two arrays and stacked for one ``[K, 2, N]`` array.
      dtype: optional dtype to cast to (the kernels run bfloat16 and float16).

    Returns:
      A :class:`PackedWeights` holding ``[K, 2 * N_pad]`` with ``N_pad`` = N rounded up to
      32. Do this once when the weights are loaded, not per call. The arguments are not
      modified; :func:`unpack_weights` gives them back exactly.

    Weights sharded along N (column parallel) give packed data sharded the same way along
    its last axis, with no communication: each shard packs its own columns. That needs N to
    be a multiple of ``32 * shards`` (whole gate/up pairs on every shard); anything else is
    a ValueError, as a packing that split pairs across shards would be useless. (Inside
    ``jax.jit`` with automatic mesh axes the sharding is not known yet and this check
    cannot run: pack concrete arrays, at load time, or use explicit mesh axes.)
    """
    if dtype is not None:
        _check_packed_dtype("dtype", dtype)
    w_gate, w_up = _split_source(w_gate, w_up, layout)
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
    return PackedWeights._wrap(interleave_gate_up(jnp.pad(w_gate, pad), jnp.pad(w_up, pad)), n,
                               LAYOUT)


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


def unpack_weights(packed: PackedWeights, *, layout: str = "separate"):
    """Inverse of :func:`pack_weights`, exact: the gate and up weights in ``layout``.

    ``"separate"`` (the default) returns ``(w_gate, w_up)``, each ``[K, N]``; ``"stacked"``
    one ``[K, 2, N]`` array; ``"concatenated"`` one ``[K, 2N]`` array ``[gate | up]``.
    """
    _check_source_layout(layout)
    packed = as_packed(packed, "packed")
    gate, up = split_gate_up(packed.data, packed.n)
    if layout == "stacked":
        return jnp.stack([gate, up], axis=1)
    if layout == "concatenated":
        return jnp.concatenate([gate, up], axis=1)
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
        if len(shape) == 3 and shape[1] == 2:
            hint = "a stacked [K, 2, N] weight: pack it with pack_weights(w)"
        elif len(shape) == 2:
            hint = (f"an array of shape {tuple(shape)}. If it is the concatenation [gate | up] "
                    "(Phi-3's and vLLM's gate_up_proj, [in, out]), pack it with "
                    "pack_weights(gate_up, layout='concatenated'); if it is jax_swiglu's packed "
                    "data (a saved packed.data), wrap it: PackedWeights.from_packed_data(data, n)")
        else:
            hint = f"an array of shape {tuple(shape)}"
        raise TypeError(
            f"{argname} must be PackedWeights from jax_swiglu.pack_weights(w_gate, w_up); got "
            f"{hint}. Pack the gate and up weights once, at load time")
    raise TypeError(
        f"{argname} must be PackedWeights from jax_swiglu.pack_weights, got {type(packed).__name__}")


# --- every expert of a mixture-of-experts layer, packed -----------------------------------

@jax.tree_util.register_pytree_node_class
class PackedExperts:
    """Every expert's gate and up weights in the packed layout: ``data`` ``[E, K, 2 F_pad]``.

    Built by :func:`pack_expert_weights`; like :class:`PackedWeights` a pytree whose only
    leaf is ``data``, with no public constructor from an array (a packed expert matrix and a
    concatenation have the same shape). :meth:`from_packed_data` wraps data packed before.
    """

    __slots__ = ("data", "n", "layout")

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "PackedExperts is not built from an array directly: use "
            "jax_swiglu.pack_expert_weights(w_gate, w_up) for [E, K, F] gate and up weights, or "
            "PackedExperts.from_packed_data(data, n) for data already packed (a saved "
            "experts.data)")

    @classmethod
    def _wrap(cls, data: Any, n: int, layout: str) -> PackedExperts:
        experts = object.__new__(cls)
        object.__setattr__(experts, "data", data)
        object.__setattr__(experts, "n", n)
        object.__setattr__(experts, "layout", layout)
        return experts

    @classmethod
    def from_packed_data(cls, data: Any, n: int, *,
                         layout: str = LAYOUT) -> PackedExperts:
        """Wraps ``data`` ``[E, K, 2 F_pad]`` that is **already** in the packed layout."""
        if not (hasattr(data, "shape") and hasattr(data, "dtype")):
            raise TypeError(f"data must be an array [E, K, 2 * F_pad], got {type(data).__name__}")
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise TypeError(f"n must be an int (F, each expert's gate and up columns), got {n!r}")
        experts = cls._wrap(data, int(n), layout)
        experts.validate()
        return experts

    def __setattr__(self, name, value):
        raise AttributeError(f"PackedExperts is immutable; cannot set {name!r}")

    def __repr__(self):
        return f"PackedExperts(data={self.data!r}, n={self.n}, layout={self.layout!r})"

    def tree_flatten(self):
        return (self.data,), (self.n, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._wrap(children[0], *aux)

    @property
    def experts(self) -> int:
        return self.data.shape[0]

    @property
    def k(self) -> int:
        return self.data.shape[1]

    @property
    def dtype(self):
        return self.data.dtype

    def validate(self) -> None:
        shape = tuple(self.data.shape)
        if self.layout != LAYOUT:
            raise ValueError(f"PackedExperts uses layout {self.layout!r}, but this version of "
                             f"jax_swiglu reads {LAYOUT!r}; pack the weights again")
        if not jnp.issubdtype(self.data.dtype, jnp.floating):
            raise TypeError(f"PackedExperts data must be floating point, got {self.data.dtype}")
        if (len(shape) != 3 or shape[0] == 0 or self.n <= 0
                or shape[2] != 2 * padded_n(self.n)):
            raise ValueError(
                f"PackedExperts data has shape {shape}, but n={self.n} needs "
                f"[E, K, {2 * padded_n(max(self.n, 1))}] with E >= 1; it was not built "
                "by jax_swiglu.pack_expert_weights (or was modified since)")


def pack_expert_weights(w_gate, w_up=None, *, layout: str | None = None,
                        dtype=None) -> PackedExperts:
    """Packs every expert's gate and up weights for :func:`jax_swiglu.grouped_swiglu`.

    The same source layouts as :func:`jax_swiglu.pack_weights`, with a leading expert axis:
    ``pack_expert_weights(w_gate, w_up)`` with ``[E, K, F]`` each; one ``[E, K, 2, F]``
    array (stacked); ``layout="concatenated"`` for one ``[E, K, 2F]`` array
    ``[gate | up]``. Kernels are ``[in, out]`` (``x @ w``). The arguments are not modified;
    :func:`unpack_expert_weights` gives them back exactly. Weights on one device are packed
    a block of experts at a time, so packing needs little memory beyond the packed result
    (DeepSeek-V3's 256 experts pack beside their weights on an 80 GB GPU); weights split over
    devices pack in one expression, each device its own experts.
    """
    if w_up is None:
        if not (hasattr(w_gate, "shape") and hasattr(w_gate, "dtype")):
            raise TypeError(f"pack_expert_weights takes arrays, got {type(w_gate).__name__}")
        shape = tuple(w_gate.shape)
        if layout == "concatenated" and len(shape) == 3 and shape[2] % 2 == 0:
            w_gate, w_up = w_gate[..., :shape[2] // 2], w_gate[..., shape[2] // 2:]
        elif layout in (None, "stacked") and len(shape) == 4 and shape[2] == 2:
            w_gate, w_up = w_gate[:, :, 0], w_gate[:, :, 1]
        else:
            raise ValueError(
                "pack_expert_weights takes w_gate and w_up [E, K, F] each, one stacked "
                "[E, K, 2, F] array, or with layout='concatenated' one [E, K, 2F] array "
                f"[gate | up]; got one array of shape {shape} (layout={layout!r})")
    elif layout not in (None, "separate"):
        raise ValueError(f"layout={layout!r} is one array: pass it alone; two arrays are "
                         "layout='separate'")
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not (hasattr(w, "shape") and hasattr(w, "dtype")) or w.ndim != 3:
            raise ValueError(f"{name} must be [E, K, F], got "
                             f"{tuple(getattr(w, 'shape', ())) or type(w).__name__}")
        if not jnp.issubdtype(w.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {w.dtype}")
    if w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must have "
                         "the same shape")
    if w_gate.dtype != w_up.dtype and dtype is None:
        raise TypeError(f"w_gate ({w_gate.dtype}) and w_up ({w_up.dtype}) have different "
                        "dtypes; pass dtype= to cast both")
    experts, k, n = w_gate.shape
    if experts == 0:
        raise ValueError("pack_expert_weights needs at least one expert (E >= 1)")
    check_alignment(k, n)
    if dtype is not None:
        w_gate, w_up = w_gate.astype(dtype), w_up.astype(dtype)
    return PackedExperts._wrap(_pack_experts(w_gate, w_up, padded_n(n)), n, LAYOUT)


# Experts are packed a block at a time where the weights sit whole on one device: one
# transposition over every expert at once has XLA hold temporaries, and its autotuner
# profiling buffers, the size of all of them (DeepSeek-V3's 256 experts then do not fit an
# 80 GB part beside their weights). A block of experts stays under this many bytes.
PACK_BLOCK_BYTES = 1 << 28


def _pack_experts(w_gate, w_up, n_pad: int):
    """[E, K, 2 n_pad] packed experts from [E, K, F] gate and up weights."""
    experts, k, n = w_gate.shape

    def pack(gate, up):
        pad = [(0, 0)] * (gate.ndim - 1) + [(0, n_pad - n)]
        return interleave_gate_up(jnp.pad(gate, pad), jnp.pad(up, pad))

    expert_bytes = 2 * k * n_pad * jnp.dtype(w_gate.dtype).itemsize
    if experts == 1 or not all(_on_one_device(w) for w in (w_gate, w_up)):
        # Traced, or split over devices: one expression, which keeps the experts' sharding.
        return pack(w_gate, w_up)
    # The largest block that divides E (lax.map's remainder would be a second copy).
    most = max(1, PACK_BLOCK_BYTES // expert_bytes)
    block = max(b for b in range(1, min(experts, most) + 1) if experts % b == 0)
    return jax.jit(lambda g, u: jax.lax.map(lambda gu: pack(*gu), (g, u), batch_size=block)
                   )(w_gate, w_up)


def _on_one_device(w) -> bool:
    """Whether ``w`` is a concrete array held whole by one device (or host memory)."""
    if isinstance(w, jax.core.Tracer):
        return False
    sharding = getattr(w, "sharding", None)
    return sharding is None or len(sharding.device_set) == 1


def unpack_expert_weights(experts: PackedExperts):
    """Inverse of :func:`pack_expert_weights`, exact: ``(w_gate, w_up)``, ``[E, K, F]`` each."""
    experts = _as_experts(experts)
    return split_gate_up(experts.data, experts.n)


def _as_experts(experts) -> PackedExperts:
    if not isinstance(experts, PackedExperts):
        raise TypeError(f"experts must be PackedExperts (jax_swiglu.pack_expert_weights), got "
                        f"{type(experts).__name__}")
    experts.validate()
    return experts
