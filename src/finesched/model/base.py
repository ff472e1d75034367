"""The pydantic base every model shares: frozen, strict about unknown fields, camelCase on the wire.

Manifests are the user-facing contract (DESIGN.md "Manifest shapes"), so an unknown field is an
error (a typo must not silently do nothing), and field names on the wire are camelCase while
Python code uses snake_case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, NoReturn, TypeVar

import pydantic_core
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError


class Model(BaseModel):
    """Frozen, extra-forbidding, camelCase-aliased pydantic model."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
        arbitrary_types_allowed=False,
        # pydantic-core keeps the strings it parses from JSON in a process-wide cache (16,384 of
        # them): a manifest's values (names, label values) would stay there after their objects
        # are deleted, scattered through the memory a flood of them took, and keep it from the
        # system (BENCHMARKS.md, "Fairness under one tenant's flood"). Field names repeat; values rarely.
        cache_strings="keys",
    )


Loc = tuple[str | int, ...]


class FrozenDict(dict[str, str]):
    """A str -> str dict that refuses changes, for the mapping fields of frozen models.

    A frozen model alone does not stop ``node.labels["zone"] = "b"``, which would change a node
    behind the cluster state's label index. Reads are a plain dict's (same speed, JSON and YAML
    dumps see a dict); any write raises TypeError. Hashable, so models holding one hash.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("this mapping is read-only; build a new object with model_copy(update=...)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[object, ...]:
        return (FrozenDict, (dict(self),))  # pickle would otherwise refill it item by item

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        return self  # str keys and values: nothing inside can change


#: A model field holding a read-only str -> str mapping (labels, annotations, selectors, env).
FrozenStrDict = Annotated[dict[str, str], AfterValidator(FrozenDict)]

# YAML's safe dumper accepts exact dicts only; a FrozenDict dumps as the mapping it is.
yaml.SafeDumper.add_representer(FrozenDict, yaml.representer.SafeRepresenter.represent_dict)


def raise_problems(problems: Sequence[tuple[Loc, str, object]], title: str = "model") -> None:
    """Raise one pydantic ValidationError holding every ``(field path, message, value)`` problem.

    Raised inside a validator, pydantic prefixes each path with the enclosing field's path, so a
    cross-field check still reports exactly where the bad value is (``spec.devices.2.numa``).
    """
    if not problems:
        return
    details = [
        InitErrorDetails(type=PydanticCustomError("invalid", "{message}", {"message": msg}), loc=loc, input=value)
        for loc, msg, value in problems
    ]
    raise pydantic_core.ValidationError.from_exception_data(title, details)


M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def fast_construct(cls: type[M], values: dict[str, object]) -> M:
    """Build a model from trusted, complete, already-canonical values, skipping validation.

    The scheduler's hot path creates one Binding per decision from values it computed itself;
    pydantic's `model_construct` walks every field (and inspects default factories) on each call.
    `values` must hold every field; the result is identical to `model_construct(**values)` for
    models without private attributes or post-init hooks (checked once in the tests).
    """
    instance = cls.__new__(cls)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", set(values))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


def fast_copy(model: M, update: Mapping[str, object]) -> M:
    """`model.model_copy(update=update)` for a model of this package, without pydantic's generic copy.

    pre_bind plugins complete the hot path's Binding with one copy each; `model_copy` goes
    through `__copy__` (four attribute copies, a private-attribute check) and then the update.
    Valid for models whose config forbids extra fields and that have no private attributes
    (every `Model` here): the result equals what `model_copy` gives (checked in the tests).
    """
    cls = type(model)
    instance = cls.__new__(cls)
    _set(instance, "__dict__", {**model.__dict__, **update})
    _set(instance, "__pydantic_fields_set__", model.__pydantic_fields_set__ | update.keys())
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance
