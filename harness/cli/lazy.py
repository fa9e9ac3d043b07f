"""Modules loaded on first use, so that a command starts without importing what it never runs."""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any, Callable


class LazyModule:
    """Stands for module `name` and imports it (importlib.import_module) when an attribute is first
    read. Not importlib's LazyLoader: that one puts a half-run module in sys.modules when two threads
    touch it at once (Python 3.11) or when a Ctrl-C lands during its import, and every later reader
    then misses names. import_module holds the import system's own per-module lock, and an import
    that fails or is interrupted leaves nothing behind, so the next read imports it again."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(object.__getattribute__(self, "_name")), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(importlib.import_module(object.__getattribute__(self, "_name")), attr, value)

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_name')!r}>"


def lazy_module(name: str) -> ModuleType:
    """The module `name`, imported when one of its attributes is first read."""
    if importlib.util.find_spec(name) is None:
        raise ImportError(f"no module named {name!r}")
    return LazyModule(name)  # type: ignore[return-value]


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """A function of `module` that imports the module at its first call."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call
