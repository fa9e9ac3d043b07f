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

_prices_file: str | None = None  # set by --prices for this process; else $HARNESS_PRICES


def set_prices_file(path: str | Path | None) -> None:
    """Use the user's price file (over the packaged table) for the rest of this process."""
    global _prices_file
    if path is not None:
        path = str(Path(path).expanduser().resolve())
        load_table(path)  # fail now, with a clear message, not in the middle of a run
    _prices_file = path


def user_file(path: str | None = None) -> str | None:
    """The override in effect: an explicit path, then --prices, then $HARNESS_PRICES."""
    return path or _prices_file or os.environ.get("HARNESS_PRICES") or None


def load_table(path: str | None = None) -> dict[str, Any]:
    """The packaged table, overlaid with a user's file (explicit path, --prices, $HARNESS_PRICES)."""
    return _load(user_file(path))


@lru_cache(maxsize=8)
def _load(user: str | None) -> dict[str, Any]:
    table = tomllib.loads(resources.files("harness").joinpath("models.toml").read_text())
    if user:
        try:
            extra = tomllib.loads(Path(user).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"price file {user}: {e}. It is TOML like harness/models.toml: "
                              f"[aliases] name = \"model\" and [models.\"model\"] input/cached_input/output "
                              f"in USD per 1M tokens.") from e
        for name, entry in extra.get("models", {}).items():
            if not isinstance(entry, dict) or not all(isinstance(entry.get(k), (int, float))
                                                      for k in ("input", "output")):
                raise ConfigError(f"price file {user}: [models.\"{name}\"] needs numeric input and "
                                  f"output prices (USD per 1M tokens); cached_input is optional.")
        table.setdefault("aliases", {}).update(extra.get("aliases", {}))
        table.setdefault("backends", {}).update(extra.get("backends", {}))
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


def call_cost(model: str | None, usage: Any) -> tuple[float | None, str]:
    """(USD, source) of one researcher call: the price table wins when it has the model.

    The researcher's own figure (claude's total_cost_usd, a `cmd` JSON line) is used only
    for a model without a price. Source: "table", "researcher" or "unknown" (no price and
    no figure, or usage that was never reported).
    """
    if not getattr(usage, "known", True):
        return None, "unknown"
    if price(model) is not None:
        return cost_usd(model, usage.input_tokens, usage.cached_tokens, usage.output_tokens), "table"
    if usage.cost_usd is not None:
        return usage.cost_usd, "researcher"
    return None, "unknown"


def backends_for(model: str | None, path: str | None = None) -> list[str]:
    """The researcher backends that serve model, in order of preference ([backends]); [] = not listed."""
    if model is None:
        return []
    return list(load_table(path).get("backends", {}).get(resolve_model(model, path), []))
