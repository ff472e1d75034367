"""Device requests: Koordinator's translation and validation (S1.2-S1.3), and the per-device fit rule.

`normalize_device_request` follows ../shared/reference/CPU-DEVICE-SEMANTICS.md "Koordinator device
sharing" rule by rule, so a Koordinator pod asks for the same thing here:

* translation: ``nvidia.com/gpu`` (``amd.com/gpu``, ``dcu.com/gpu``) N -> N whole GPUs; the
  ``gpu`` shortcut X -> gpu-core = gpu-memory-ratio = X; zero amounts are dropped;
* validation: ``gpu``, ``rdma``, ``fpga`` (and manifest-defined types) must be <= 100 or a
  multiple of 100 ("invalid resource unit <name>: <value>"); the GPU names must form an allowed
  combination ("invalid resource device requests: [<names>]"; ``huawei.com/npu-core`` only with
  gpu-memory-ratio, never alone); gpu-core and gpu-memory-ratio follow the same percentage rule,
  or with ``gpu.shared`` = S must be multiples of S and <= 100·S;
* per-GPU split: count = S with gpu.shared, else ratio/100 when ratio > 100, else 1; every
  quantity is divided by the count; gpu-memory is dropped when the ratio is given (it is filled
  in per card after allocation, S1.3); RDMA/FPGA above 100 are value/100 whole devices.

`FitRule` is what one device must have free for one instance, compiled against a device type's
dimensions; `fit_mask` evaluates it on arrays of any leading shape, so the vectorized filter and
the exact allocator share one definition of "fits" (and therefore agree).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from finesched.model.resources import (
    ALIAS_PREFIXES,
    FPGA,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    GPU_SHARED,
    RDMA,
    WHOLE_GPU_NAMES,
    ResourceVector,
    canonical_name,
    koordinator_name,
    resource_kind,
)
from finesched.model.workload import DeviceHint, DeviceJointAllocate, DeviceLabelSelector
from finesched.quantity import QuantityError, format_quantity, parse_quantity
from finesched.sched.framework import Code

if TYPE_CHECKING:
    from finesched.model.gpu_partitions import GPUPartitionSpec
    from finesched.plugins.deviceshare.mig import MIGRequest

BoolArray = npt.NDArray[np.bool_]
Int64Array = npt.NDArray[np.int64]

#: Huawei Ascend NPU compute (AI cores, not a percentage); Koordinator counts NPUs as GPU-type devices.
HUAWEI_NPU_CORE = "huawei.com/npu-core"
#: Canonical names that ask for GPUs.
GPU_NAMES = frozenset({GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED, HUAWEI_NPU_CORE, *WHOLE_GPU_NAMES})
_PERCENT_GPU = frozenset({GPU_CORE, GPU_MEMORY_RATIO})
_KOORD = (
    frozenset({GPU}),
    frozenset({GPU_CORE, GPU_MEMORY}),
    frozenset({GPU_CORE, GPU_MEMORY_RATIO}),
    frozenset({GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO}),
    frozenset({GPU_MEMORY}),
    frozenset({GPU_MEMORY_RATIO}),
    frozenset({GPU_MEMORY, GPU_MEMORY_RATIO}),
)
#: Koordinator's one NPU form built from names finesched knows: npu-core with gpu-memory-ratio
#: (deviceshare/utils.go ``HuaweiNPUCore | GPUMemoryRatio``). npu-core alone is invalid, like gpu-core
#: alone: it says nothing about device memory. Koordinator's shared NPU forms also need
#: huawei.com/npu-cpu (and npu-dvpp), names the reference files do not define, so they stay invalid.
_NPU = (frozenset({HUAWEI_NPU_CORE, GPU_MEMORY_RATIO}),)
#: Allowed GPU name sets: a whole-GPU name alone, Koordinator names (optionally with gpu.shared), or
#: npu-core with gpu-memory-ratio. So gpu-core alone, npu-core alone, gpu.shared alone, and
#: nvidia.com/gpu mixed with koordinator names are invalid.
VALID_GPU_COMBINATIONS = frozenset(
    {frozenset({name}) for name in WHOLE_GPU_NAMES} | set(_KOORD) | {c | {GPU_SHARED} for c in _KOORD} | set(_NPU)
)
JOINT_SCOPES = ("SamePCIe", "SameNUMA")


class InvalidDeviceRequest(ValueError):
    """A device request Koordinator would reject; `names`/`values` are the offending ones."""

    def __init__(self, message: str, names: Sequence[str] = (), values: Sequence[str] = ()):
        self.names = tuple(names)
        self.values = tuple(values)
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class TypeHint:
    """A type's deviceAllocateHint, compiled (hints.py applies it; model/workload.py DeviceHint says what
    each field means). `scope` is "PCIe" or "NUMANode" (Device and Node constrain nothing)."""

    selector: DeviceLabelSelector | None = None
    apply_all: bool = False
    scope: str | None = None
    exclusive: str | None = None


@dataclass(frozen=True, slots=True)
class TypeRequest:
    """`count` devices of `type`, each giving `per_device` (short names, canonical ints).

    With a hint whose allocateStrategy is ApplyForAll, `count` is only the lower bound (1): the
    node's matching devices decide how many are taken.
    """

    type: str
    count: int
    per_device: ResourceVector
    #: True when one device is shared (per-GPU ratio < 100, or gpu-memory in bytes; < 100 for others).
    shared: bool
    hint: TypeHint | None = None


@dataclass(frozen=True, slots=True)
class JointSpec:
    """deviceJointAllocate: the types' devices on the primary's (first type's) PCIe switches or NUMA nodes."""

    types: tuple[str, ...]
    scope: str = "SamePCIe"


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """A workload's normalized device request: one TypeRequest per type ({} = nothing to do), MIG
    instances (mig.py) and the gpu-partition-spec (partitions.py).

    Hashable as a whole (every compared field, `types` by its items), hashed once: the device
    offer memo (plugin.py `reserve`) keys on the request itself, so no field can be left out of
    its key (a key of hand-picked fields once missed `mig`, and one MIG request got another's
    grant).
    """

    types: dict[str, TypeRequest] = field(default_factory=dict)
    joint: JointSpec | None = None
    mig: MIGRequest | None = None
    partition: GPUPartitionSpec | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self._fields()))

    def _fields(self) -> tuple[object, ...]:
        values = (getattr(self, f.name) for f in fields(self) if f.compare)
        return tuple(frozenset(v.items()) if isinstance(v, dict) else v for v in values)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt through __init__, so a copy in another process hashes with that process's seed.
        return (DeviceRequest, (self.types, self.joint, self.mig, self.partition))


