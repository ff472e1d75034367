"""Resource names, their units, and `ResourceVector`, the immutable amount-per-resource map.

Every amount inside finesched is a canonical integer (DESIGN.md "Units"):

* ``cpu`` in millicores;
* ``memory``, ``ephemeral-storage``, ``storage``, ``gpu-memory`` and ``hugepages-*`` in bytes;
* device dimensions (``gpu-core``, ``gpu-memory-ratio``, ``gpu``, ``rdma``, ``fpga``) in percent of
  one device (100 = a whole device);
* everything else (``pods``, ``nvidia.com/gpu``, extended resources) as whole counts.

Users write names the way their tools do. ``koordinator.sh/gpu-core``, ``kubernetes.io/gpu-core``
and ``gpu-core`` are one resource (seed S1.1 uses the ``kubernetes.io`` names, Koordinator the
``koordinator.sh`` ones); we keep the short name inside and write ``koordinator.sh/...`` where a
peer expects it. ``nvidia.com/gpu`` stays its own name: it means whole GPUs and is translated by
the device plugin, not here.
"""

from __future__ import annotations

import re
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import PlainSerializer, PlainValidator
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from finesched.quantity import QuantityError, format_quantity, human_quantity, parse_quantity

Kind = Literal["cpu", "bytes", "count"]

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
GPU_CORE = "gpu-core"
GPU_MEMORY = "gpu-memory"
GPU_MEMORY_RATIO = "gpu-memory-ratio"
GPU = "gpu"
GPU_SHARED = "gpu.shared"
RDMA = "rdma"
FPGA = "fpga"
NVIDIA_GPU = "nvidia.com/gpu"

#: Short names that also answer to ``koordinator.sh/<name>`` and ``kubernetes.io/<name>``.
ALIASED_NAMES = frozenset({GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU, GPU_SHARED, RDMA, FPGA})
ALIAS_PREFIXES = ("koordinator.sh/", "kubernetes.io/")
KOORDINATOR_PREFIX = "koordinator.sh/"

#: Resources that describe devices; the device plugin owns them, not the scalar fit.
DEVICE_RESOURCE_NAMES = frozenset(
    {GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU, GPU_SHARED, RDMA, FPGA, NVIDIA_GPU, "amd.com/gpu", "dcu.com/gpu"}
)

_BYTE_NAMES = frozenset({MEMORY, "ephemeral-storage", "storage", GPU_MEMORY})

# A Kubernetes resource name: an optional DNS-subdomain prefix, then a qualified name.
_NAME_RE = re.compile(r"^(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$")
#: The same rule as a regular expression's text (the API's JSON schema gives it to clients).
NAME_PATTERN = _NAME_RE.pattern


def canonical_name(name: str) -> str:
    """The one name finesched uses for `name` (aliases folded to the short form)."""
    for prefix in ALIAS_PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :] in ALIASED_NAMES:
            return name[len(prefix) :]
    return name


def koordinator_name(name: str) -> str:
    """The name Koordinator writes in annotations: ``gpu-core`` -> ``koordinator.sh/gpu-core``."""
    short = canonical_name(name)
    return KOORDINATOR_PREFIX + short if short in ALIASED_NAMES else short


def resource_kind(name: str) -> Kind:
    """How amounts of resource `name` are parsed and stored (see the module docstring)."""
    short = canonical_name(name)
    if short == CPU:
        return "cpu"
    if short in _BYTE_NAMES or short.startswith("hugepages-"):
        return "bytes"
    return "count"


def human_amount(name: str, value: int | str) -> str:
    """An amount of resource `name` as every human view shows it (`quantity.human_quantity`:
    "500m", "4", "9.6Gi"). `value` may be the exact integer or the API's quantity text ("4Gi",
    "10307921510"), which is read first; text that is no quantity is shown as it is."""
    kind = resource_kind(name)
    if isinstance(value, str):
        try:
            value = parse_quantity(value, kind, allow_negative=True)
        except QuantityError:
            return value
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    return human_quantity(value, kind)


