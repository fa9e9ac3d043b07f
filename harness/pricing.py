"""Model aliases and prices as data; cost is derived from raw tokens.

An unknown model has no price: cost stays None (shown as unknown), never a silent zero.
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError


@lru_cache(maxsize=8)
def load_table(path: str | None = None) -> dict[str, Any]:
    """The packaged table, overlaid with a user's file (explicit path, then $HARNESS_PRICES)."""
    table = tomllib.loads(resources.files("harness").joinpath("models.toml").read_text())
    user = path or os.environ.get("HARNESS_PRICES")
    if user:
        try:
            extra = tomllib.loads(Path(user).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"price file {user}: {e}") from e
        table.setdefault("aliases", {}).update(extra.get("aliases", {}))
        table.setdefault("models", {}).update(extra.get("models", {}))
    return table


def resolve_model(name: str | None, path: str | None = None) -> str | None:
    if name is None:
        return None
    return load_table(path).get("aliases", {}).get(name, name)


def price(model: str | None, path: str | None = None) -> dict[str, float] | None:
    if model is None:
        return None
    models = load_table(path).get("models", {})
    return models.get(resolve_model(model, path))


def cost_usd(model: str | None, input_tokens: int, cached_tokens: int, output_tokens: int,
             path: str | None = None) -> float | None:
    """USD for one call; input_tokens includes the cached ones. None when the model has no price."""
    p = price(model, path)
    if p is None:
        return None
    uncached = max(0, input_tokens - cached_tokens)
    return (uncached * p["input"] + cached_tokens * p.get("cached_input", p["input"])
            + output_tokens * p["output"]) / 1e6