def device_resource(name: str, device_types: Collection[str] = ()) -> tuple[str, str] | None:
    """(device type, canonical name) when `name` asks for a device, else None (a scalar resource).

    GPU names, rdma and fpga always do; any other type found in node manifests (S1.4) does under
    its own name, bare or with a ``koordinator.sh/`` or ``kubernetes.io/`` prefix.
    """
    short = canonical_name(name)
    if short in GPU_NAMES:
        return GPU, short
    if short in (RDMA, FPGA):
        return short, short
    for prefix in (*ALIAS_PREFIXES, ""):
        if name.startswith(prefix) and name[len(prefix) :] in device_types:
            kind = name[len(prefix) :]
            return kind, kind
    return None


def _shown(name: str) -> str:
    return name if name in WHOLE_GPU_NAMES else koordinator_name(name)


def _unit_error(name: str, amount: int) -> InvalidDeviceRequest:
    text = format_quantity(amount, resource_kind(name)) if amount >= 0 else str(amount)
    return InvalidDeviceRequest(f"invalid resource unit {_shown(name)}: {text}", [_shown(name)], [text])


def _amount(name: str, short: str, value: object) -> int:
    if isinstance(value, bool):
        raise InvalidDeviceRequest(f"invalid resource unit {_shown(short)}: {value!r}", [name], [repr(value)])
    try:
        amount = value if isinstance(value, int) else parse_quantity(value, resource_kind(short), allow_negative=True)  # type: ignore[arg-type]
    except QuantityError as exc:
        raise InvalidDeviceRequest(f"invalid resource unit {_shown(short)}: {exc}", [name], [str(value)]) from None
    if amount < 0:
        text = str(value)
        raise InvalidDeviceRequest(
            f"invalid resource unit {_shown(short)}: {text} (must not be negative)", [_shown(short)], [text]
        )
    return amount


def _check_percent(name: str, amount: int) -> None:
    """Koordinator's unit rule: at most 100 (part of one device) or whole devices (a multiple of 100)."""
    if amount > 100 and amount % 100:
        raise _unit_error(name, amount)


