"""The keep rule under noise: `strict` vs `noise` on the same 300 proposals with known true effects.

A fake trainer reports the code's hidden true quality (VALUE) plus Gaussian noise, as a
fixed wall-clock budget does on a GPU. The proposals' true effects are mostly zero or small
and harmful, a few are real improvements. Each gate runs the full loop (real git, real
subprocesses) on the same proposals; printed side by side: false keeps, missed real
improvements, the true quality of the final best, and true improvement per GPU-hour of
training (every training run counted as one budget of GPU time, confirmations included).

    python benchmarks/gate_simulation.py [--proposals 300] [--noise 0.005] [--seeds 3]
    python benchmarks/gate_simulation.py --sweep   # several kinds of world, a line each
"""
from __future__ import annotations

import argparse
import os
import random
import re
import tempfile
import time
from pathlib import Path

from common import ROOT, make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.agents import Proposal  # noqa: E402
from harness.config.load import resolve  # noqa: E402

BUDGET_S = 300  # simulated GPU seconds per training run
BASE_QUALITY = 1.0


def effects(n: int, seed: int, zero_p: float = 0.55, real_p: float = 0.05, harm_sd: float = 3.0,
            lo: float = 2.0, hi: float = 8.0) -> list[float]:
    """True effects on the metric (negative = better), in units of the noise sd: zero_p of
    them zero, real_p real improvements of lo to hi sd, the rest small harm of 0 to harm_sd."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        if u < zero_p:
            out.append(0.0)
        elif u < 1 - real_p:
            out.append(rng.uniform(0.0, harm_sd))
        else:
            out.append(-rng.uniform(lo, hi))
    return out


class KnownEffectResearcher:
    """Applies proposal i's true effect to the current code's VALUE (the hidden true quality)."""
    name = "simulated"
    model = None

    def __init__(self, effects: list[float]):
        self.effects = effects

    def describe(self):
        return {"backend": "simulated"}

    def propose(self, task):
        i = task.iteration - 1
        train = task.worktree / "train.py"
        text = train.read_text()
        value = float(re.search(r"^VALUE = (\S+)", text, re.M).group(1))
        text = re.sub(r"^VALUE = \S+", f"VALUE = {value + self.effects[i]!r}", text, count=1, flags=re.M)
        train.write_text(text + f"# proposal {i}\n")  # unique code even for a zero effect
        return Proposal(f"proposal {i} (true effect {self.effects[i]:+.4f})")


def simulate(gate: str, proposals: list[float], noise: float, tmp: Path, noise_options: dict | None = None) -> dict:
    repo = make_repo(tmp / gate, (ROOT / "tests" / "fake_train.py").read_text())
    os.environ["FAKE_NOISE"] = str(noise)
    os.environ["FAKE_COUNTER"] = str(tmp / f"{gate}.counter")
    cfg = resolve(repo, gate, {"gate": gate, "iterations": len(proposals),
                               "baseline_runs": 1 if gate == "strict" else None,
                               **((noise_options or {}) if gate == "noise" else {})})
    t0 = time.monotonic()
    driver.run(cfg, researcher=KnownEffectResearcher(proposals))
    rows = ledger.read_rows(cfg.ledger_path)
    primary = {r["iteration"]: r for r in rows if r["status"] != "repeat"}
    kept = [i for i, r in primary.items() if i > 0 and r["status"] == "keep"]
    true_final = BASE_QUALITY + sum(proposals[i - 1] for i in kept)
    runs = sum(1 for r in rows if r.get("train_s") is not None)
    gpu_h = runs * BUDGET_S / 3600
    return {
        "gate": gate, "keeps": len(kept),
        "false_keeps": sum(1 for i in kept if proposals[i - 1] >= 0),
        "harm_kept": sum(proposals[i - 1] for i in kept if proposals[i - 1] > 0),
        "missed_real": sum(1 for i, e in enumerate(proposals, 1) if e < 0 and i not in kept),
        "real": sum(1 for e in proposals if e < 0),
        "true_final": true_final, "runs": runs, "gpu_h": gpu_h,
        "gain_per_gpu_h": (BASE_QUALITY - true_final) / gpu_h, "wall_s": time.monotonic() - t0,
    }


def compare(args, zero: float, real: float, lo: float, hi: float, harm_sd: float, verbose: bool) -> dict:
    """Both gates over args.seeds worlds of one kind: the mean of each figure per gate."""
    noise_options = {"confirm": args.confirm, "baseline_runs": args.baseline_runs}
    totals: dict[str, dict[str, float]] = {"strict": {}, "noise": {}}
    for seed in range(args.seeds):
        proposals = [e * args.noise for e in effects(args.proposals, seed, zero, real, harm_sd, lo, hi)]
        with tempfile.TemporaryDirectory() as tmp:
            for gate in ("strict", "noise"):
                r = simulate(gate, proposals, args.noise, Path(tmp), noise_options)
                if verbose:
                    print(f"  world {seed} {gate:6}: keeps {r['keeps']:3d}  false keeps {r['false_keeps']:3d}  "
                          f"missed real {r['missed_real']}/{r['real']}  true final {r['true_final']:.4f}  "
                          f"runs {r['runs']}  true gain/GPU-h {r['gain_per_gpu_h']:.5f}", flush=True)
                for key in ("keeps", "false_keeps", "harm_kept", "missed_real", "real", "true_final", "runs",
                            "gpu_h", "gain_per_gpu_h"):
                    totals[gate][key] = totals[gate].get(key, 0.0) + r[key] / args.seeds
    return totals


SWEEP = [  # (share of real improvements, their size in noise sd from .. to)
    (0.02, 1.0, 4.0), (0.02, 2.0, 8.0), (0.02, 3.0, 10.0),
    (0.05, 1.0, 4.0), (0.05, 2.0, 8.0), (0.05, 3.0, 10.0),
]


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def sweep(args) -> None:
    """One line per kind of world: where each gate does better per GPU-hour."""
    print(f"{args.proposals} proposals per world, {args.seeds} worlds of each kind, noise sd {args.noise}; "
          f"{args.zero:.0%} of proposals do nothing, the other non-improvements harm by 0 to {args.harm_sd:g} sd")
    print(f"{'real share':>10} {'real size (sd)':>15} {'false keeps s/n':>16} {'missed real s/n':>16} "
          f"{'true final s/n':>16} {'gain/GPU-h noise/strict':>24}")
    for real, lo, hi in SWEEP:
        t = compare(args, args.zero, real, lo, hi, args.harm_sd, verbose=False)
        s, n = t["strict"], t["noise"]
        pair = lambda key, fmt: f"{fmt.format(s[key])}/{fmt.format(n[key])}"  # noqa: E731
        print(f"{real:>10.0%} {f'{lo:g} to {hi:g}':>15} {pair('false_keeps', '{:.1f}'):>16} "
              f"{pair('missed_real', '{:.1f}'):>16} {pair('true_final', '{:.3f}'):>16} "
              f"{ratio(n['gain_per_gpu_h'], s['gain_per_gpu_h']):>24}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--proposals", type=int, default=300)
    parser.add_argument("--noise", type=float, default=0.005, help="std of the run-to-run noise")
    parser.add_argument("--seeds", type=int, default=3, help="worlds simulated (proposals and noise differ)")
    parser.add_argument("--zero", type=float, default=0.55, help="share of proposals with no effect")
    parser.add_argument("--real", type=float, default=0.05, help="share of real improvements")
    parser.add_argument("--real-sd", type=float, nargs=2, default=(2.0, 8.0), metavar=("LO", "HI"),
                        help="size of the real improvements, in noise sd (default 2 8)")
    parser.add_argument("--harm-sd", type=float, default=3.0, help="the rest harm by 0 to this many sd")
    parser.add_argument("--confirm", type=int, default=None, help="noise gate: confirmation runs (default: the run default)")
    parser.add_argument("--baseline-runs", type=int, default=None, help="noise gate: baseline runs (default: the run default)")
    parser.add_argument("--sweep", action="store_true",
                        help="one line per kind of world (share and size of the real improvements)")
    args = parser.parse_args()
    if args.sweep:
        sweep(args)
        return
    print(f"{args.proposals} proposals per world, noise sd {args.noise}, true baseline {BASE_QUALITY}")
    totals = compare(args, args.zero, args.real, *args.real_sd, args.harm_sd, verbose=True)
    print(f"\nmean over {args.seeds} worlds{'':5}{'strict':>12}{'noise':>12}")
    rows = [("keeps", "keeps", "{:.1f}"), ("false keeps (effect >= 0)", "false_keeps", "{:.1f}"),
            ("true harm kept", "harm_kept", "{:.4f}"), ("real improvements", "real", "{:.1f}"),
            ("missed real improvements", "missed_real", "{:.1f}"), ("true quality of final best", "true_final", "{:.4f}"),
            ("training runs", "runs", "{:.0f}"), ("GPU-hours (300 s/run)", "gpu_h", "{:.1f}"),
            ("true improvement / GPU-hour", "gain_per_gpu_h", "{:.5f}")]
    for label, key, fmt in rows:
        print(f"{label:28}" + "".join(f"{fmt.format(totals[g][key]):>12}" for g in ("strict", "noise")))
    s, n = totals["strict"], totals["noise"]
    print(f"false keeps strict/noise: {s['false_keeps'] / max(n['false_keeps'], 1e-9):.1f}x; "
          f"true improvement per GPU-hour noise/strict: {n['gain_per_gpu_h'] / s['gain_per_gpu_h']:.2f}x")


if __name__ == "__main__":
    main()