def human_amounts(amounts: Mapping[str, int | str], sep: str = "=") -> str:
    """``cpu=500m, memory=9.6Gi``: every amount of `amounts` through `human_amount`."""
    return ", ".join(f"{name}{sep}{human_amount(name, value)}" for name, value in amounts.items())


def check_name(name: object) -> str | None:
    """Why `name` is not a valid resource name, or None when it is."""
    if not isinstance(name, str):
        return f"resource names are strings, got {type(name).__name__}"
    if not _NAME_RE.match(name):
        return "is not a valid resource name (an optional domain/ prefix, then letters, digits, -, _ or .)"
    return None


class ResourceVector(Mapping[str, int]):
    """An immutable map from canonical resource name to a canonical integer amount.

    Build one from user input with `ResourceVector.parse` (names folded, quantities parsed, every
    problem reported with its key), or from trusted canonical ints with the constructor. It is
    hashable and compares equal to any mapping with the same items, so tests may compare it with
    a plain dict. Pydantic fields typed `ResourceVector` accept both forms and dump quantities
    in their shortest exact text form ("8Gi", "500m").
    """

    __slots__ = ("_data", "_hash", "layout_cache")

    def __init__(self, data: Mapping[str, int] | None = None, /, **amounts: int):
        merged = dict(data or {}, **amounts)
        for name, value in merged.items():
            if type(value) is not int:
                raise TypeError(f"ResourceVector amounts are ints; {name}={value!r}")
        self._data: dict[str, int] = merged
        self._hash: int | None = None
        #: Scratch slot for ClusterState: this vector's row indices in one state layout.
        self.layout_cache: tuple[object, ...] | None = None

    @classmethod
    def parse(cls, raw: object, *, allow_negative: bool = False) -> ResourceVector:
        """Parse user input ``{name: quantity}``; raise a pydantic ValidationError listing each bad key."""
        if isinstance(raw, ResourceVector):
            return raw
        if raw is None:
            return EMPTY
        if not isinstance(raw, Mapping):
            raise PydanticCustomError("resource_map", "must be a mapping of resource name to quantity")
        data: dict[str, int] = {}
        errors: list[InitErrorDetails] = []
        for key, value in raw.items():
            problem = check_name(key)
            name = canonical_name(key) if problem is None else str(key)
            if problem is None and name in data:
                problem = f"names the same resource as another key ({name})"
            if problem is None:
                try:
                    data[name] = parse_quantity(value, resource_kind(name), allow_negative=allow_negative)
                    continue
                except QuantityError as exc:
                    problem = str(exc)
            errors.append(_line_error(key, problem, value))
        if errors:
            raise pydantic_core.ValidationError.from_exception_data("resources", errors)
        return cls(data)

    # Mapping protocol -------------------------------------------------------------------------
    def __getitem__(self, name: str) -> int:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    # The dict's own views and lookups: the Mapping mixins would route every item through
    # __getitem__ in Python, and vectors are read item by item on the scheduling hot path.
    def items(self) -> ItemsView[str, int]:
        return self._data.items()

    def keys(self) -> KeysView[str]:
        return self._data.keys()

    def values(self) -> ValuesView[int]:
        return self._data.values()

    def get(self, name: str, default: Any = None) -> Any:
        return self._data.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResourceVector):
            return self._data == other._data
        if isinstance(other, Mapping):
            return dict(self._data) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ResourceVector({self._data!r})"

    # Arithmetic ---------------------------------------------------------------------------------
    def __add__(self, other: Mapping[str, int]) -> ResourceVector:
        out = dict(self._data)
        for name, value in other.items():
            out[name] = out.get(name, 0) + value
        return ResourceVector(out)

    def __sub__(self, other: Mapping[str, int]) -> ResourceVector:
        out = dict(self._data)
        for name, value in other.items():
            out[name] = out.get(name, 0) - value
        return ResourceVector(out)

    def fits_in(self, capacity: Mapping[str, int]) -> bool:
        """True when every amount here is at most the same resource's amount in `capacity`."""
        return all(value <= capacity.get(name, 0) for name, value in self._data.items())

    def nonzero(self) -> ResourceVector:
        """The same amounts without the zero entries."""
        return ResourceVector({k: v for k, v in self._data.items() if v})

    def without(self, names: frozenset[str] | set[str]) -> ResourceVector:
        return ResourceVector({k: v for k, v in self._data.items() if k not in names})

    def only(self, names: frozenset[str] | set[str]) -> ResourceVector:
        return ResourceVector({k: v for k, v in self._data.items() if k in names})

    def to_quantities(self) -> dict[str, str]:
        """Amounts as their shortest exact quantity strings (the manifest form)."""
        return {name: format_quantity(value, resource_kind(name)) for name, value in self._data.items()}

    # pydantic integration ----------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.to_quantities(), when_used="always"
            ),
            json_schema_input_schema=core_schema.dict_schema(
                core_schema.str_schema(), core_schema.union_schema([core_schema.str_schema(), core_schema.int_schema()])
            ),
        )


