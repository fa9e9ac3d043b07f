"""What the researcher's sandbox adds per call, against --agent-sandbox off, side by side in one run.

A `cmd:` researcher (a Python script that edits train.py and prints a usage line: the shape of a
real CLI call without its network time) is called alternately with the run's jail on and off, on
the same worktree; prints the median seconds per call of each and their ratio. A real CLI's call
takes seconds to minutes, so the difference, not the ratio, is what to compare with it.

    python benchmarks/agent_sandbox_overhead.py [--calls 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness.agents import Task, make_researcher, sandboxed  # noqa: E402
from harness.config.load import resolve  # noqa: E402
from harness.executors import sandbox  # noqa: E402

AGENT = """import json, re, sys
src = open("train.py").read()
open("train.py", "w").write(re.sub(r"^X = .*$", "X = %d" % (len(src) % 7), src, count=1, flags=re.M))
print(json.dumps({"input_tokens": 1000, "output_tokens": 100, "description": "change X"}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10, help="calls per configuration")
    args = parser.parse_args()
    if not sandbox.probe(sandbox.bwrap_path()).works:
        sys.exit("bubblewrap does not work here: nothing to compare")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = make_repo(root / "repo", "X = 0\nprint('---')\nprint('val_bpb: 1.0')\n")
        (root / "agent.py").write_text(AGENT)
        cfg = resolve(repo, "bench", {"agent_sandbox": "bwrap"})
        cfg.run_dir.mkdir(parents=True)
        researcher = make_researcher(f"cmd:{sys.executable} {root / 'agent.py'}", None)
        jails = {"sandboxed": sandboxed.for_run(cfg), "off": None}
        times: dict[str, list[float]] = {name: [] for name in jails}
        for i in range(args.calls):
            for name, jail in jails.items():  # alternate: the machine's load hits both alike
                task = Task(repo, "improve it", ("train.py",), 60, cfg.run_dir / "logs" / f"{name}-{i}.log", i, 0,
                            jail=jail)
                start = time.monotonic()
                proposal = researcher.propose(task)
                times[name].append(time.monotonic() - start)
                if proposal.error:
                    sys.exit(f"{name}: {proposal.error}")
    on, off = statistics.median(times["sandboxed"]), statistics.median(times["off"])
    print(f"researcher call, median of {args.calls}: sandboxed {on:.3f}s, --agent-sandbox off {off:.3f}s, "
          f"+{on - off:.3f}s per call (x{on / off:.2f})")


if __name__ == "__main__":
    main()
