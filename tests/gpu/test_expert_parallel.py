"""Expert parallelism on the local GPUs: ``grouped_fused_mlp(..., expert_axis=...)`` with the
experts split over every GPU of the host runs the grouped kernel on each GPU's own experts and
gives the one-GPU result bit for bit.

Needs two or more SM90 GPUs (the ``nvidia-h200-x2`` machine, with NCCL's NVLink multicast
off: ``NCCL_NVLS_ENABLE=0``); tests/sharding_checks.py checks the same on 8 host devices,
where the experts take the XLA path.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_swiglu

GPUS = jax.local_device_count() if jax.default_backend() == "gpu" else 0

pytestmark = pytest.mark.skipif(
    GPUS < 2, reason=f"expert parallelism needs 2 or more GPUs, found {GPUS}")

# Mixtral's routing on small experts, and Qwen3-MoE's many-expert routing at decode.
CASES = [(8, 1024, 1408, 2, 512), (64, 2048, 768, 8, 8)]  # E, K, F, top-k, tokens


def _inputs(experts, k, f, top_k, tokens, key):
    kx, kg, ku, kd, ks = jax.random.split(key, 5)
    rows = tokens * top_k
    x = jax.random.normal(kx, (rows, k), jnp.bfloat16)
    w_gate, w_up = ((jax.random.normal(key, (experts, k, f)) / np.sqrt(k)).astype(jnp.bfloat16)
                    for key in (kg, ku))
    w_down = (jax.random.normal(kd, (experts, f, k)) / np.sqrt(f)).astype(jnp.bfloat16)
    # Skewed: one expert takes half the rows, a quarter of the experts none, 5 rows left over.
    rng = np.random.default_rng(int(jax.random.randint(ks, (), 0, 2**31 - 1)))
    sizes = np.zeros(experts, np.int64)
    order = rng.permutation(experts)
    sizes[order[0]] = rows // 2
    rest = order[1 + experts // 4:]
    sizes[rest] += (rows - 5 - rows // 2) // len(rest)
    return x, jax_swiglu.pack_expert_weights(w_gate, w_up), w_down, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("experts, k, f, top_k, tokens", CASES)
def test_experts_split_over_the_gpus_match_one_gpu(experts, k, f, top_k, tokens, key):
    x, packed, w_down, sizes = _inputs(experts, k, f, top_k, tokens, key)
    one_gpu = jax.jit(jax_swiglu.grouped_fused_mlp)(x, packed, w_down, sizes)
    swiglu_one_gpu = jax.jit(jax_swiglu.grouped_swiglu)(x, packed, sizes)

    mesh = jax.make_mesh((GPUS,), ("expert",))
    split = NamedSharding(mesh, P("expert"))
    packed_split = jax.tree.map(lambda a: jax.device_put(a, split), packed)
    w_down_split = jax.device_put(w_down, split)
    with jax.set_mesh(mesh):
        mlp = jax.jit(functools.partial(jax_swiglu.grouped_fused_mlp, expert_axis="expert"))
        swiglu = jax.jit(functools.partial(jax_swiglu.grouped_swiglu, expert_axis="expert"))
        np.testing.assert_array_equal(np.asarray(mlp(x, packed_split, w_down_split, sizes),
                                                 np.float32),
                                      np.asarray(one_gpu, np.float32))
        y = swiglu(x, packed_split, sizes)
        np.testing.assert_array_equal(np.asarray(y, np.float32),
                                      np.asarray(swiglu_one_gpu, np.float32))
        with jax.default_matmul_precision("highest"):
            r = jax_swiglu.grouped_swiglu_reference(
                x.astype(jnp.float32),
                *(w.astype(jnp.float32) for w in jax_swiglu.unpack_expert_weights(packed)),
                sizes)
        y32 = np.asarray(y, np.float32)
        assert not np.any(~(np.abs(y32 - r) <= 0.01 * np.abs(r) + 1e-3))
        hlo = mlp.lower(x, packed_split, w_down_split, sizes).compile().as_text()
    # One grouped kernel call per GPU on its own experts, one all-reduce of the result.
    calls = re.findall(r"custom_call_target=\"(jax_swiglu_grouped_\w+)\"", hlo)
    assert calls == ["jax_swiglu_grouped_silu_bf16"], calls
    local = f"bf16[{experts // GPUS},{k},{packed.data.shape[2]}]"
    assert local in hlo, local
    assert len(re.findall(r"all-reduce(?:-start)?\(", hlo)) == 1
