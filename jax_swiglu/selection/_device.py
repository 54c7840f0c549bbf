"""The GPU a call is lowered for, as the selection sees it: a fingerprint of what decides
which kernel is fastest (kind, compute capability, SM count, DRAM bandwidth).

Tuning data and autotune results are keyed by it, so parts that share a fingerprint share
entries and a part with another SM count (an H100 PCIe has 114 SMs where an H100 SXM and an
H200 have 132) is treated as unmeasured.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from .. import _native


@dataclasses.dataclass(frozen=True)
class Device:
    kind: str  # jax's device_kind, e.g. "NVIDIA H200"
    compute_capability: int  # 90 for SM90
    sm_count: int
    dram_bytes_per_s: float  # peak, from the memory clock and bus width
    local: bool = True  # False: no GPU here, the facts are assumed (cross-lowering)
    # (cluster size, clusters that fit at once) where measured (_model.round_ctas); not part
    # of the fingerprint: it follows from the part.
    cluster_slots_measured: tuple = ()

    @property
    def cluster_slots(self) -> dict:
        return dict(self.cluster_slots_measured)

    @property
    def fingerprint(self) -> str:
        return f"{self.kind}|sm{self.compute_capability}|{self.sm_count}sms"

    def as_dict(self) -> dict:
        facts = {"kind": self.kind, "compute_capability": self.compute_capability,
                 "sm_count": self.sm_count, "dram_bytes_per_s": self.dram_bytes_per_s}
        if self.cluster_slots_measured:
            facts["cluster_slots"] = {str(size): n for size, n in self.cluster_slots_measured}
        return facts


@functools.cache
def local_device() -> Device | None:
    """The first local CUDA GPU, or None when JAX sees none (lowering for CUDA from a CPU)."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None
    device = devices[0]
    facts = _native.device_facts()
    capability = str(getattr(device, "compute_capability", "") or "").replace(".", "")
    sm_count = facts["sm_count"] or int(getattr(device, "core_count", 0) or 0)
    found = Device(kind=str(device.device_kind),
                   compute_capability=int(capability) if capability.isdigit()
                   else facts["compute_capability"],
                   sm_count=sm_count, dram_bytes_per_s=float(facts["dram_bytes_per_s"]))
    # Cluster slots as this GPU reports them; without the query, as measured on this part
    # where its tuning data was calibrated.
    slots = facts.get("cluster_slots")
    if not slots:
        from . import _data  # (a cycle at import time otherwise)
        data = _data.shipped(found.kind)
        if data is not None and data.device.get("sm_count") == sm_count:
            slots = data.device.get("cluster_slots")
    return dataclasses.replace(found, cluster_slots_measured=_slots(slots))


def _slots(measured) -> tuple:
    return tuple(sorted((int(size), int(n)) for size, n in (measured or {}).items()))


def device_from_dict(facts: dict, *, local: bool) -> Device:
    return Device(kind=facts["kind"], compute_capability=int(facts["compute_capability"]),
                  sm_count=int(facts["sm_count"]),
                  dram_bytes_per_s=float(facts["dram_bytes_per_s"]), local=local,
                  cluster_slots_measured=_slots(facts.get("cluster_slots")))
