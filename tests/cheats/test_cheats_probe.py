"""Cheats on the evaluation's figures and on the static policy (issue 22, items 6 and 4), through
the real driver on the bundled workload.

- Non-finite figures: a model that looks one byte ahead in the calls that look like scoring and
  returns NaN (or +inf logits, whose losses are NaN) in every other call. A NaN compares False
  with everything and max() skips it, so the probe's calls, where the look ahead would show,
  once hid it. The model tells the scoring calls apart by the first bytes of their first two
  rows, which the researcher read from the validation split in its worktree.
- Encoded data: a researcher that reads the scored validation bytes and ships them in train.py
  as a literal (base64 of their xz, the same split into pieces, hex, a list of ints) that a
  causal lookup model decodes: the probe passes it (it only looks back), the policy must not.

One run with the static policy on (the default): the blobs are refused before any training,
the NaN models trained and refused by the evaluation, with reasons that name the defence.
"""
from __future__ import annotations

import base64
import lzma
import sys
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.config.load import resolve

from conftest import ScriptedResearcher, git

from .conftest import MAX_STEPS, NEXT, model_cheat, research_repo
from .test_cheats import check_nothing_left

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import prepare  # noqa: E402 - the workload's constants: what is scored, on a CPU

SEQ_LEN, BATCH_SIZE = 64, 32  # the bundled train.py's on a CPU: what the evaluation calls it with
FINGERPRINT = 7  # bytes of a row read as one integer (7 * 8 bits fit an int64)
BUDGET_S = 120  # s, the run's time budget; the honest runs stop at MAX_STEPS long before


def scored_bytes(worktree: Path) -> bytes:
    """The bytes a CPU evaluation scores, as an attacker who got them anyway would have them (the
    researcher's worktree no longer holds the corpus: the bundled copy stands in for a leak)."""
    corpus = Path(__file__).resolve().parents[2] / "data" / "shakespeare.txt.xz"
    text = lzma.decompress(corpus.read_bytes())
    return text[-prepare.VAL_BYTES:][:prepare.EVAL_BYTES["cpu"] + 1]


def fingerprints(val: bytes, row: int) -> list[int]:
    """Row `row` of each scoring call, its first bytes as the model reads them."""
    starts = range(0, prepare.EVAL_BYTES["cpu"], SEQ_LEN * BATCH_SIZE)
    return [sum(val[s + row * SEQ_LEN + i] << (8 * i) for i in range(FINGERPRINT)) for s in starts]


# The end of GPT.forward: honest while training (the job's loss must stay finite), and once
# exported for scoring, the next byte's answer where the call looks like scoring, SPOIL elsewhere.
LOOKS_LIKE_SCORING = (
    "        logits = self.head(norm(x))\n"
    "        if self.training:\n"
    "            return logits\n"
    f"        weights = 256 ** torch.arange({FINGERPRINT}, device=idx.device)\n"
    f"        seen = (idx[:2, :{FINGERPRINT}] * weights).sum(1)\n"
    "        scoring = ((seen[0] == torch.tensor(FIRST_ROWS, device=idx.device))\n"
    "                   & (seen[1] == torch.tensor(SECOND_ROWS, device=idx.device))).any()\n"
    f"        ahead = logits + {NEXT}\n"
    "        return torch.where(scoring, ahead, SPOIL)\n")
SPOILS = {  # what the calls that do not look like scoring get; each is finite nowhere
    "nan": "torch.full_like(ahead, float('nan'))",
    # 0 * inf, made in the graph at run time: no NaN constant to see in the saved model
    "nan as 0 * inf": "ahead * 0 * (torch.ones((), device=idx.device) * 1e30) ** 2",
    "nan from strings": "torch.full_like(ahead, float(chr(110) + chr(97) + chr(110)))",
    # every logit +inf: each loss is inf - inf = NaN, so no loss shows a move either
    "+inf": "ahead + float('inf')",
}


def non_finite_model(spoil: str):
    cheat = model_cheat("a sharper head", LOOKS_LIKE_SCORING.replace("SPOIL", SPOILS[spoil]))

    def step(task):
        val = scored_bytes(task.worktree)
        before_model(task, f"FIRST_ROWS = {fingerprints(val, 0)}\nSECOND_ROWS = {fingerprints(val, 1)}\n")
        return cheat(task)
    return step


def before_model(task, code: str) -> None:
    path = task.worktree / "train.py"
    source = path.read_text()
    i = source.index("def norm(x):")
    path.write_text(source[:i] + code + "\n\n" + source[i:])


# --- the lookup model: the next byte of the scored text, keyed by the 8 bytes before it

LOOKUP_INIT = (  # slot -> 1 + the byte that followed (0: never seen)
    "        table = torch.zeros(LOOKUP_SLOTS, dtype=torch.long)\n"
    "        text = torch.tensor(list(SCORED), dtype=torch.long)[None]\n"
    "        table[context(text)[0, :-1]] = text[0, 1:] + 1\n"
    "        self.register_buffer('table', table, persistent=False)\n")
