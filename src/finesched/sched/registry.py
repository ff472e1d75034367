"""Plugin registry: name -> factory, built explicitly (no plugin registers itself at import time).

A factory takes the plugin's `args` from the profile and returns a plugin; it must be pure (no
threads, no I/O), so the simulator and tests can build plugins freely. The driver attaches
plugins to a ClusterState afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from finesched.errors import ValidationError
from finesched.sched.framework import Plugin

Factory = Callable[[Mapping[str, Any]], Plugin]


def no_args(cls: type) -> Factory:
    """A factory for a plugin that takes no arguments (any given is an error)."""

    def build(args: Mapping[str, Any]) -> Plugin:
        if args:
            raise ValidationError(f"{cls.NAME} takes no args", path="args", value=dict(args))
        return cls()

    return build


class Registry:
    def __init__(self, factories: Mapping[str, Factory]):
        self._factories = dict(factories)

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, args: Mapping[str, Any]) -> Plugin:
        factory = self._factories.get(name)
        if factory is None:
            raise ValidationError(f"unknown plugin; valid plugins: {', '.join(self.names())}", path="name", value=name)
        return factory(args)

    def with_plugins(self, factories: Mapping[str, Factory]) -> Registry:
        """A registry with extra (or replaced) factories, e.g. a simulator's own policies."""
        return Registry({**self._factories, **factories})


#: The built-in plugin set, installed by the package (finesched/__init__.py, from plugins/builtin.py):
#: the plugins sit a layer above this one, so this module names none of them.
_builtin: Callable[[], Registry] | None = None


def install_builtin(factory: Callable[[], Registry]) -> None:
    """Set what `default_registry` returns (finesched/__init__.py calls it once, with
    `plugins.builtin.builtin_registry`, before any other module of the package is imported)."""
    global _builtin
    _builtin = factory


def default_registry() -> Registry:
    """Every built-in plugin (plugins/builtin.py)."""
    if _builtin is None:
        raise RuntimeError("no built-in plugins installed: import finesched (its __init__ installs them)")
    return _builtin()
