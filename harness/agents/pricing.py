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

from ..errors import ConfigError

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
                              f"[aliases] name = \"model\" and [models.\"model\"] input/cached_input/"
                              f"cache_write/cache_write_1h/output in USD per 1M tokens.") from e
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
             path: str | None = None, cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0) -> float | None:
    """USD for one call, as the provider bills it. input_tokens includes the cached reads and the
    cache writes; cache_write_1h_tokens is the 1-hour part of cache_write_tokens; output includes
    reasoning. None when the model has no price."""
    p = price(model, path)
    if p is None:
        return None
    write_5m = p.get("cache_write", p["input"])
    write_1h = p.get("cache_write_1h", write_5m)
    writes = min(max(0, cache_write_tokens), max(0, input_tokens - cached_tokens))
    long_writes = min(max(0, cache_write_1h_tokens), writes)
    plain = max(0, input_tokens - cached_tokens - writes)
    return (plain * p["input"] + cached_tokens * p.get("cached_input", p["input"])
            + (writes - long_writes) * write_5m + long_writes * write_1h + output_tokens * p["output"]) / 1e6


def call_cost(model: str | None, usage: Any) -> tuple[float | None, str]:
    """(USD, source) of one researcher call, in the one order docs/researchers.md and models.toml give:

    1. the price table (a --prices file included), when it has the model;
    2. else the researcher's own figure (claude's total_cost_usd, a `cmd` JSON line);
    3. else unknown (no price and no figure, or usage that was never reported): None.
    Source: "table", "researcher" or "unknown".
    """
    if not getattr(usage, "known", True):
        return None, "unknown"
    if price(model) is not None:
        return cost_usd(model, usage.input_tokens, usage.cached_tokens, usage.output_tokens,
                        cache_write_tokens=getattr(usage, "cache_write_tokens", 0),
                        cache_write_1h_tokens=getattr(usage, "cache_write_1h_tokens", 0)), "table"
    if usage.cost_usd is not None:
        return usage.cost_usd, "researcher"
    return None, "unknown"


COST_TOLERANCE = 0.01  # relative: a CLI's own figure this close to the table's is the same bill


def cost_difference(model: str | None, usage: Any) -> tuple[float, float] | None:
    """(the table's USD, the researcher's own USD) of a call priced from the table whose researcher
    reported a different cost of its own; None when they agree or one of them is missing."""
    table, source = call_cost(model, usage)
    own = getattr(usage, "cost_usd", None)
    if source != "table" or table is None or own is None:
        return None
    if abs(table - own) <= COST_TOLERANCE * max(abs(table), abs(own), 1e-9):
        return None
    return table, own


def backends_for(model: str | None, path: str | None = None) -> list[str]:
    """The researcher backends that serve model, in order of preference ([backends]); [] = not listed."""
    if model is None:
        return []
    return list(load_table(path).get("backends", {}).get(resolve_model(model, path), []))
