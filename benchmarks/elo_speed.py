"""How long `harness elo` takes on ten small ledgers, end to end: a fresh process each time, the
CLI's start-up and imports included.

The ledgers are real: a two-arm tournament (`harness ab --arm ... --repeats 5`) of instant
researchers (each rewrites one number and reports tokens and dollars) and a no-op trainer, in a
throwaway git repo; ten run folders with their worktrees, logs and run.json. Then
`harness elo runs/<tag>` runs --runs times each as markdown, as --json and with --out (the two
plots), in a new Python process each (`python -m harness elo`), and the median wall time and
the CPU time (user + system of the child) are printed, with the import times of what it loads.

    python benchmarks/elo_speed.py                       # build the ledgers, time 5 runs of each
    python benchmarks/elo_speed.py --keep /tmp/ledgers   # keep them (reuse with --ledgers)
    python benchmarks/elo_speed.py --ledgers /tmp/ledgers/repo/runs/speed --tree /path/to/other/checkout
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, make_repo

TRAIN = "VALUE = 1.0\nprint('---')\nprint(f'val_bpb: {VALUE:.6f}')\nprint('peak_vram_mb: 0')\n"
AGENT = r'''
import json, re, sys
from pathlib import Path
train = Path(sys.argv[1]) / "train.py"
source = train.read_text()
value = float(re.search(r"^VALUE = (\S+)", source, re.M).group(1)) * float(sys.argv[2])
train.write_text(re.sub(r"^VALUE = \S+", f"VALUE = {value!r}", source, count=1, flags=re.M))
print(json.dumps({"description": f"VALUE {value:.4f}", "input_tokens": 1200, "output_tokens": 300,
                  "cost_usd": float(sys.argv[3])}))
'''
ARMS = {"cheap": (0.99, 0.0004), "dear": (0.97, 0.03)}  # name: (factor on VALUE, dollars a call)
REPEATS = 5
ITERATIONS = 4


def build(root: Path) -> Path:
    """Ten ledgers (2 arms x 5 repeats) under root/repo/runs/speed, made by the harness itself."""
    repo = make_repo(root / "repo", TRAIN, settings="time_budget = 5\nkill_after = 60\nsandbox = \"off\"\n"
                                                    "agent_sandbox = \"off\"\n")
    agent = root / "agent.py"
    agent.write_text(AGENT)
    arms = [f"--arm={name}=cmd:{sys.executable} {agent} {{workdir}} {f} {usd}" for name, (f, usd) in ARMS.items()]
    argv = [sys.executable, "-m", "harness", "ab", "--repo", str(repo), "--tag", "speed", *arms,
            "--repeats", str(REPEATS), "--iterations", str(ITERATIONS), "--baseline-runs", "1", "--gate", "strict"]
    subprocess.run(argv, check=True, env=_env(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return repo / "runs" / "speed"


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def timed(argv: list[str], tree: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imports(argv: list[str], tree: Path, top: int) -> list[tuple[int, str]]:
    """The packages the command imports, by cumulative import time (microseconds) of each
    package's outermost imports: a package's figure includes what it imports (the harness's
    includes pandas's where the harness imported pandas first)."""
    run = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=_env(tree), capture_output=True, text=True)
    totals: dict[str, int] = {}
    stack: list[tuple[int, str]] = []  # (depth, package) of the imports above the line
    for line in reversed(run.stderr.splitlines()):  # a parent is printed after its children
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        if not cumulative.strip().isdigit():
            continue
        depth = (len(name) - len(name.lstrip())) // 2
        package = name.strip().split(".")[0]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if all(p != package for _, p in stack):  # the outermost import of its package
            totals[package] = totals.get(package, 0) + int(cumulative)
        stack.append((depth, package))
    return sorted(((us, p) for p, us in totals.items()), reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each form (the median is shown)")
    parser.add_argument("--ledgers", type=Path, default=None, help="time these ledgers instead of building new ones")
    parser.add_argument("--keep", type=Path, default=None, help="build the ledgers here and keep them")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose harness is timed (PYTHONPATH)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.ledgers is not None:
            ledgers = args.ledgers
        else:
            root = args.keep or Path(tmp)
            t0 = time.monotonic()
            ledgers = build(root)
            print(f"built {len(list(ledgers.rglob('results.tsv')))} ledgers with harness ab in "
                  f"{time.monotonic() - t0:.0f} s: {ledgers}")
        n = sum(1 for p in ledgers.rglob("results.tsv") if "worktree" not in p.parts)
        base = [sys.executable, "-m", "harness", "elo", str(ledgers)]
        forms = {"markdown": base, "--json": [*base, "--json"], "--out (plots)": [*base, "--out", str(Path(tmp) / "o")],
                 "start-up (harness --help)": [sys.executable, "-m", "harness", "--help"]}
        print(f"`harness elo` on {n} ledgers, {args.runs} runs each, tree {args.tree}; median wall and CPU:")
        for name, argv in forms.items():
            times = [timed(argv, args.tree) for _ in range(args.runs)]
            wall = statistics.median(t[0] for t in times)
            cpu = statistics.median(t[1] for t in times)
            print(f"  {name:<28} wall {wall:5.2f} s   CPU {cpu:5.2f} s")
        top = imports(forms["--out (plots)"], args.tree, 8)
        print("imports of `harness elo --out`, cumulative: " + ", ".join(f"{name} {us / 1e6:.2f} s" for us, name in top))


if __name__ == "__main__":
    main()
