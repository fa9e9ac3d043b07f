"""The settings read and checked: the repo's file ([tool.harness] in pyproject.toml, or harness.toml)
and the flags, each value against its declaration, resolved into a RunConfig (flags > file >
defaults). A refusal names the file and key or the flag, the value and what is allowed."""
from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from . import schema
from ..errors import ConfigError
from . import AGENT_SETTINGS, ALIASES, ALL_SETTINGS, FILE_KEYS, INTERNAL, RUN_LIMITS, SETTINGS, TAG_RE, RunConfig
from .schema import CLI, Bad, Setting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def flag_of(key: str) -> str:
    """What names a setting in a message about a value given on the command line (or by a caller): its
    `harness run` flag, or, for a settings file's key alone, the key."""
    s = ALL_SETTINGS.get(key)
    return s.flag.split(" ")[0] if s is not None and s.flag else f"config key {key!r}"


def _check(s: Setting, value: Any, source: str) -> Any:
    try:
        return s.check(value)
    except Bad as e:
        raise ConfigError(schema.message(s, value, str(e), source)) from None


def _unknown(key: str) -> ConfigError:
    known = sorted(FILE_KEYS)
    near = difflib.get_close_matches(key, known, n=1)
    return ConfigError(f"unknown config key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                       + f"; known keys: {', '.join(known)}")


def _check_value(key: str, value: Any) -> Any:
    """Validate one settings-file key; return it normalised or raise ConfigError saying how to fix it."""
    s = FILE_KEYS.get(ALIASES.get(key, key))
    if s is None:
        if key in SETTINGS:
            raise ConfigError(f"config key {key!r} is given on the command line only ({SETTINGS[key].flag})")
        raise _unknown(key)
    return _check(s, value, f"config key {key!r}")


# The researcher's options: (minimum, whether the minimum itself is allowed).
AGENT_LIMITS: dict[str, tuple[float, bool]] = {
    "request_timeout": (0, False), "max_retries": (0, True), "repair_turns": (0, True),
    "temperature": (0, True),
}


def check_limits(overrides: dict[str, Any]) -> None:
    """Refuse a negative or zero limit with a message that names the flag and what to pass."""
    for key in RUN_LIMITS:
        if overrides.get(key) is not None:
            _check(SETTINGS[key], overrides[key], flag_of(key))
    for key, value in (overrides.get("agent_options") or {}).items():
        if key not in AGENT_LIMITS or value is None:
            continue
        low, inclusive = AGENT_LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
                value == low and not inclusive):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} must be {'>=' if inclusive else '>'} {low:g}; got {value!r}.")


def read_repo_settings(repo: Path) -> tuple[dict[str, Any], Path | None]:
    """The [tool.harness] table of repo/pyproject.toml, or the whole of repo/harness.toml."""
    harness_toml = repo / "harness.toml"
    pyproject = repo / "pyproject.toml"
    for path, table in ((harness_toml, None), (pyproject, ("tool", "harness"))):
        if not path.exists():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}. Fix the file and try again.") from e
        if table:
            for part in table:
                data = data.get(part, {}) if isinstance(data, dict) else {}
            if not data:
                continue
        if "tool" in data and table is None and isinstance(data.get("tool"), dict):
            data = data["tool"].get("harness", data)
        return dict(data), path
    return {}, None


def _with_file_agent(file_agent: dict[str, Any], agent: str, cli: dict[str, Any] | None) -> dict[str, Any]:
    """The file's researcher settings that apply to this backend, under the CLI's own."""
    from ..agents import BACKEND_OPTIONS, backend_kind
    applies = BACKEND_OPTIONS.get(backend_kind(agent), set())
    return {**{k: v for k, v in file_agent.items() if k in applies}, **(cli or {})}


def resolve(repo: Path, tag: str, overrides: dict[str, Any]) -> RunConfig:
    """Merge defaults, the repo's settings file and CLI overrides (None = not given)."""
    repo = Path(repo).resolve()
    if not TAG_RE.match(tag):
        raise ConfigError(f"tag {tag!r} must be letters, digits, '.', '_' or '-' (at most 63)")
    check_limits(overrides)
    file_settings, path = read_repo_settings(repo)
    merged = {name: s.default for name, s in SETTINGS.items() if s.where == schema.FILE}
    file_agent: dict[str, Any] = {}
    for key, value in file_settings.items():
        name = ALIASES.get(key, key)  # settings files written before a key got its unit in its name
        if name != key and name in file_settings:
            raise ConfigError(f"{path}: config key {key!r} is the old name of {name!r}; keep only {name!r}")
        try:
            checked = _check_value(key, value)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e
        if name in AGENT_SETTINGS:
            file_agent[AGENT_SETTINGS[name].option] = checked
        else:
            merged[name] = checked
    extra: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        s = SETTINGS.get(key)
        if s is None:
            if key not in INTERNAL:
                raise _unknown(key)
            extra[key] = value
            continue
        # given on the command line (or by a caller): the flag is what to fix
        (extra if s.where == CLI else merged)[key] = _check(s, value, flag_of(key))
    if merged["track"] and ":" in merged["track"]:  # --track mlflow:URI
        merged["track"], merged["track_uri"] = merged["track"].split(":", 1)
        if not merged["track_uri"].strip():
            raise ConfigError("--track mlflow: needs a URI after the colon (e.g. mlflow:http://127.0.0.1:5000), "
                              "or plain --track mlflow for sqlite:///runs/mlflow.db")
    if merged["track"] == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise ConfigError("--track mlflow needs the mlflow package: pip install 'autoresearch-harness[track]' "
                          "(or run without --track; `harness track RUN_DIR` can log the run later)")
    if file_agent:
        extra["agent_options"] = _with_file_agent(file_agent, merged["agent"], extra.get("agent_options"))
    if merged["executor"] == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("--executor ray needs the ray package: pip install 'autoresearch-harness[ray]' "
                          "(or run with --executor local)")
    if merged["kill_after"] is None:
        merged["kill_after"] = 2 * merged["time_budget"] + 120
    gpus = extra.get("gpus", ())
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpus {','.join(gpus)} lists a GPU twice; one job per GPU, e.g. --gpus 0,1,2,3")
    overlap = set(merged["editable"]) & set(merged["protected"])
    if overlap:
        raise ConfigError(f"files cannot be both editable and protected: {sorted(overlap)}")
    return RunConfig(repo=repo, tag=tag, config_file=str(path) if path else None, **merged, **extra)
