"""The offline researcher: seeded random search over the UPPERCASE numeric globals.

Needs no LLM and no network. It is the demo's default and the control arm that shows
whether an LLM researcher beats random search.
"""
from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from ..gitgate import content_hash
from .base import Proposal, Task, Usage

# A module-level line `NAME = 3e-3  # comment`: the only thing this researcher edits.
KNOB_RE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<eq>\s*=\s*)(?P<value>[-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?P<rest>\s*(?:#.*)?)$")
LOG_SIGMA = 0.5  # std of the log-scale step for floats (factor ~1.6 at one sigma)
TWO_KNOB_P = 0.3  # probability of changing two globals at once
MAX_DRAWS = 200  # attempts to find a candidate not tried before
FRACTION_HINTS = ("FRAC", "RATIO", "DROPOUT", "BETA", "MOMENTUM", "DECAY_RATE")
# Globals that change logging or safety limits, not the result: mutating them wastes a run.
SKIP_HINTS = ("LOG", "EVERY", "SEED", "FAIL", "PRINT", "VERBOSE")


@dataclass(frozen=True)
class Knob:
    path: str
    line: int  # 0-based
    name: str
    value: float
    is_int: bool


def find_knobs(path: str, source: str) -> list[Knob]:
    """Every `NAME = number` line at module level (no indentation) of one file."""
    knobs = []
    for i, line in enumerate(source.splitlines()):
        m = KNOB_RE.match(line)
        if not m:
            continue
        raw = m["value"].replace("_", "")
        is_int = re.fullmatch(r"[-+]?\d+", raw) is not None
        if any(h in m["name"] for h in SKIP_HINTS):
            continue
        knobs.append(Knob(path, i, m["name"], float(raw), is_int))
    return knobs


def perturb(knob: Knob, rng: random.Random) -> float:
    """A new value near the old one: log-scale for floats, small steps for ints."""
    v = knob.value
    if knob.is_int:
        iv = int(v)
        if iv >= 8 and iv & (iv - 1) == 0:  # a power of two (a width, a batch): halve or double
            return float(iv * 2 if rng.random() < 0.5 else iv // 2)
        step = max(1, round(abs(iv) * 0.25))
        new = iv + (step if rng.random() < 0.5 else -step)
        return float(max(new, 1 if iv >= 1 else 0))
    if v == 0.0:
        return round_sig(0.01 * math.exp(rng.gauss(0.0, 1.0)))
    new = v * math.exp(rng.gauss(0.0, LOG_SIGMA))
    if 0.0 < v < 1.0 and any(h in knob.name for h in FRACTION_HINTS):
        new = min(new, 0.99)
    return round_sig(new)


def round_sig(x: float, digits: int = 2) -> float:
    return float(f"{x:.{digits}g}")


def fmt(value: float, is_int: bool) -> str:
    if is_int:
        return str(int(value))
    text = repr(value)
    return text if len(text) <= 8 else f"{value:.2e}".replace("e-0", "e-").replace("e+0", "e")


def apply_change(source: str, knob: Knob, new_text: str) -> str:
    lines = source.splitlines(keepends=True)
    line = lines[knob.line]
    ending = "\n" if line.endswith("\n") else ""
    m = KNOB_RE.match(line.rstrip("\n"))
    lines[knob.line] = f"{m['name']}{m['eq']}{new_text}{m['rest']}{ending}"
    return "".join(lines)


class MutateResearcher:
    name = "mutate"

    def __init__(self, model: str | None = None, seed: int | None = None):
        self.model = model
        self.seed = seed

    def describe(self) -> dict[str, Any]:
        return {"backend": "mutate", "seed": self.seed, "cost_source": "free"}

    def propose(self, task: Task) -> Proposal:
        start = time.monotonic()
        originals = {p: (task.worktree / p).read_text() for p in task.editable
                     if p.endswith(".py") and (task.worktree / p).exists()}
        knobs = [k for p, src in originals.items() for k in find_knobs(p, src)]
        if not knobs:
            return Proposal("", error="no UPPERCASE numeric globals (NAME = number) in "
                            f"{', '.join(task.editable)}: nothing to mutate",
                            agent_s=time.monotonic() - start)
        seed = task.seed if self.seed is None else self.seed
        for draw in range(MAX_DRAWS):
            rng = random.Random(f"{seed}:{task.iteration}:{draw}")
            chosen = rng.sample(knobs, 2 if len(knobs) > 1 and rng.random() < TWO_KNOB_P else 1)
            sources = dict(originals)
            notes = []
            for knob in sorted(chosen, key=lambda k: (k.path, k.line)):
                new = perturb(knob, rng)
                if new == knob.value:
                    continue
                sources[knob.path] = apply_change(sources[knob.path], knob, fmt(new, knob.is_int))
                notes.append(f"{knob.name} {fmt(knob.value, knob.is_int)} -> {fmt(new, knob.is_int)}")
            if not notes:
                continue
            for p, src in sources.items():
                (task.worktree / p).write_text(src)
            if content_hash(task.worktree, task.editable) not in task.tried:
                task.log_path.parent.mkdir(parents=True, exist_ok=True)
                task.log_path.write_text(f"mutate draw {draw}: " + "; ".join(notes) + "\n")
                return Proposal("; ".join(notes), Usage(cost_usd=0.0), time.monotonic() - start)
            for p, src in originals.items():
                (task.worktree / p).write_text(src)
        return Proposal("", error=f"no untried mutation found in {MAX_DRAWS} draws",
                        agent_s=time.monotonic() - start)
