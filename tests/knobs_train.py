"""A fake trainer with independent knobs on separate lines, so two changes can merge cleanly.

The metric is VALUE - A - B. With FAKE_GPU_LOG set, each run appends
`<CUDA_VISIBLE_DEVICES> <start> <end>` to that file (wall-clock seconds).
"""
import os
import time

A = 0.0  # one knob
# (git merges changes to lines that touch as one conflicting hunk: the knobs are kept apart)
B = 0.0  # another knob
# ---
VALUE = 1.0
# ---
SLEEP_S = 0.3  # s of "training"

start = time.time()
time.sleep(SLEEP_S)
end = time.time()
if os.environ.get("FAKE_GPU_LOG"):
    with open(os.environ["FAKE_GPU_LOG"], "a") as f:
        f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES', '-')} {start:.4f} {end:.4f}\n")
print("---")
print(f"val_bpb: {VALUE - A - B:.6f}")
print("peak_vram_mb: 1024.0")
