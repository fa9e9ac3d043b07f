"""How far the causality probe sees an honest model's losses move (prepare.py's NLL_TOLERANCE).

The probe feeds each scored window again with its bytes from a cut on replaced, among other
rows; an honest (causal) model's losses before the cut move only by the arithmetic's noise. This
measures that noise for the bundled model (train.py's definitions, on the device's default
sizes, every weight drawn at its init scale so no output starts at zero) on the real validation
bytes, in float32 and under bf16 autocast, and prints it beside the tolerance the probe uses.

    python benchmarks/probe_noise.py              # CPU: float32, and bf16 autocast (a lower bound for CUDA)
    python benchmarks/probe_noise.py --device cuda  # CUDA: bf16 autocast, as the evaluation scores there
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def model_on(device: str, seed: int):
    """The bundled GPT from train.py's definitions (nothing of its training loop runs)."""
    import torch
    sys.path.insert(0, str(ROOT))
    source = (ROOT / "train.py").read_text()
    head = source[:source.index("raw_model = GPT()")]
    names: dict = {"__name__": "train_definitions"}
    exec(compile(head, str(ROOT / "train.py"), "exec"), names)
    torch.manual_seed(seed)
    model = names["GPT"]().to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, names["INIT_STD"])
    return model, names["SEQ_LEN"], names["BATCH_SIZE"]


def measure(device: str, bf16: bool, seed: int) -> dict:
    import torch
    import prepare
    model, seq_len, batch_size = model_on(device, seed)
    val = prepare.load_split("val", device)

    def forward(x):
        on = bf16 and device == "cpu"  # on CUDA prepare.score itself scores under bf16 autocast
        with torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext():
            return model(x)
    bpb, causal = prepare.score(forward, val, seq_len, batch_size, device)
    tolerance = prepare.NLL_TOLERANCE.get(torch.device(device).type, prepare.NLL_TOLERANCE["cuda"])
    return {"device": device, "dtype": "bf16" if bf16 or device == "cuda" else "float32", "val_bpb": bpb,
            "moved_nats": prepare._STATE["probe_moved"], "tolerance_nats": tolerance, "causal": causal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = [(args.device, True)] if args.device.startswith("cuda") else [(args.device, False), (args.device, True)]
    print(f"{'device':8} {'dtype':8} {'largest move (nats)':>20} {'tolerance':>10} {'ratio':>8}  probe")
    for device, bf16 in runs:
        r = measure(device, bf16, args.seed)
        ratio = r["moved_nats"] / r["tolerance_nats"]
        print(f"{r['device']:8} {r['dtype']:8} {r['moved_nats']:20.3e} {r['tolerance_nats']:10.0e} {ratio:8.3f}  "
              f"{'passes' if r['causal'] else 'REFUSES an honest model'}")


if __name__ == "__main__":
    main()
