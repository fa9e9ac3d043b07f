"""Pure functions tested on strings: training output, mutation, prompt, ledger."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from harness import ledger
from harness.driver import prompt
from harness.agents.mutate import apply_change, find_knobs, fmt, perturb
from harness.workload.runner import judge, parse_summary

OUTPUT = """step 100 loss 2.1
---
val_bpb: 0.997900
training_seconds: 300.1
peak_vram_mb: 45060.2
depth: 8
note: hello world
"""


def test_parse_summary_takes_the_last_block():
    assert parse_summary(OUTPUT) == {"val_bpb": 0.9979, "training_seconds": 300.1,
                                     "peak_vram_mb": 45060.2, "depth": 8.0, "note": "hello world"}
    assert parse_summary("---\nval_bpb: 2\n---\nval_bpb: 1\n")["val_bpb"] == 1.0
    assert parse_summary("val_bpb: 1.0\n") == {}


@pytest.mark.parametrize("text,code,status,why", [
    (OUTPUT, 0, "ok", ""),
    (OUTPUT, 1, "crash", "exit code 1"),
    ("Traceback...\nRuntimeError: CUDA out of memory\n", 1, "crash", "RuntimeError: CUDA out of memory"),
    ("FAIL\n" + OUTPUT, 0, "crash", "FAIL"),
    ("---\nval_bpb: nan\n", 0, "crash", "not a finite number"),
    ("---\nval_bpb: inf\n", 0, "crash", "not a finite number"),
    ("---\nloss: 1.0\n", 0, "crash", "no 'val_bpb:' line"),
    ("no summary at all", 0, "crash", "no 'val_bpb:' line"),
])
def test_judge(text, code, status, why):
    got, metrics, reason = judge(text, code, "val_bpb")
    assert got == status
    assert why in reason


SOURCE = '''"""doc"""
import os
LEARNING_RATE = 3e-3  # peak lr
BATCH_SIZE = 32  # sequences
DEPTH = 4
LOG_EVERY = 25
WARMDOWN_FRAC = 0.5
WEIGHT_DECAY = 0.0
DEVICE = "cpu"
N_HEAD = 4 if DEVICE == "cpu" else 8
def f():
    INNER = 5
'''


def test_find_knobs_only_module_level_numbers():
    knobs = {k.name: k for k in find_knobs("train.py", SOURCE)}
    assert set(knobs) == {"LEARNING_RATE", "BATCH_SIZE", "DEPTH", "WARMDOWN_FRAC", "WEIGHT_DECAY"}
    assert knobs["BATCH_SIZE"].is_int and not knobs["LEARNING_RATE"].is_int
    assert knobs["LEARNING_RATE"].value == 3e-3


def test_perturb_stays_sane():
    knobs = {k.name: k for k in find_knobs("train.py", SOURCE)}
    rng = random.Random(0)
    for _ in range(200):
        lr = perturb(knobs["LEARNING_RATE"], rng)
        assert 0 < lr < 1 and lr != 3e-3 or lr == pytest.approx(3e-3, rel=0.05)
        assert perturb(knobs["BATCH_SIZE"], rng) in (16.0, 64.0)
        assert perturb(knobs["DEPTH"], rng) in (3.0, 5.0)
        assert 0 < perturb(knobs["WARMDOWN_FRAC"], rng) <= 0.99
        assert perturb(knobs["WEIGHT_DECAY"], rng) > 0


def test_apply_change_keeps_comment_and_other_lines():
    knob = {k.name: k for k in find_knobs("train.py", SOURCE)}["LEARNING_RATE"]
    out = apply_change(SOURCE, knob, fmt(4.5e-3, False))
    assert "LEARNING_RATE = 0.0045  # peak lr\n" in out
    assert out.replace("0.0045", "3e-3") == SOURCE
    assert fmt(1.2e-05, False) == "1.2e-05" and fmt(64.0, True) == "64"


def test_prompt_is_bounded_and_fills_placeholders():
    rows = [{"iteration": i, "commit": f"{i:012x}", "metric": 1.0 - i / 1000, "status": "discard",
             "description": "x" * 500} for i in range(1000)]
    text = prompt.render("Goal.\n{{BEST}}\n{{RESULTS}}\n{{LAST_FAILURE}}\n", metric="val_bpb",
                         direction="minimize", best=rows[5], rows=rows, history_rows=10,
                         last_failure="E" * 100_000, editable=("train.py",))
    assert "{{" not in text and "Current best val_bpb: 0.995000" in text
    assert "| 999 |" in text and "| 989 |" not in text
    assert len(text) < 6000
    plain = prompt.render("No placeholders here.", metric="val_bpb", direction="minimize", best=None,
                          rows=[], history_rows=10, last_failure="", editable=("train.py",))
    assert "## Recent results" in plain and "## Current best" in plain


def test_ledger_reads_five_column_file_and_repairs_torn_line(tmp_path: Path):
    five = tmp_path / "results.tsv"
    five.write_text("commit\tval_bpb\tmemory_gb\tstatus\tdescription\n"
                    "a1b2c3d\t0.997900\t44.0\tkeep\tbaseline\n"
                    "b2c3d4e\t0.993200\t44.2\tkeep\tincrease LR to 0.04\n"
                    "c3d4e5f\t0.000000\t0.0\tcrash\tdouble model width (OOM)\n")
    rows = ledger.read_rows(five)
    assert [r["status"] for r in rows] == ["keep", "keep", "crash"]
    assert rows[1]["metric"] == pytest.approx(0.9932) and rows[1]["cost_usd"] is None
    assert ledger.best_row(rows)["commit"] == "b2c3d4e"
    assert all("input_tokens" in r for r in rows) and ledger.metric_name(five) == "val_bpb"
    torn = tmp_path / "torn.tsv"
    ledger.append(torn, "val_bpb", ledger.Row("abc", 1.0, "keep", "baseline", 0))
    with open(torn, "a") as f:
        f.write("def\t0.9\t1.0\tkee")  # the write was cut off
    assert len(ledger.read_rows(torn)) == 1


def test_ledger_row_is_one_line():
    row = ledger.Row("abc", math.nan, "crash", ledger.one_line("a\tb\nc"), 1)
    cells = row.cells()
    assert cells[1] == "" and cells[4] == "a b c"
    with pytest.raises(ValueError):
        ledger.Row("abc", 1.0, "won", "", 1)
