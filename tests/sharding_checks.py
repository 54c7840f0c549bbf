"""Multi-device checks of the partitioning rules, on 8 host (CPU) devices.

XLA_FLAGS=--xla_force_host_platform_device_count=8 has to be set before JAX starts its
CPU backend, so ``test_sharding.py`` runs this file in a fresh interpreter and turns each
line it prints into one test. Run it directly to see the results:

    python tests/sharding_checks.py [NAME ...]

prints one JSON object per check: ``{"name", "status": passed|failed|skipped, "detail"}``.
A check fails by raising: an AssertionError, or any error it did not expect.
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

if __name__ == "__main__":  # before JAX starts: 8 host devices, this checkout's package
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_swiglu
from jax_swiglu import GATE_UP_BLOCK, fused_mlp, pack_weights, selection, swiglu

DEVICES = 8
MESH_SHAPES = ((1, 8), (2, 4), (8, 1))  # (data, model)
AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}
K, N, M = 128, 1024, 128  # N = 32 gate/up pairs: whole pairs on up to 32 shards


class Skip(Exception):
    """The check cannot run here (the reason is the message)."""


# --- helpers ------------------------------------------------------------------------------

def make_mesh(shape, axis_type="auto"):
    return jax.make_mesh(shape, ("data", "model"), axis_types=(AXIS_TYPES[axis_type],) * 2)


def put(mesh, a, *spec):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))


def put_packed(mesh, packed, *spec):
    return jax.tree.map(lambda data: put(mesh, data, *spec), packed)


@functools.cache
def inputs(k=K, n=N, m=M):
    """Unsharded x, w_gate, w_up, w_down (bf16) and the unsharded results."""
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (m, k)).astype(jnp.bfloat16)
    w_gate, w_up = ((jax.random.normal(key, (k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
                    for key in keys[1:3])
    w_down = (jax.random.normal(keys[3], (n, k)) / np.sqrt(n)).astype(jnp.bfloat16)
    packed = pack_weights(w_gate, w_up)
    return dict(x=x, w_gate=w_gate, w_up=w_up, w_down=w_down, packed=packed,
                y=jax.jit(swiglu)(x, packed), mlp=jax.jit(fused_mlp)(x, packed, w_down))


def assert_equal(actual, expected):
    np.testing.assert_array_equal(np.asarray(actual, np.float32),
                                  np.asarray(expected, np.float32))


def assert_close(actual, expected):
    # The sharded down projection adds its partial products in another order: allow
    # one bf16 rounding step.
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                               rtol=2.0 ** -7, atol=2.0 ** -7)


def assert_spec(array, mesh, *spec):
    expected = NamedSharding(mesh, P(*spec))
    assert array.sharding.is_equivalent_to(expected, array.ndim), (array.sharding, expected)


COLLECTIVE = re.compile(
    r"= (\S+) (all-gather|all-reduce|reduce-scatter|all-to-all|ragged-all-to-all|"
    r"collective-permute|collective-broadcast)(?:-start)?\(")


def compiled_hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def collectives(hlo: str):
    """[(kind, result shape, replica group size)] of every collective in compiled HLO."""
    found = []
    for line in hlo.splitlines():
        match = COLLECTIVE.search(line)
        if match:
            found.append((match.group(2), match.group(1), replica_group_size(line)))
    return found


def dims(shape: str) -> list[int]:
    """[32, 128] from an HLO shape such as ``f32[32,128]{1,0}``."""
    return [int(d) for d in re.search(r"\[([\d,]*)\]", shape).group(1).split(",") if d]


def replica_group_size(line: str) -> int:
    """Devices per replica group of one collective, in any of XLA's three spellings."""
    explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if explicit:  # {{0,1,2,3},{4,5,6,7}}
        return len(explicit.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if iota:  # [groups,size]<=[devices]
        return int(iota.group(2))
    by_axes = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
    if by_axes:  # mesh['axis_0'=2,'axis_1'=4] {'axis_1'}
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", by_axes.group(1)))
        return math.prod(int(sizes[axis]) for axis in re.findall(r"'(\w+)'", by_axes.group(2)))
    raise AssertionError(f"cannot read the replica groups of: {line.strip()[:300]}")


def expect_error(fn, match: str):
    """Runs fn, which must fail with an error whose message contains ``match``."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001 -- the type differs by stage (trace, compile)
        assert match in str(error), f"wrong error: {type(error).__name__}: {error}"
        return
    raise AssertionError(f"no error; expected one saying {match!r}")


def require_kernels():
    """The CUDA lowering needs the compiled extension (which defines the FFI targets)."""
    if not jax_swiglu.kernels_available():
        raise Skip(jax_swiglu.unavailable_reason())


def cuda_partitioned_hlo(fn, *args) -> str:
    """What every device would run on CUDA: the module lowered for CUDA (no GPU needed),
    partitioned and optimized by XLA. The CPU compiler gets that far, dumping the HLO,
    then fails for want of a CPU handler for the CUDA kernel."""
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    with tempfile.TemporaryDirectory() as dump:
        try:
            lowered.compile({"xla_dump_to": dump, "xla_dump_hlo_as_text": True})
        except Exception as error:  # noqa: BLE001 -- expected: no CPU handler
            assert "jax_swiglu_" in str(error), error
        (path,) = glob.glob(os.path.join(dump, "*after_optimizations.txt"))
        return Path(path).read_text()


KERNEL_CALL = re.compile(
    r"= (\w+\[[\d,]*\])\S* custom-call\(.*?custom_call_target=\"(jax_swiglu_\w+)\", "
    r"operand_layout_constraints=\{(\w+\[[\d,]*\])\S*, (\w+\[[\d,]*\])\S*\}.*config = (\d+)")


def kernel_calls(hlo: str):
    """[(target, x shape, packed shape, result shape, config)] of every kernel call."""
    return [(target, x, packed, result, int(config))
            for result, target, x, packed, config in KERNEL_CALL.findall(hlo)]


def shard_axis_for_n(mesh) -> str:
    """The mesh axis to shard N over: 'model', or 'data' when 'model' has one device."""
    return "model" if mesh.shape["model"] > 1 else "data"


# --- checks -------------------------------------------------------------------------------

def check_column_parallel(mesh):
    """x sharded by tokens, the weights by whole gate/up pairs: each device computes its
    [M/data, N/model] block with no communication at all."""
    data = inputs()
    x = put(mesh, data["x"], "data", None)
    packed = pack_weights(put(mesh, data["w_gate"], None, "model"),
                          put(mesh, data["w_up"], None, "model"))
    y = jax.jit(swiglu)(x, packed)
    assert_equal(y, data["y"])
    assert_spec(y, mesh, "data", "model")
    hlo = compiled_hlo(swiglu, x, packed)
    assert collectives(hlo) == [], collectives(hlo)
    local = (M // mesh.shape["data"], 2 * N // mesh.shape["model"])
    assert re.search(rf"f32\[{local[0]},{local[1]}\]\{{1,0\}} dot\(", hlo), \
        f"no per-device dot with result f32{list(local)} in:\n{hlo}"


def check_tensor_parallel_mlp(mesh):
    """Megatron layout (gate/up by columns, down by rows): exactly one all-reduce, over the
    model axis (none when the model axis has one device); with reduce_dtype=float32, of
    fp32 partial sums. (The default's all-reduce is bf16 on GPUs, where
    benchmarks/tensor_parallel.py records the NCCL kernel's name; the CPU compiler widens
    bf16 all-reduces to f32, so this cannot tell the two apart by the default's HLO.)"""
    data = inputs()
    x = put(mesh, data["x"], "data", None)
    packed = put_packed(mesh, data["packed"], None, "model")
    w_down = put(mesh, data["w_down"], "model", None)
    wide = functools.partial(fused_mlp, reduce_dtype=jnp.float32)
    model = mesh.shape["model"]
    for mlp in (fused_mlp, wide):
        out = jax.jit(mlp)(x, packed, w_down)
        assert out.dtype == jnp.bfloat16
        assert_close(out, data["mlp"])
        assert_spec(out, mesh, "data", None)
        found = collectives(compiled_hlo(mlp, x, packed, w_down))
        if model == 1:
            assert found == [], found
        else:
            assert len(found) == 1, found
            kind, shape, group_size = found[0]
            assert kind in ("all-reduce", "reduce-scatter") and group_size == model, found
            assert mlp is fused_mlp or shape.startswith("f32["), found


def check_k_sharded_x_is_gathered(mesh):
    """x sharded along K: x is all-gathered along K before the op (partial sums cannot be
    added after SiLU); the weights stay where they are; the answer is unchanged."""
    data = inputs()
    x = put(mesh, data["x"], "data", "model")
    packed = put_packed(mesh, data["packed"])
    assert_equal(jax.jit(swiglu)(x, packed), data["y"])
    found = collectives(compiled_hlo(swiglu, x, packed))
    if mesh.shape["model"] == 1:
        assert found == [], found
    else:
        assert [(kind, dims(shape)) for kind, shape, _ in found] == [
            ("all-gather", [M // mesh.shape["data"], K])], found


def check_shard_map(mesh):
    """Inside jax.shard_map the op sees, and runs on, local shapes; PackedWeights takes
    its N from the local data."""
    data = inputs()
    x = put(mesh, data["x"], "data", None)
    packed = put_packed(mesh, data["packed"], None, "model")
    # Forced: at a few tokens per device the table alone would pick the XLA path.
    local_swiglu = jax.shard_map(functools.partial(swiglu, kernel="interleaved"), mesh=mesh,
                                 in_specs=(P("data"), P(None, "model")),
                                 out_specs=P("data", "model"))
    assert_equal(jax.jit(local_swiglu)(x, packed), data["y"])
    assert collectives(compiled_hlo(local_swiglu, x, packed)) == []
    jaxpr = jax.make_jaxpr(local_swiglu)(x, packed)
    (body,) = [eqn.params["jaxpr"] for eqn in jaxpr.eqns if eqn.primitive.name == "shard_map"]
    (call,) = [eqn for eqn in body.eqns if eqn.primitive is jax_swiglu.swiglu_p]
    data_shards, model_shards = mesh.shape["data"], mesh.shape["model"]
    assert [v.aval.shape for v in call.invars] == [
        (M // data_shards, K), (K, 2 * N // model_shards)], call
    assert call.params["n"] == N // model_shards

    # The whole MLP per shard, with its one reduction written out.
    w_down = put(mesh, data["w_down"], "model", None)
    local_mlp = jax.shard_map(
        lambda x, p, w: jax.lax.psum(fused_mlp(x, p, w), "model"), mesh=mesh,
        in_specs=(P("data"), P(None, "model"), P("model")), out_specs=P("data"))
    assert_close(jax.jit(local_mlp)(x, packed, w_down), data["mlp"])


def check_shard_map_of_padded_n_is_refused(mesh):
    """A padded N (here 200 -> 256) cannot be split: a shard of it is not a packed matrix."""
    axis = shard_axis_for_n(mesh)
    data = inputs(n=200)
    packed = put_packed(mesh, data["packed"], None, axis)
    local_swiglu = jax.shard_map(swiglu, mesh=mesh, in_specs=(P(), P(None, axis)),
                                 out_specs=P(None, axis))
    expect_error(lambda: jax.jit(local_swiglu)(put(mesh, data["x"]), packed),
                 "cannot be split along N")


def check_vmap(mesh):
    """vmap folds a batch sharded over 'data' into M; the partitioning still applies."""
    data = inputs()
    batched = data["x"].reshape(8, M // 8, K)
    x = put(mesh, batched, "data", None, None)
    packed = put_packed(mesh, data["packed"], None, "model")
    fn = jax.vmap(swiglu, in_axes=(0, None))
    y = jax.jit(fn)(x, packed)
    assert_equal(y, data["y"].reshape(8, M // 8, N))
    assert_spec(y, mesh, "data", None, "model")
    assert collectives(compiled_hlo(fn, x, packed)) == []


def check_pack_sharded_weights(mesh):
    """Weights sharded along N pack shard by shard: the packed data comes out sharded
    along its last axis, with no communication, and unpacks to the same weights."""
    data = inputs()
    axis = shard_axis_for_n(mesh)
    w_gate = put(mesh, data["w_gate"], None, axis)
    w_up = put(mesh, data["w_up"], None, axis)
    packed = pack_weights(w_gate, w_up)
    assert_spec(packed.data, mesh, None, axis)
    assert_equal(packed.data, data["packed"].data)
    assert packed.n == N
    stacked = put(mesh, jnp.stack([data["w_gate"], data["w_up"]], axis=1), None, None, axis)
    assert_spec(pack_weights(stacked).data, mesh, None, axis)
    assert collectives(compiled_hlo(pack_weights, w_gate, w_up)) == []
    gate, up = jax_swiglu.unpack_weights(packed)
    assert_equal(gate, data["w_gate"])
    assert_equal(up, data["w_up"])


def check_pack_refuses_split_pairs(mesh):
    """Weights whose N shards are not whole gate/up pairs cannot be packed."""
    axis = shard_axis_for_n(mesh)
    n = GATE_UP_BLOCK // 2 * mesh.shape[axis]  # half a pair per shard
    w = put(mesh, jnp.ones((K, n), jnp.bfloat16), None, axis)
    expect_error(lambda: pack_weights(w, w), "whole gate/up pairs")


def check_bad_n_split_is_a_clear_error(mesh):
    """Packed weights sharded so that pairs would be split, or a padded N sharded at all:
    an error that says so, not a silent gather."""
    axis = shard_axis_for_n(mesh)
    for n in (GATE_UP_BLOCK * 17, 200):  # 17 pairs on 8 (or 4) shards; a padded N
        data = inputs(n=n)
        packed = put_packed(mesh, data["packed"], None, axis)
        expect_error(lambda: jax.jit(swiglu)(data["x"], packed), "whole gate/up pairs")


def check_cuda_partitioning(mesh):
    """On CUDA the op is an opaque custom call, which XLA could only gather and run whole:
    the partitioning rule must hand each device its own block. Column parallel: one
    kernel call per device on its block, no communication, the tile config chosen from
    the local M. Megatron MLP: one all-reduce. K-sharded x: one all-gather, of x."""
    require_kernels()
    data_shards, model_shards = mesh.shape["data"], mesh.shape["model"]
    m = 512 * data_shards  # 512 tokens per device: a different tile config than 4096
    local_m, local_width = m // data_shards, 2 * N // model_shards
    x = jax.ShapeDtypeStruct((m, K), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    packed = put_packed(mesh, inputs()["packed"], None, "model")
    config = selection.choose(selection.Problem(local_m, N // model_shards, K,
                                                "bfloat16")).launch.config
    local_call = ("jax_swiglu_interleaved_silu_bf16", f"bf16[{local_m},{K}]",
                  f"bf16[{K},{local_width}]", f"bf16[{local_m},{N // model_shards}]", config)

    hlo = cuda_partitioned_hlo(swiglu, x, packed)
    assert kernel_calls(hlo) == [local_call], kernel_calls(hlo)
    assert collectives(hlo) == [], collectives(hlo)

    w_down = jax.ShapeDtypeStruct((N, K), jnp.bfloat16,
                                  sharding=NamedSharding(mesh, P("model", None)))
    hlo = cuda_partitioned_hlo(fused_mlp, x, packed, w_down)
    assert kernel_calls(hlo) == [local_call], kernel_calls(hlo)
    found = collectives(hlo)
    if model_shards == 1:
        assert found == [], found
    else:
        assert [(kind, size) for kind, _, size in found] == [("all-reduce", model_shards)], found

    k_sharded_x = jax.ShapeDtypeStruct(
        (m, K), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", "model")))
    replicated = put_packed(mesh, inputs()["packed"])
    hlo = cuda_partitioned_hlo(swiglu, k_sharded_x, replicated)
    (call,) = kernel_calls(hlo)
    assert call[1:3] == (f"bf16[{local_m},{K}]", f"bf16[{K},{2 * N}]"), call
    found = collectives(hlo)
    if model_shards == 1:
        assert found == [], found
    else:
        # (The CPU compiler gathers in f32; the dimensions are what matter.)
        assert [(kind, dims(shape)) for kind, shape, _ in found] == [
            ("all-gather", [local_m, K])], found


def check_shard_map_lowers_to_local_kernel_call(mesh):
    """Lowered for CUDA, a shard_map body calls the kernel on its local shapes directly."""
    require_kernels()
    data_shards, model_shards = mesh.shape["data"], mesh.shape["model"]
    x = put(mesh, inputs()["x"], "data", None)
    packed = put_packed(mesh, inputs()["packed"], None, "model")
    # Forced: at a few tokens per device the table alone would pick the XLA path.
    local_swiglu = jax.shard_map(functools.partial(swiglu, kernel="interleaved"), mesh=mesh,
                                 in_specs=(P("data"), P(None, "model")),
                                 out_specs=P("data", "model"))
    text = jax.jit(local_swiglu).trace(x, packed).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"custom_call @(jax_swiglu_\w+)\((.*)", text)
    assert [target for target, _ in calls] == ["jax_swiglu_interleaved_silu_bf16"], calls
    local = f"tensor<{M // data_shards}x{K}xbf16>, tensor<{K}x{2 * N // model_shards}xbf16>"
    assert local in calls[0][1], calls


def put_quantized(mesh, q, n_axis):
    """fp8 weights with their rows (packed columns) and per-channel scales on ``n_axis``."""
    spec = {2: (n_axis, None), 1: (n_axis,), 0: ()}
    return jax.tree.map(lambda a: put(mesh, a, *spec[a.ndim]), q)


FP8_CALL = re.compile(r"= (\w+\[[\d,]*\])\S* custom-call\(.*?custom_call_target="
                      r"\"(jax_swiglu_interleaved_fp8_\w+)\", operand_layout_constraints=\{(.*?)\}, api_version")


def check_fp8_column_parallel(mesh):
    """fp8 weights shard as the 16-bit ones do: column parallel (the weights' packed columns
    and their scales along N, tokens along M), each device quantizes its own rows of x and
    runs the fp8 kernel on its own block with no collective (no all-gather of the weights); the CPU result (the reference,
    partitioned) is the unsharded one up to one rounding (the CPU's fp32 dot of a block of
    rows may add in another order than the whole's)."""
    data_shards, model_shards = mesh.shape["data"], mesh.shape["model"]
    w = inputs()
    quantized = jax_swiglu.quantize_weights(w["w_gate"], w["w_up"])
    q = put_quantized(mesh, quantized, "model")
    x = put(mesh, w["x"], "data")
    expected = jax.jit(swiglu)(w["x"], quantized)
    y = jax.jit(swiglu)(x, q)
    assert_close(y, expected)
    require_kernels()
    m = 512 * data_shards
    x_type = jax.ShapeDtypeStruct((m, K), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    for scale in ("per_channel", "per_tensor"):
        q = put_quantized(mesh, jax_swiglu.quantize_weights(w["w_gate"], w["w_up"], scale=scale),
                          "model")
        hlo = cuda_partitioned_hlo(swiglu, x_type, q)
        calls = FP8_CALL.findall(hlo)
        assert len(calls) == 1, calls
        result, _, operands = calls[0]
        assert dims(result) == [m // data_shards, N // model_shards], calls
        shapes = [dims(s) for s in re.findall(r"\w+\[[\d,]*\]", operands)]
        assert [m // data_shards, K] in shapes and [2 * N // model_shards, K] in shapes, shapes
        # x is quantized on each device, its own rows, by one kernel before the fused one.
        quantize = re.findall(r"= \((\w+\[[\d,]*\])\S*, (\w+\[[\d,]*\])\S*\) custom-call\("
                              r".*?custom_call_target=\"jax_swiglu_quantize_rows_e4m3_bf16\"", hlo)
        expected = [([m // data_shards, K], [m // data_shards])]
        assert [(dims(q), dims(s)) for q, s in quantize] == (
            expected if jax_swiglu._primitive.QUANTIZE_KERNEL else []), quantize
        assert collectives(hlo) == [], collectives(hlo)


def check_gspmd_partitioner(mesh):
    """The same rules under the older GSPMD partitioner."""
    shardy = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        check_column_parallel(mesh)
        check_tensor_parallel_mlp(mesh)
        check_k_sharded_x_is_gathered(mesh)
    finally:
        jax.config.update("jax_use_shardy_partitioner", shardy)


# --- expert parallelism -------------------------------------------------------------------

EXPERTS, EXPERT_F, EXPERT_ROWS = 16, 128, 200


@functools.cache
def expert_inputs():
    """Unsharded x, packed experts and w_down (bf16), three routings (skewed with empty
    experts and rows past the sum; negative sizes and a sum over T; every row on one expert)
    and the single-device results for each."""
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (EXPERT_ROWS, K)).astype(jnp.bfloat16)
    w_gate, w_up = ((jax.random.normal(key, (EXPERTS, K, EXPERT_F)) / np.sqrt(K))
                    .astype(jnp.bfloat16) for key in keys[1:3])
    w_down = (jax.random.normal(keys[3], (EXPERTS, EXPERT_F, K)) / np.sqrt(EXPERT_F)
              ).astype(jnp.bfloat16)
    experts = jax_swiglu.pack_expert_weights(w_gate, w_up)
    skewed = np.zeros(EXPERTS, np.int32)
    skewed[[1, 2, 3, 5, 8, 9, 10, 11, 12, 13, 15]] = [90, 7, 3, 11, 20, 1, 9, 13, 5, 2, 19]
    over = np.full(EXPERTS, 17, np.int32)
    over[[0, 6]] = -4
    single = np.zeros(EXPERTS, np.int32)
    single[11] = EXPERT_ROWS
    routings = [jnp.asarray(sizes) for sizes in (skewed, over, single)]
    results = [(jax.jit(jax_swiglu.grouped_swiglu)(x, experts, sizes),
                jax.jit(jax_swiglu.grouped_fused_mlp)(x, experts, w_down, sizes))
               for sizes in routings]
    return dict(x=x, experts=experts, w_down=w_down, routings=routings, results=results)


def assert_expert_parallel_equal(actual, expected):
    """An expert-parallel result against the single-device call's: bit for bit where the
    kernels run (each output row is one expert's, computed alone). On XLA's CPU reference
    path a device's dots run over its E / devices experts, and XLA:CPU may add a row's fp32
    products in another order for another batch of experts (jax 0.10.2 does): there one
    bf16 rounding step is allowed."""
    (assert_close if jax.default_backend() == "cpu" else assert_equal)(actual, expected)


def check_expert_parallel(mesh):
    """expert_axis='model': each device holds E / devices experts and runs only their rows;
    the result is the single-device call's bit for bit, replicated, for every routing; the
    only communication is one all-reduce of the result over the expert axis (the experts
    are never gathered). The same inside the user's own shard_map (experts already local),
    and with the mesh passed instead of set (assert_expert_parallel_equal says where "bit for
    bit" holds)."""
    data = expert_inputs()
    shards = mesh.shape["model"]
    experts = put_packed(mesh, data["experts"], "model")
    w_down = put(mesh, data["w_down"], "model")
    swiglu_ep = functools.partial(jax_swiglu.grouped_swiglu, expert_axis="model")
    mlp_ep = functools.partial(jax_swiglu.grouped_fused_mlp, expert_axis="model")
    with jax.set_mesh(mesh):
        for sizes, (y, out) in zip(data["routings"], data["results"]):
            assert_expert_parallel_equal(jax.jit(swiglu_ep)(data["x"], experts, sizes), y)
            result = jax.jit(mlp_ep)(data["x"], experts, w_down, sizes)
            assert_expert_parallel_equal(result, out)
            assert_spec(result, mesh)
        sizes = data["routings"][0]
        for fn, args, width in ((swiglu_ep, (data["x"], experts, sizes), EXPERT_F),
                                (mlp_ep, (data["x"], experts, w_down, sizes), K)):
            found = collectives(compiled_hlo(fn, *args))
            expected = [("all-reduce", [EXPERT_ROWS, width], shards)] if shards > 1 else []
            assert [(kind, dims(shape), size) for kind, shape, size in found] == expected, found
        # Replicated experts are split, not gathered.
        assert_expert_parallel_equal(
            jax.jit(mlp_ep)(data["x"], data["experts"], data["w_down"], sizes),
            data["results"][0][1])
    with_mesh = functools.partial(jax_swiglu.grouped_fused_mlp, expert_axis="model", mesh=mesh)
    assert_expert_parallel_equal(jax.jit(with_mesh)(data["x"], experts, w_down, sizes),
                                 data["results"][0][1])

    def own_experts(x, packed_data, w_down, sizes):
        own = jax_swiglu.PackedExperts.from_packed_data(packed_data, EXPERT_F)
        return jax_swiglu.grouped_fused_mlp(x, own, w_down, sizes, expert_axis="model")

    inside = jax.shard_map(own_experts, mesh=mesh,
                           in_specs=(P(), P("model"), P("model"), P()), out_specs=P())
    assert_expert_parallel_equal(jax.jit(inside)(data["x"], experts.data, w_down, sizes),
                                 data["results"][0][1])
    # A body manual over the expert axis only (XLA's CPU compiler aborts on a 16-bit
    # all-reduce there: the sum runs in fp32).
    partial = jax.shard_map(own_experts, mesh=mesh, axis_names={"model"},
                            in_specs=(P(), P("model"), P("model"), P()), out_specs=P())
    assert_expert_parallel_equal(jax.jit(partial)(data["x"], experts.data, w_down, sizes),
                                 data["results"][0][1])


def check_expert_parallel_lowers_to_local_kernel_calls(mesh):
    """Lowered for CUDA, each device calls the grouped kernel once, on its own experts."""
    require_kernels()
    data = expert_inputs()
    shards = mesh.shape["model"]
    experts = put_packed(mesh, data["experts"], "model")
    with jax.set_mesh(mesh):
        text = jax.jit(functools.partial(jax_swiglu.grouped_swiglu, expert_axis="model")).trace(
            data["x"], experts, data["routings"][0]).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"custom_call @(jax_swiglu_\w+)\((.*)", text)
    assert [target for target, _ in calls] == ["jax_swiglu_grouped_silu_bf16"], calls
    local = (f"tensor<{EXPERT_ROWS}x{K}xbf16>, "
             f"tensor<{EXPERTS // shards}x{K}x{2 * EXPERT_F}xbf16>, "
             f"tensor<{EXPERTS // shards}xi32>")
    assert local in calls[0][1], calls


def check_expert_parallel_errors(mesh):
    """A missing mesh, an axis the mesh lacks, experts that do not split evenly and global
    group sizes of the wrong length inside shard_map: errors that say so."""
    data = expert_inputs()
    x, sizes = data["x"], data["routings"][0]
    call = functools.partial(jax_swiglu.grouped_swiglu, expert_axis="model")
    expect_error(lambda: jax.jit(call)(x, data["experts"], sizes),
                 "not an axis of the current mesh (none is set")
    with jax.set_mesh(mesh):
        expect_error(lambda: jax.jit(functools.partial(
            jax_swiglu.grouped_swiglu, expert_axis="experts"))(x, data["experts"], sizes),
            "its axes are ('data', 'model')")
        if mesh.shape["model"] > 1:
            six = jax_swiglu.pack_expert_weights(*jax_swiglu.unpack_expert_weights(
                data["experts"]))
            six = jax.tree.map(lambda a: a[:6], six)
            expect_error(lambda: jax.jit(call)(x, six, sizes[:6]),
                         "6 experts do not split evenly")
    inside = jax.shard_map(
        lambda x, d, s: call(x, jax_swiglu.PackedExperts.from_packed_data(d, EXPERT_F), s),
        mesh=mesh, in_specs=(P(), P("model"), P()), out_specs=P())
    expect_error(lambda: jax.jit(inside)(x, put(mesh, data["experts"].data, "model"),
                                         sizes[:8]),
                 "one size per expert of the whole call")
    expect_error(lambda: jax.jit(inside)(x, put(mesh, data["experts"].data, "model"),
                                         sizes.astype(jnp.float32)),
                 "group_sizes must be int32")


def check_expert_parallel_flax_blocks(mesh):
    """The nnx and linen expert blocks with expert_axis: the same outputs as without, their
    weights split over the axis by their 'expert' logical name."""
    try:
        from flax import nnx
    except ImportError as error:
        raise Skip("needs flax (the test extra)") from error

    from jax_swiglu import nn as swiglu_nn
    data = expert_inputs()
    sizes, expected = data["routings"][0], data["results"][0][1]
    experts = put_packed(mesh, data["experts"], "model")
    w_down = put(mesh, data["w_down"], "model")
    block = swiglu_nn.FusedExpertsMLP.from_experts(experts, w_down, expert_axis="model")
    with jax.set_mesh(mesh):
        assert_expert_parallel_equal(nnx.jit(lambda b, x, s: b(x, s))(block, data["x"], sizes),
                                     expected)
        linen_block = swiglu_nn.linen.FusedExpertsMLP(EXPERT_F, EXPERTS, expert_axis="model")
        params = {"params": {"gate_up_packed": {"kernel": experts.data},
                             "down_proj": {"kernel": w_down}}}
        assert_expert_parallel_equal(jax.jit(linen_block.apply)(params, data["x"], sizes),
                                     expected)


# name -> (check, mesh shape, axis type)
CHECKS = {}
for _check in (check_column_parallel, check_tensor_parallel_mlp, check_k_sharded_x_is_gathered,
               check_cuda_partitioning, check_shard_map,
               check_shard_map_lowers_to_local_kernel_call,
               check_shard_map_of_padded_n_is_refused, check_vmap,
               check_pack_sharded_weights, check_pack_refuses_split_pairs,
               check_bad_n_split_is_a_clear_error, check_fp8_column_parallel,
               check_expert_parallel, check_expert_parallel_lowers_to_local_kernel_calls,
               check_expert_parallel_errors, check_expert_parallel_flax_blocks):
    for _shape in MESH_SHAPES:
        for _axis_type in AXIS_TYPES:
            CHECKS[f"{_check.__name__[6:]}[{_shape[0]}x{_shape[1]}-{_axis_type}]"] = (
                _check, _shape, _axis_type)
CHECKS["gspmd_partitioner[2x4-auto]"] = (check_gspmd_partitioner, (2, 4), "auto")


def run(name: str) -> dict:
    check, shape, axis_type = CHECKS[name]
    try:
        check(make_mesh(shape, axis_type))
    except Skip as reason:
        return {"name": name, "status": "skipped", "detail": str(reason)}
    except Exception:  # noqa: BLE001 -- reported, with its traceback
        return {"name": name, "status": "failed", "detail": traceback.format_exc()}
    return {"name": name, "status": "passed", "detail": ""}


def main(names) -> int:
    if jax.device_count() != DEVICES:
        print(f"need {DEVICES} devices, found {jax.device_count()}: set XLA_FLAGS="
              f"--xla_force_host_platform_device_count={DEVICES} before JAX starts",
              file=sys.stderr)
        return 2
    failed = False
    for name in names or CHECKS:
        result = run(name)
        failed |= result["status"] == "failed"
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