def normalize_device_request(
    requests: Mapping[str, str | int],
    *,
    device_types: Collection[str] = (),
    joint: DeviceJointAllocate | JointSpec | None = None,
    hints: Mapping[str, DeviceHint] | None = None,
) -> DeviceRequest:
    """Translate and validate a workload's device requests (module docstring); raise InvalidDeviceRequest.

    Names that are not device names pass through untouched (the scalar fit owns them).
    `device_types` adds manifest-defined types; `joint` must name only requested types. `hints`
    (deviceAllocateHint) attach to the types they name; a hint on a type not requested does nothing.
    """
    hints = hints or {}
    gpu: dict[str, int] = {}
    other: dict[str, int] = {}
    for name, value in requests.items():
        hit = device_resource(name, device_types)
        if hit is None:
            continue
        kind, short = hit
        amount = _amount(name, short, value)
        target = gpu if kind == GPU else other
        if short in target:
            raise InvalidDeviceRequest(f"{_shown(short)} is requested twice (under two names)", [name])
        if amount:
            target[short] = amount
    types: dict[str, TypeRequest] = {}
    if gpu:
        types[GPU] = _gpu_request(gpu, _as_count(hints.get(GPU)))
    for kind, amount in other.items():
        if _as_count(hints.get(kind)):  # RequestsAsCount: the amount is a number of whole devices
            types[kind] = TypeRequest(kind, amount, ResourceVector({kind: 100}), False)
            continue
        _check_percent(kind, amount)
        count, each = (amount // 100, 100) if amount > 100 else (1, amount)
        types[kind] = TypeRequest(kind, count, ResourceVector({kind: each}), each < 100)
    for kind, hint in hints.items():
        if kind in types:
            types[kind] = _with_hint(types[kind], hint)
    return DeviceRequest(types, _joint(joint, types))


def _as_count(hint: DeviceHint | None) -> bool:
    return hint is not None and hint.allocate_strategy == "RequestsAsCount"


def _with_hint(request: TypeRequest, hint: DeviceHint) -> TypeRequest:
    selector = hint.selector if hint.selector is not None and not hint.selector.empty else None
    scope = hint.required_topology_scope if hint.required_topology_scope in ("PCIe", "NUMANode") else None
    apply_all = hint.allocate_strategy == "ApplyForAll"
    compiled = TypeHint(selector, apply_all, scope, hint.exclusive_policy)
    if compiled == TypeHint():
        return request  # an empty hint changes nothing: keep the hint-less request (and its caches)
    return TypeRequest(request.type, 1 if apply_all else request.count, request.per_device, request.shared, compiled)


def _gpu_request(gpu: dict[str, int], as_count: bool = False) -> TypeRequest:
    names = frozenset(gpu)
    if names not in VALID_GPU_COMBINATIONS:
        shown = sorted(_shown(n) for n in names)
        raise InvalidDeviceRequest(f"invalid resource device requests: [{' '.join(shown)}]", shown)
    whole = names & WHOLE_GPU_NAMES
    if as_count and not whole:
        if names != {GPU}:
            shown = sorted(_shown(n) for n in names)
            raise InvalidDeviceRequest(
                f"deviceAllocateHint.gpu.allocateStrategy RequestsAsCount needs {_shown(GPU)} or a whole-GPU "
                f"name (a count of GPUs), not [{' '.join(shown)}]",
                shown,
            )
        whole = frozenset({GPU})
    if whole:
        count = gpu[next(iter(whole))]
        return TypeRequest(GPU, count, ResourceVector({GPU_CORE: 100, GPU_MEMORY_RATIO: 100}), False)
    shared = gpu.get(GPU_SHARED, 0)
    if GPU in gpu:
        core = ratio = gpu[GPU]
        percent = {GPU: gpu[GPU]}
    else:
        core, ratio = gpu.get(GPU_CORE, 0), gpu.get(GPU_MEMORY_RATIO, 0)
        percent = {n: gpu[n] for n in _PERCENT_GPU & names}
    for name, amount in percent.items():
        if not shared:
            _check_percent(name, amount)
        elif amount % shared or amount > 100 * shared:
            raise InvalidDeviceRequest(
                f"invalid resource unit {_shown(name)}: {amount} (with {_shown(GPU_SHARED)} = {shared} it must be "
                f"a multiple of {shared} and at most {100 * shared})",
                [_shown(name)],
                [str(amount)],
            )
    count = shared or (ratio // 100 if ratio > 100 and ratio % 100 == 0 else 1)
    per: dict[str, int] = {}
    if core:
        per[GPU_CORE] = core // count
    if HUAWEI_NPU_CORE in gpu:  # AI cores per NPU, in the device's own dimension (no percentage rule)
        per[HUAWEI_NPU_CORE] = gpu[HUAWEI_NPU_CORE] // count
    if ratio:
        per[GPU_MEMORY_RATIO] = ratio // count
    elif GPU_MEMORY in gpu:
        per[GPU_MEMORY] = gpu[GPU_MEMORY] // count
    is_shared = per.get(GPU_MEMORY_RATIO, 100) < 100 or GPU_MEMORY in per
    return TypeRequest(GPU, count, ResourceVector(per), is_shared)


def _joint(joint: DeviceJointAllocate | JointSpec | None, types: Mapping[str, TypeRequest]) -> JointSpec | None:
    if joint is None:
        return None
    if isinstance(joint, JointSpec):
        spec = joint
    else:
        spec = JointSpec(tuple(joint.device_types), joint.required_scope)
    missing = [t for t in spec.types if t not in types]
    if missing or len(set(spec.types)) != len(spec.types) or len(spec.types) < 2:
        raise InvalidDeviceRequest(
            f"deviceJointAllocate names {list(spec.types)}: every type must be distinct and requested "
            f"(requested: {sorted(types)}; not requested: {missing})",
            missing,
        )
    if spec.scope not in JOINT_SCOPES:
        raise InvalidDeviceRequest(f"deviceJointAllocate requiredScope {spec.scope!r}; valid: {list(JOINT_SCOPES)}")
    return spec


# The per-device fit rule -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FitRule:
    """What one device (dimension indices of its type) must have for one instance of a request.

    Besides ``free[k] >= amount`` per requested dimension, GPU memory stays consistent both ways:
    a ratio share r needs ``free gpu-memory >= r · total / 100`` on that card (ratio -> bytes is per
    card, S1.3) and, when r < 100, a card with a memory figure; a bytes share m needs
    ``free ratio >= ⌊m · 100 / total⌋``. So no grant can push any dimension above 100%.
    """

    thresholds: tuple[tuple[int, int], ...] = ()
    ratio_bytes: tuple[int, int] | None = None  # (ratio, memory dim)
    bytes_ratio: tuple[int, int, int] | None = None  # (bytes, ratio dim, memory dim)
    needs_memory: int | None = None  # memory dim whose total must be > 0
    missing: tuple[str, ...] = ()  # requested dimensions the type does not have: nothing fits


def compile_rule(request: TypeRequest, dims: Sequence[str]) -> FitRule:
    """The FitRule of `request` against a type whose dimensions are `dims` (in array order)."""
    return _compile_rule(request, tuple(dims))


@lru_cache(maxsize=1024)
def _compile_rule(request: TypeRequest, dims: tuple[str, ...]) -> FitRule:
    index = {name: k for k, name in enumerate(dims)}
    thresholds, missing = [], []
    for name, amount in request.per_device.items():
        if name in index:
            thresholds.append((index[name], amount))
        elif amount > 0:
            missing.append(name)
    ratio, nbytes, mem = (
        request.per_device.get(GPU_MEMORY_RATIO),
        request.per_device.get(GPU_MEMORY),
        index.get(GPU_MEMORY),
    )
    ratio_bytes = bytes_ratio = needs = None
    if request.type == GPU:
        if ratio and ratio < 100:
            if mem is None:
                missing.append(GPU_MEMORY)
            needs = mem
        if ratio and mem is not None:
            ratio_bytes = (ratio, mem)
        if nbytes and mem is not None and GPU_MEMORY_RATIO in index and nbytes < 2**56:
            bytes_ratio = (nbytes, index[GPU_MEMORY_RATIO], mem)
    return FitRule(tuple(thresholds), ratio_bytes, bytes_ratio, needs, tuple(missing))


def fit_mask(rule: FitRule, free: Int64Array, total: Int64Array, healthy: BoolArray) -> BoolArray:
    """[..., D] True where one instance fits; free/total are [K, ..., D], healthy [..., D]."""
    if rule.missing:
        return np.zeros(healthy.shape, dtype=bool)
    ok = healthy.copy()
    for k, amount in rule.thresholds:
        ok &= free[k] >= amount
    if rule.needs_memory is not None:
        ok &= total[rule.needs_memory] > 0
    if rule.ratio_bytes is not None:
        ratio, m = rule.ratio_bytes
        ok &= free[m] >= total[m] * ratio // 100
    if rule.bytes_ratio is not None:
        nbytes, r, m = rule.bytes_ratio
        ok &= free[r] >= (nbytes * 100) // np.maximum(total[m], 1)
    return ok


def device_label(kind: str, plural: bool = False) -> str:
    """How reasons name a device: "GPU"/"GPUs", "rdma device"/"rdma devices"."""
    if kind == GPU:
        return "GPUs" if plural else "GPU"
    return f"{kind} devices" if plural else f"{kind} device"


def _groups(rule: FitRule, dims: Sequence[str]) -> dict[str, FitRule]:
    """The rule split by what a user reads: gpu-core, gpu-memory (ratio, bytes), other dimensions."""

    def label(k: int) -> str:
        return GPU_MEMORY if dims[k] == GPU_MEMORY_RATIO else dims[k]

    out: dict[str, list[tuple[int, int]]] = {}
    for k, amount in rule.thresholds:
        out.setdefault(label(k), []).append((k, amount))
    rules = {name: FitRule(tuple(t)) for name, t in out.items()}
    if rule.ratio_bytes or rule.bytes_ratio:
        base = rules.get(GPU_MEMORY, FitRule())
        rules[GPU_MEMORY] = FitRule(base.thresholds, rule.ratio_bytes, rule.bytes_ratio)
    return rules


def explain_type(
    kind: str,
    rule: FitRule,
    count: int,
    dims: Sequence[str],
    free: Int64Array,
    total: Int64Array,
    healthy: BoolArray,
    valid: BoolArray,
) -> dict[str, tuple[BoolArray, Code | BoolArray]]:
    """Why nodes (rows of [K, n, D] arrays) cannot give `count` devices: reason -> (node mask, code).

    Reasons: "node has no gpu" (unresolvable), "GPUs report no gpu-memory (a <gpu-memory-ratio |
    gpu-memory> share needs it)" (a ratio or bytes share on cards without a memory figure;
    unresolvable), "gpu device unhealthy" (only unhealthy devices would fit), "insufficient <dim>
    on any single GPU" (one device asked, none has enough of that dimension), otherwise
    "insufficient free GPUs". A reason is unresolvable on the nodes that could not fit even empty.
    """
    fits = fit_mask(rule, free, total, healthy).sum(axis=-1)
    failing = fits < count
    has = valid.any(axis=-1)
    never = fit_mask(rule, total, total, valid).sum(axis=-1) < count
    out: dict[str, tuple[BoolArray, Code | BoolArray]] = {}

    def add(reason: str, mask: BoolArray, code: Code | None = None) -> None:
        if mask.any():
            out[reason] = (mask, never if code is None else code)

    add(f"node has no {kind}", failing & ~has, Code.UNRESOLVABLE)
    rest = failing & has
    if GPU_MEMORY in rule.missing:
        memoryless = rest
    elif rule.needs_memory is not None:
        memoryless = rest & ~(valid & (total[rule.needs_memory] > 0)).any(axis=-1)
    else:
        memoryless = np.zeros_like(rest)
    # a ratio share asks for the ratio dimension; a bytes share does not (it asks for gpu-memory itself)
    share = GPU_MEMORY_RATIO if any(dims[k] == GPU_MEMORY_RATIO for k, _ in rule.thresholds) else GPU_MEMORY
    add(f"{device_label(kind, True)} report no gpu-memory (a {share} share needs it)", memoryless, Code.UNRESOLVABLE)
    rest = rest & ~memoryless
    unhealthy = rest & (fit_mask(rule, free, total, valid).sum(axis=-1) >= count)
    add(f"{kind} device unhealthy", unhealthy, Code.UNSCHEDULABLE)
    rest = rest & ~unhealthy
    covered = np.zeros_like(rest)
    if count == 1 and not rule.missing:
        for name, part in _groups(rule, dims).items():
            if name == kind:  # one-dimension types: "insufficient free rdma devices" says it all
                continue
            short = rest & (fit_mask(part, free, total, healthy).sum(axis=-1) < 1)
            add(f"insufficient {name} on any single {device_label(kind)}", short)
            covered |= short
    add(f"insufficient free {device_label(kind, True)}", rest & ~covered)
    return out