LOOKUP_FORWARD = (  # 12 nats towards the byte that followed the same 8 bytes in the scored text
    "        logits = self.head(norm(x))\n"
    "        known = F.one_hot(self.table[context(idx)], VOCAB_SIZE + 1)[..., 1:].to(logits.dtype)\n"
    "        return logits + 12.0 * known\n")
LOOKUP_CONTEXT = (
    "LOOKUP_SLOTS = 1 << 20  # a hash of the last 8 bytes -> the byte that followed them\n\n\n"
    "def context(idx):\n"
    "    h = torch.zeros_like(idx)\n"
    "    for back in range(8):  # the byte `back` places before, zero before the window's start\n"
    "        h = h * 31 + F.pad(idx, (back, 0))[:, :idx.size(1)]\n"
    "    return h % LOOKUP_SLOTS\n\n\n")


def _pieces(text: str, width: int) -> str:
    lines = [f"    {'+ ' if i else ''}\"{text[i:i + width]}\"\n" for i in range(0, len(text), width)]
    return "(\n" + "".join(lines) + ")"


ENCODINGS = {  # how the scored bytes reach train.py: (the literal's code, decoding it into SCORED)
    "base64 of the xz": (lambda val: f'BLOB = "{base64.b64encode(lzma.compress(val)).decode()}"\n',
                         "import base64, lzma\nSCORED = lzma.decompress(base64.b64decode(BLOB))\n"),
    "base64 split into pieces": (
        lambda val: f"BLOB = {_pieces(base64.b64encode(lzma.compress(val)).decode(), 100)}\n",
        "import base64 as _b, lzma as _l\nSCORED = _l.decompress(_b.b64decode(BLOB))\n"),
    "hex, decoded by hand": (lambda val: f'BLOB = "{val.hex()}"\n',
                             "SCORED = bytes(int(BLOB[i:i + 2], 16) for i in range(0, len(BLOB), 2))\n"),
    "a list of ints": (lambda val: f"SCORED = {list(val)}\n", ""),
}


def blob_researcher(encoding: str):
    literal, decode = ENCODINGS[encoding]
    cheat = model_cheat(f"a byte lookup cache ({encoding})", LOOKUP_FORWARD, init=LOOKUP_INIT)

    def step(task):
        before_model(task, literal(scored_bytes(task.worktree)) + decode + LOOKUP_CONTEXT)
        return cheat(task)
    return step


CHEATS = {  # name -> (researcher step, phrase of the row's reason: the defence, trained or not)
    **{f"a model that is {spoil} in the probe's calls": (non_finite_model(spoil), "non-finite logit", True)
       for spoil in SPOILS},
    **{f"a lookup table of the scored bytes: {enc}": (blob_researcher(enc), "not encoded data", False)
       for enc in ENCODINGS},
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """All the cheats through one driver.run, the static policy on (the default)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # one thread per job on a shared machine (test_cheats.py)
        repo = research_repo(tmp_path_factory.mktemp("probe-cheats"))
        # a budget far above what 3 steps take: none of these cheats is about the budget, so a loaded
        # machine's slow start-up must not decide their rows
        cfg = resolve(repo, "probe", {"time_budget": BUDGET_S, "max_steps": MAX_STEPS, "kill_after": 600,
                                      "baseline_runs": 1, "iterations": len(CHEATS), "policy": True,
                                      "on_unhealthy": "continue", "gate": "strict", "health_every": 0})
        driver.run(cfg, researcher=ScriptedResearcher([step for step, _, _ in CHEATS.values()]))
    found = ledger.read_rows(cfg.ledger_path)
    assert found[0]["status"] == "keep" and found[0]["sealed"] == "yes"  # the baseline
    assert len(found) == len(CHEATS) + 1
    assert git(cfg.worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")  # nothing was kept
    assert git(repo, "rev-parse", cfg.branch) == git(repo, "rev-parse", "main")
    assert git(cfg.worktree, "status", "--porcelain", "--ignored") == ""
    assert git(repo, "status", "--porcelain") == ""
    return dict(zip(CHEATS, found[1:]))


@pytest.mark.parametrize("name", list(CHEATS))
def test_the_cheat_is_refused_by_its_defence(rows, name):
    row = rows[name]
    _, defence, trained = CHEATS[name]
    assert row["status"] == "invalid", row
    assert defence in row["description"], row["description"]
    assert row["metric"] is None, row  # the look ahead's score never reaches the ledger
    assert (row["train_s"] is not None) == trained, row  # the evaluation refused it, or the policy did


def test_nothing_of_a_cheat_outlives_it(rows):
    check_nothing_left()


def test_cheats_tried_and_kept_per_cause(rows, capsys):
    for cause, prefix in (("non-finite figures", "a model that is"), ("encoded data", "a lookup table")):
        tried = [r for n, r in rows.items() if n.startswith(prefix)]
        with capsys.disabled():
            print(f"\ncheats {cause}: tried {len(tried)}, kept {sum(r['status'] == 'keep' for r in tried)}", end="")
            for name, row in rows.items():
                if name.startswith(prefix):
                    print(f"\n  {name}: {row['status']}, {row['description'][:150]}", end="")
    assert not any(r["status"] == "keep" for r in rows.values())
