"""Text for the device parts of the CLI (typer-free, so tests call them directly).

* `encode_node` backs ``finesched encode-node NODE.yaml``: each node's per-device free vector per
  type and dimension in the S0.2 wire form (what its agent would send), one line each::

      a100-0 gpu gpu-core k=56738263021990500 count=8 bits=7 free=100,100,100,100,100,100,100,100

* `format_grants` backs ``finesched plan``: a binding's devices as ``gpu 0: 50% core, 20Gi``, a MIG
  instance as ``gpu 1: MIG 1g.10gb at start 6`` (its profile and start, the first memory slice, on that GPU).
"""

from __future__ import annotations

from pathlib import Path

from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.manifest import load_manifests
from finesched.model.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, human_amount
from finesched.state.device_wire import encode_node_devices


def encode_node(path: str | Path, node: str | None = None) -> str:
    """The encoded device state of every node in `path` (or only node `node`), one line per dimension.

    Raises ValidationError for an invalid file, a file without nodes or an unknown `node`.
    """
    nodes = load_manifests(Path(path)).nodes
    if node is not None:
        nodes = [n for n in nodes if n.name == node]
        if not nodes:
            raise ValidationError(f"no Node named {node!r} in {path}", path="node", value=node)
    if not nodes:
        raise ValidationError(f"no Node manifest in {path}", path=str(path))
    lines = []
    for item in nodes:
        encoded = encode_node_devices(item)
        if not encoded:
            lines.append(f"{item.name} (no devices)")
        for kind, dims in encoded.items():
            for dim, ev in dims.items():
                free = ",".join(str(v) for v in ev.decode())
                lines.append(f"{item.name} {kind} {dim} k={ev.k} count={ev.count} bits={ev.bits} free={free}")
    return "\n".join(lines)


def format_grants(binding: Binding) -> str:
    """``gpu 0: 50% core, 20Gi; gpu 1: MIG 3g.40gb at start 4; rdma 1: 100%`` ("" when the binding
    holds no devices). A GPU's MIG instances share its entry, each profile with its starts:
    ``gpu 0: MIG 1g.10gb at starts 4, 5``."""
    parts = []
    for kind in sorted(binding.devices):
        instances: dict[int, dict[str, list[int]]] = {}  # minor -> profile -> starts
        for grant in binding.devices[kind]:
            amounts = grant.resources
            if grant.mig is not None:
                instances.setdefault(grant.minor, {}).setdefault(grant.mig.profile, []).append(grant.mig.start)
                continue
            if kind == GPU:
                shown = []
                if GPU_CORE in amounts:
                    shown.append(f"{amounts[GPU_CORE]}% core")
                if GPU_MEMORY in amounts:
                    shown.append(human_amount(GPU_MEMORY, amounts[GPU_MEMORY]))
                elif GPU_MEMORY_RATIO in amounts:
                    shown.append(f"{amounts[GPU_MEMORY_RATIO]}% memory")
            else:
                shown = [f"{v}%" if name == kind else f"{name} {v}" for name, v in amounts.items()]
            parts.append(f"{kind} {grant.minor}: {', '.join(shown)}")
        for minor, profiles in instances.items():
            parts.append(f"{kind} {minor}: MIG " + ", ".join(_starts(p, starts) for p, starts in profiles.items()))
    return "; ".join(parts)


def _starts(profile: str, starts: list[int]) -> str:
    return f"{profile} at start{'s' if len(starts) > 1 else ''} {', '.join(map(str, starts))}"
