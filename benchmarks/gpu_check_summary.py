"""The figures scripts/gpu_check.sh prints from its run folder: the baseline's row, its job's
report block (tokens/s, MFU, steps, peak memory), the device it trained on and the capability set
the job held, read inside its sandbox (run.json).

    python benchmarks/gpu_check_summary.py RUN_FOLDER
"""
import json, sys
from pathlib import Path
run = Path(sys.argv[1]) if len(sys.argv) > 1 else sys.exit(__doc__)
from harness import ledger
rows = ledger.read_rows(run / "results.tsv")
base = rows[0] if rows else {}
log = (run / (base.get("log") or "logs/iter-0000.log")).read_text(errors="replace")
lines = log.splitlines()
block = lines[len(lines) - lines[::-1].index("---"):] if "---" in lines else []
figures = dict(l.split(": ", 1) for l in block if ": " in l)
manifest = json.loads((run / "run.json").read_text())
device = next((l for l in lines if l.startswith("device ")), "device: not printed")
tokens = float(figures.get("total_tokens_M", "nan")) * 1e6
seconds = float(figures.get("training_seconds", "nan"))
print(device)
print(f"status {base.get('status')}  val_bpb {base.get('metric')}  (from the separate evaluation; sealed {base.get('sealed')})")
print(f"tokens/s {tokens / seconds:,.0f}  MFU {figures.get('mfu_percent', '?')}%  steps {figures.get('num_steps', '?')}"
      f"  peak VRAM {figures.get('peak_vram_mb', '?')} MB  training {seconds:.1f}s")
if base.get("status") != "keep":
    print("the baseline was not kept: " + str(base.get("description")))
caps = manifest.get("sandbox_caps") or {}
print("the job's capabilities, read inside its sandbox: " + ", ".join(f"{k} {v}" for k, v in sorted(caps.items())))
