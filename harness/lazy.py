"""Modules loaded on first use, so that a command starts without importing what it never runs."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable


def lazy_module(name: str) -> ModuleType:
    """The module `name`, executed when one of its attributes is first read (importlib's
    LazyLoader); the loaded module itself when something imported it already."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """A function of `module` that imports the module at its first call."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(lazy_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call
