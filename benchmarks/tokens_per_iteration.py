"""
Does the researcher's prompt grow with the run? 50 iterations of `--agent openai` against the
scripted OpenAI-compatible server (tests/fakes/openai_server.py) with the fake trainer, in a
throwaway research repo. The server reports input tokens from the size of what it receives
(about 4 chars per token), so the ledger's input_tokens follow the real prompt size.

The proposals mix kept, discarded and crashing edits, so the results table and the tail of
the last failing log are both in play. Prints the mean input tokens per iteration over the
first 10 and the last 10 iterations, and their ratio (flat = 1.0 is the goal; the first
iterations are a little smaller because the results table is still filling up).

    python benchmarks/tokens_per_iteration.py
    python benchmarks/tokens_per_iteration.py --iterations 100
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.config.load import resolve  # noqa: E402
from conftest import make_repo  # noqa: E402
from fakes.openai_server import Reply, ScriptedServer, approx_tokens, lower_value  # noqa: E402

OUTPUT_TOKENS = 180  # per answer


def mixed(counter: list[int]):
    """Every 5th proposal crashes the trainer, every 3rd makes it worse, the rest improve it."""
    def behaviour(request):
        counter[0] += 1
        n, tokens = counter[0], approx_tokens(request.text())
        mode = re.search(r"^MODE = .*$", request.text(), re.M)
        if n % 5 == 0 and mode:
            return Reply(f'train.py\n<<<<<<< SEARCH\n{mode.group(0)}\n=======\nMODE = "crash"\n'
                         f'>>>>>>> REPLACE\ntry the crash path', input_tokens=tokens, output_tokens=OUTPUT_TOKENS)
        return lower_value(request, step=-0.05 if n % 3 == 0 else 0.01, input_tokens=tokens,
                           output_tokens=OUTPUT_TOKENS)
    return behaviour


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-benchmark")
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer(default=mixed([0])) as server:
        repo = make_repo(Path(tmp) / "research")
        cfg = resolve(repo, "bench", {"agent": "openai", "model": "gpt-5.4", "iterations": args.iterations,
                                      "agent_options": {"base_url": server.url}})
        start = time.monotonic()
        summary = driver.run(cfg)
        wall_s = time.monotonic() - start
        rows = [r for r in ledger.read_rows(cfg.ledger_path)
                if (r.get("iteration") or 0) > 0 and r.get("agent_s") is not None]
    tokens = [r["input_tokens"] for r in rows]
    first, last = statistics.fmean(tokens[:10]), statistics.fmean(tokens[-10:])
    print(f"{len(rows)} iterations in {wall_s:.1f}s: {summary.counts}")
    print(f"input tokens per iteration, iterations 1-10:  {first:8.0f}")
    print(f"input tokens per iteration, iterations 11-20: {statistics.fmean(tokens[10:20]):8.0f}")
    print(f"input tokens per iteration, last 10:          {last:8.0f}")
    print(f"ratio last/first:                             {last / first:8.3f}")
    print(f"min/max over the run: {min(tokens)}/{max(tokens)}")


if __name__ == "__main__":
    main()
