"""A stand-in for train.py that follows the workload contract without a GPU.

The harness tests edit its globals to make it improve, regress, crash, hang, print NaN or
overrun its budget.
"""
import os
import subprocess
import sys
import time

VALUE = 1.0  # the metric this candidate reports (lower is better)
SLEEP_S = 0.0  # seconds of "training"
MODE = "ok"  # ok | crash | fail | nan | nometric | hang | stubborn_child

budget = float(os.environ.get("HARNESS_TIME_BUDGET", "300"))
# Run-to-run noise, like a fixed wall-clock budget on a GPU: FAKE_NOISE is its std. With
# FAKE_COUNTER (a file that numbers the runs) the noise is reproducible across test runs.
noise = float(os.environ.get("FAKE_NOISE", "0"))
if noise:
    import random
    counter = os.environ.get("FAKE_COUNTER")
    if counter:
        index = int(open(counter).read() or 0) if os.path.exists(counter) else 0
        open(counter, "w").write(str(index + 1))
        rng = random.Random(index)
    else:
        rng = random.Random()
    VALUE = VALUE + rng.gauss(0.0, noise)
print(f"fake training, budget {budget}s, seed {os.environ.get('HARNESS_SEED')}", flush=True)
if MODE == "hang":
    while True:
        time.sleep(1)
if MODE == "stubborn_child":
    # A grandchild that ignores SIGTERM: only killing the whole group stops it.
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)"
    child = subprocess.Popen([sys.executable, "-c", code])
    with open(os.environ.get("FAKE_CHILD_PID_FILE", os.devnull), "w") as f:
        f.write(str(child.pid))
    while True:
        time.sleep(1)
time.sleep(SLEEP_S)
if MODE == "crash":
    raise RuntimeError("CUDA out of memory (simulated)")
if MODE == "fail":
    print("FAIL")
    sys.exit(1)
print("---")
if MODE != "nometric":
    print(f"val_bpb: {'nan' if MODE == 'nan' else f'{VALUE:.6f}'}")
print(f"training_seconds: {SLEEP_S:.1f}")
print("peak_vram_mb: 2048.0")