def _line_error(key: object, message: str, value: object) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("resource", "{message}", {"message": message}),
        loc=(str(key),),
        input=value,
    )


EMPTY = ResourceVector()


#: Names meaning "N whole GPUs" (Koordinator translates each to core = ratio = 100·N).
WHOLE_GPU_NAMES = frozenset({NVIDIA_GPU, "amd.com/gpu", "dcu.com/gpu"})


def translate_gpu_shortcuts(requests: Mapping[str, int]) -> dict[str, int]:
    """Koordinator's request translation (seed S1.2): whole-GPU names and the `gpu` shortcut.

    ``nvidia.com/gpu: N`` -> gpu-core 100·N + gpu-memory-ratio 100·N; ``gpu: X`` -> gpu-core X +
    gpu-memory-ratio X; everything else passes through. Validation of the result is the device
    plugin's job; this is the amount-level view quotas and fairness count in.
    """
    out: dict[str, int] = {}
    for name, amount in requests.items():
        if name in WHOLE_GPU_NAMES:
            parts = {GPU_CORE: 100 * amount, GPU_MEMORY_RATIO: 100 * amount}
        elif name == GPU:
            parts = {GPU_CORE: amount, GPU_MEMORY_RATIO: amount}
        else:
            parts = {name: amount}
        for part, value in parts.items():
            out[part] = out.get(part, 0) + value
    return out


def _quantity_type(kind: Kind) -> Any:
    """An int field holding a quantity of `kind`: parsed from text on input, shortest text on output."""

    def parse(value: object) -> int:
        try:
            return parse_quantity(value, kind)  # type: ignore[arg-type]
        except QuantityError as exc:
            raise PydanticCustomError("resource", "{message}", {"message": str(exc)}) from None

    return Annotated[
        int,
        PlainValidator(parse, json_schema_input_type=str | int),
        PlainSerializer(lambda v: format_quantity(v, kind), return_type=str),
    ]


#: Millicores, written like "500m" or "2".
CPUQuantity = _quantity_type("cpu")
#: Bytes, written like "16Gi".
ByteQuantity = _quantity_type("bytes")
#: A whole count, written like "4".
CountQuantity = _quantity_type("count")


def device_dimension(name: str) -> str:
    """A device dimension's own name: ``koordinator.sh/`` and ``kubernetes.io/`` stripped for any type.

    `canonical_name` strips them only for the fixed GPU/RDMA/FPGA names; device types defined in
    manifests alone (S1.4, e.g. ``xpu``) come back from Koordinator as ``koordinator.sh/xpu``.
    """
    for prefix in ALIAS_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name
