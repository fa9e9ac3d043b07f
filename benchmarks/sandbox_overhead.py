"""What the sandbox and the separate evaluation add per experiment, against --sandbox off.

The bundled workload (`harness init --example`), step-bounded on this machine, trained with the
same seed alternately by two configurations in one run:

- protected: bwrap + the training split exported for the job + torch.export of the model +
  `prepare.py --evaluate` in a second sandbox (the defaults of the bundled workload);
- sandbox only: bwrap, but the old in-process evaluation (no evaluate_command);
- off: `--sandbox off` and the old in-process evaluation.

Prints the mean wall seconds per experiment of each, their ratio, and both val_bpb figures
(equal: the separate evaluation scores exactly what the in-process one does).

    python benchmarks/sandbox_overhead.py [--steps 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo root on sys.path)

from harness.config.load import resolve  # noqa: E402
from harness.executors import sandbox  # noqa: E402
from harness.gitgate import GitGate  # noqa: E402
from harness.commands.initrepo import init_example  # noqa: E402
from harness.executors.evaluation import train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per experiment")
    parser.add_argument("--repeats", type=int, default=3, help="experiments per configuration")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mode = sandbox.resolve("auto")
    if not mode.on:
        print(f"warning: {mode.warning}")
    with tempfile.TemporaryDirectory() as tmp:
        repo = init_example(Path(tmp) / "example")
        protected = resolve(repo, "protected", {"max_steps": args.steps, "kill_after": 900})
        sandboxed = dataclasses.replace(protected, tag="sandboxed", evaluate_command=None, train_data_command=None)
        off = dataclasses.replace(sandboxed, tag="off", sandbox="off")
        configs = {"protected": protected, "sandbox only": sandboxed, "off": off}
        gate = GitGate(repo)
        base = gate.require_commit("HEAD")
        for cfg in configs.values():
            cfg.logs_dir.mkdir(parents=True)
            gate.detached_worktree(cfg.worktree, base)
        times: dict[str, list[float]] = {name: [] for name in configs}
        values: dict[str, set[float]] = {name: set() for name in configs}
        for k in range(args.repeats):
            for name, cfg in configs.items():
                t0 = time.monotonic()
                result = train(cfg, cfg.worktree, cfg.logs_dir / f"bench-{k}.log", cfg.seed)
                times[name].append(time.monotonic() - t0)
                if result.status != "ok":
                    raise SystemExit(f"{name} run {k} failed: {result.status} {result.reason}")
                values[name].add(result.metrics[cfg.metric])
    mean = {name: statistics.mean(ts) for name, ts in times.items()}
    print(f"sandbox: {mode.mode}; {args.steps} steps, {args.repeats} experiments each, alternating")
    for name in configs:
        print(f"  {name:12} {mean[name]:6.2f} s per experiment  (val_bpb {sorted(values[name])})")
    print(f"protected / off: {mean['protected'] / mean['off']:.2f}x "
          f"(+{mean['protected'] - mean['off']:.2f} s per experiment; the sandbox alone "
          f"+{mean['sandbox only'] - mean['off']:.2f} s)")


if __name__ == "__main__":
    main()
