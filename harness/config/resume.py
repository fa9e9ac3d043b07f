"""Resume: the new settings against the run's manifest (run.json): what is refused, what is
recorded, and the settings a resume keeps from the run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import SETTINGS, RunConfig
from .schema import RECORDED, REFUSED


# Settings that change what a row measures or how it is judged: a resumed run that changed one
# would mix two experiments in one ledger, so the resume is refused. Limits and pacing may change
# between sessions; the change is recorded as an event. Both by RunConfig field name, from the schema.
MEASURED = tuple(n for n, s in SETTINGS.items() if s.resume == REFUSED)
LIMITS = tuple(n for n, s in SETTINGS.items() if s.resume == RECORDED)


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return float(old) == float(new)
    return old == new


def compare_resume(old: dict[str, Any], cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(refusals, limit changes) of a resume: each names the setting, its old and new value.
    old is the manifest's "config"; keys it lacks (older manifests) are not compared."""
    new = cfg.to_json()
    refused, changed = [], []
    for keys, out in ((MEASURED, refused), (LIMITS, changed)):
        for key in keys:
            if key in old and not _same(old[key], new.get(key)):
                out.append(f"{key} {old[key]!r} -> {new.get(key)!r}")
    return refused, changed


def refusal_message(tag: str, refused: list[str]) -> str:
    names = [r.split(" ", 1)[0] for r in refused]
    flags = ", ".join(SETTINGS[n].flag.split(" ")[0] if SETTINGS[n].flag else n for n in names)
    return (f"run {tag} was measured with other settings ({'; '.join(refused)}): resuming would mix two "
            f"experiments in one ledger. Resume with the run's own values ({flags}; see runs/{tag}/run.json), "
            f"or start a new run with another --tag.")


def with_run_settings(run_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """For --resume: the measured settings not given on the command line are the run's own (from
    run.json), so a resume needs no flags repeated and never changes them by accident."""
    try:
        old = json.loads((Path(run_dir) / "run.json").read_text()).get("config", {})
    except (OSError, ValueError):
        return overrides
    out = dict(overrides)
    for key in MEASURED:
        if out.get(key) is None and key in old and key not in ("editable", "protected") and old[key] is not None:
            out[key] = old[key]
    return out
