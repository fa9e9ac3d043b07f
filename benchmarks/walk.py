"""A candidate's walk: which harness modules one candidate's calls pass, from the loop's request
for its proposal to its row on the ledger.

A real night (`driver.run`, default settings but a sequential loop, one baseline run and three
iterations) on a trainer that prints its metric at once, with a researcher that rewrites one
number (overhead.py's: the third candidate wins). Every call into a harness function, in every
thread, is recorded (`sys.setprofile`, `threading.setprofile`); the window is the third
candidate's, a keep (the branch moves), from `lanes.propose` to `RunDriver.append`. Printed:

- modules: the files entered (`driver/lanes`, `gitgate`, ...), and the calls into each;
- packages: the same with a family folder counted once (`driver`, `executors`, ...; a top-level
  module is its own): the architecture's parts a candidate passes;
- moves: calls from one file into another (all, and distinct caller/callee pairs);
- driver entries: calls into `harness/driver/` from a module outside it (0: the driver is entered
  once, at the top, and nothing calls back into it).

    python benchmarks/walk.py
    python benchmarks/walk.py --moves      # and every distinct move
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from overhead import TRAIN, InstantResearcher, make_repo  # noqa: E402  (puts the repo root on sys.path)

import harness  # noqa: E402
from harness.config.load import resolve  # noqa: E402
from harness.driver import loop as driver  # noqa: E402

PACKAGE_ROOT = os.path.dirname(harness.__file__) + os.sep


@dataclass
class Walk:
    modules: dict[str, int]  # file (package-relative, no .py) -> calls into it
    moves: collections.Counter  # (caller file, callee file, function) -> count
    driver_entries: int

    @property
    def packages(self) -> list[str]:
        return sorted({m.split("/", 1)[0] for m in self.modules})

    @property
    def move_count(self) -> int:
        return sum(self.moves.values())


def module_of(code) -> str | None:
    f = code.co_filename
    if not f.startswith(PACKAGE_ROOT):
        return None
    return f[len(PACKAGE_ROOT):].removesuffix(".py").removesuffix("/__init__").replace(os.sep, "/")


def walk(folder: Path) -> Walk:
    """Run the night in folder and return the third candidate's walk."""
    repo = make_repo(folder / "repo", TRAIN)
    cfg = resolve(repo, "walk", {"iterations": 3, "baseline_runs": 1, "pipeline": False})
    events: list[tuple[float, str, str, str | None]] = []  # time, callee file, function, caller file
    lock = threading.Lock()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = module_of(frame.f_code)
        if callee is None:
            return
        caller = frame.f_back
        while caller is not None and module_of(caller.f_code) is None:
            caller = caller.f_back
        with lock:
            events.append((time.monotonic(), callee, frame.f_code.co_name,
                           module_of(caller.f_code) if caller is not None else None))

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        driver.run(cfg, researcher=InstantResearcher())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    starts = [e[0] for e in events if e[1:3] == ("driver/lanes", "propose")]
    if len(starts) < 3:
        raise SystemExit(f"the night proposed {len(starts)} candidates, not 3: {cfg.run_dir}")
    t0 = starts[2]
    t1 = min(e[0] for e in events if e[0] > t0 and e[1:3] == ("driver/rundriver", "append"))
    window = [e for e in events if t0 <= e[0] <= t1]
    moves = collections.Counter((caller, callee, fn) for _, callee, fn, caller in window
                                if caller is not None and caller != callee)
    entries = sum(n for (caller, callee, _), n in moves.items()
                  if callee.startswith("driver/") and not caller.startswith("driver/"))
    return Walk(dict(collections.Counter(e[1] for e in window)), moves, entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moves", action="store_true", help="print every distinct move")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        w = walk(Path(tmp))
    print(f"modules (files) entered: {len(w.modules)}")
    for m, n in sorted(w.modules.items()):
        print(f"  {n:5d} calls  {m}")
    print(f"packages passed: {len(w.packages)}  ({', '.join(w.packages)})")
    print(f"moves between files: {w.move_count}, distinct pairs: {len({(a, b) for a, b, _ in w.moves})}")
    print(f"calls into driver/ from outside it: {w.driver_entries}")
    if args.moves:
        for (a, b, fn), n in sorted(w.moves.items()):
            print(f"  {n:3d}  {a} -> {b}.{fn}")


if __name__ == "__main__":
    main()
