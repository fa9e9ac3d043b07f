"""The bundled workload's separate evaluation, for real: train.py step-bounded on the CPU saves its
model, and `prepare.py --evaluate` in another process scores it on bytes the job never had.

The models that look ahead (plainly, or where a fixed check would not look) are cheats in
tests/cheats/, refused through the whole harness with the evaluation's reason; the demo's
reproducibility through this evaluation is tests/test_cli.py's demo-path test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 3



def run(work, *args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    base.update(HARNESS_CACHE_DIR=str(work.parent / "cache"), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
                OMP_NUM_THREADS="1")
    base.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, *args], cwd=work, env=base, capture_output=True, text=True, timeout=300)


def figures(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    tail = lines[len(lines) - lines[::-1].index("---"):]
    return dict(line.split(": ", 1) for line in tail)


def evaluate(work, out_dir: Path, result: Path):
    return run(work, "prepare.py", "--evaluate", HARNESS_OUTPUT_DIR=out_dir, HARNESS_RESULT_FILE=result)


def test_the_separate_evaluation_equals_the_in_process_figure(work, tmp_path):
    out = tmp_path / "out"
    trained = run(work, "train.py", HARNESS_MAX_STEPS=STEPS, HARNESS_OUTPUT_DIR=out)
    assert trained.returncode == 0, trained.stderr
    in_process = figures(trained.stdout)["val_bpb"]
    assert sorted(p.name for p in (out / "model").iterdir()) == ["meta.json", "program.json", "weights.safetensors"]
    result = tmp_path / "result.json"
    scored = evaluate(work, out, result)
    assert scored.returncode == 0, scored.stderr
    assert figures(scored.stdout)["val_bpb"] == in_process  # same bytes, same computation, printed alike
    assert f"{json.loads(result.read_text())['val_bpb']:.6f}" == in_process


def test_the_training_job_gets_the_training_split_alone(work, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    exported = run(work, "prepare.py", "--export-train", HARNESS_OUTPUT_DIR=data)
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in data.iterdir()) == ["meta.json", "train.bin"]
    trained = run(work, "train.py", HARNESS_MAX_STEPS=STEPS, HARNESS_DATA_DIR=data, HARNESS_OUTPUT_DIR=out)
    assert trained.returncode == 0, trained.stderr
    assert "val_bpb" not in figures(trained.stdout)  # the job's block is a log; it cannot score itself
    assert (out / "model" / "program.json").exists()
    peek = (work / "train.py").read_text() + '\nload_split("val")\n'
    (work / "train.py").write_text(peek)
    tried = run(work, "train.py", HARNESS_MAX_STEPS=1, HARNESS_DATA_DIR=data, HARNESS_OUTPUT_DIR=out)
    assert tried.returncode != 0 and "validation bytes are not available to the training job" in tried.stderr


def test_a_crafted_model_file_is_refused_without_running_it(work, tmp_path):
    out = tmp_path / "out"
    trained = run(work, "train.py", HARNESS_MAX_STEPS=1, HARNESS_OUTPUT_DIR=out)
    assert trained.returncode == 0, trained.stderr
    program_path = out / "model" / "program.json"
    pristine = program_path.read_text()
    marker = tmp_path / "pwned"
    attacks = {
        # a node whose target resolves, through torch's module attributes, to os.system
        "operator": lambda p: p["graph_module"]["graph"]["nodes"][0].update(target="torch.serialization.os.system"),
        # an ATen op that reads a file: the validation bytes, straight off the disk
        "from_file": lambda p: p["graph_module"]["graph"]["nodes"][0].update(
            target="torch.ops.aten.from_file.default"),
        # guard code is Python source that torch would run on load
        "guards": lambda p: p.update(guards_code=[f"__import__('os').system('touch {marker}')"]),
        # a symbolic size is parsed by sympy, whose parser evaluates strings
        "symbolic": lambda p: p["graph_module"]["graph"]["nodes"][0]["inputs"].append(
            {"name": "x", "arg": {"as_sym_int": {"as_expr": {
                "expr_str": f"__import__('os').system('touch {marker}')"}}}}),
        # what the evaluator's own runner (prepare.AtenProgram) does not run: a tag it does not know,
        # a dtype tag outside its table, a tensor used before a node makes it, a result of another kind
        "argument kind": lambda p: p["graph_module"]["graph"]["nodes"][0]["inputs"].append(
            {"name": "x", "arg": {"as_callable": "os.system"}, "kind": 2}),
        "dtype tag": lambda p: p["graph_module"]["graph"]["nodes"][0]["inputs"].append(
            {"name": "dtype", "arg": {"as_scalar_type": 99}, "kind": 2}),
        "later tensor": lambda p: p["graph_module"]["graph"]["nodes"][0]["inputs"].append(
            {"name": "x", "arg": {"as_tensor": {"name": p["graph_module"]["graph"]["outputs"][0]["as_tensor"]["name"]}},
             "kind": 1}),
        "result kind": lambda p: p["graph_module"]["graph"]["nodes"][0].update(outputs=[{"as_int": 3}]),
    }
    for name, attack in attacks.items():
        program = json.loads(pristine)
        attack(program)
        program_path.write_text(json.dumps(program))
        result = tmp_path / f"{name}.json"
        scored = evaluate(work, out, result)
        assert scored.returncode != 0, name
        assert "cannot be evaluated safely" in json.loads(result.read_text())["refused"], name
        assert not marker.exists(), name
    program_path.write_text(pristine)
    # the pristine model loads without torch's compiler stack (its deserializer imports it, a second
    # or more per evaluation) and gives the module's logits
    loaded = run(work, "-c", "import sys, torch, prepare; from pathlib import Path\n"
                 f"m, b, t = prepare.load_model(Path({str(out / 'model')!r}), torch.device('cpu'))\n"
                 "y = m(torch.zeros(b, t, dtype=torch.long))\n"
                 "print(tuple(y.shape), [n for n in ('torch._dynamo', 'torch._export.serde.serialize') "
                 "if n in sys.modules])")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[-2].endswith("[]"), loaded.stdout
    shutil.rmtree(out / "model")
    scored = evaluate(work, out, tmp_path / "none.json")
    assert "saved no model" in json.loads((tmp_path / "none.json").read_text())["refused"]


def probe(forward, seq_len: int = 64, batch_size: int = 8) -> tuple[float, bool]:
    """prepare.score in this process, on the bundled validation bytes: (bits per byte, causal)."""
    import torch
    sys.path.insert(0, str(ROOT))
    import prepare
    return prepare.score(forward, prepare.load_split("val", torch.device("cpu")), seq_len, batch_size, "cpu")


def test_the_probe_passes_a_causal_model_and_finds_a_look_ahead_under_its_tolerance():
    import torch
    import torch.nn.functional as F
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    bigram = lambda idx: table[idx]  # noqa: E731 - predicts from the current byte alone
    bpb, causal = probe(bigram)
    assert causal and 7.0 < bpb < 12.0
    # 8e-5 of a logit towards the byte that comes next moves each loss less than the 1e-4 nats one
    # prediction may move, but every cut shows it: refused on the average
    nudged = lambda idx: table[idx] + 8e-5 * F.one_hot(torch.roll(idx, -1, 1), 256)  # noqa: E731
    assert probe(nudged)[1] is False
    assert probe(bigram, batch_size=1)[1]  # one row per call: nothing to fill, still causal


def test_the_models_random_numbers_tell_nothing_of_the_probes_plan():
    """A model that draws the evaluation's random numbers to rebuild where the probe will cut, and
    looks ahead everywhere else: the plan has a secret seed of its own, so it is caught."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT))
    import prepare
    seq_len, batch_size = 1024, 2
    n_windows = prepare.EVAL_BYTES["cpu"] // seq_len
    val_len = len(prepare.load_split("val", torch.device("cpu")))
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    rebuilt: dict[bytes, torch.Tensor] = {}

    def plan_from(state: torch.Tensor) -> torch.Tensor:
        """prepare._is_causal's draws, from a generator in this state: the positions before its cuts."""
        gen, cut_at = torch.Generator(), torch.zeros(seq_len, dtype=torch.bool)
        gen.set_state(state)
        for _ in range(max(prepare.PROBE_ROUNDS, -(-prepare.PROBE_ROWS // n_windows))):
            torch.randperm(n_windows, generator=gen)
            cut_at[torch.randint(1, seq_len + 1, (n_windows,), generator=gen) - 1] = True
            for _ in range(0, n_windows, batch_size):
                torch.randint(0, max(1, val_len - seq_len - 1), (batch_size,), generator=gen)
        return cut_at

    def forward(idx):
        state = torch.get_rng_state()  # as every call starts: seeded by the evaluation
        key = bytes(state.numpy())
        if key not in rebuilt:
            rebuilt[key] = plan_from(state)
        look = ~rebuilt[key]
        look[-1] = False
        return table[idx] + 30.0 * F.one_hot(torch.roll(idx, -1, 1), 256) * look[None, :, None]

    bpb, causal = probe(forward, seq_len, batch_size)
    assert rebuilt and bpb < 6.0  # it did look ahead when scored
    assert causal is False


def looks_ahead_when_scored(spoil):
    """A model that looks one byte ahead in the scoring calls (the first n // seq_len // batch_size,
    counted here in-process; the exported model tells them apart by the bytes it is shown) and
    spoils every later call: the probe's calls, where the look ahead would show."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT))
    import prepare
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    scoring_calls = prepare.EVAL_BYTES["cpu"] // 64 // 8
    calls = []

    def forward(idx):
        calls.append(1)
        logits = table[idx] + 30.0 * F.one_hot(torch.roll(idx, -1, 1), 256)
        return logits if len(calls) <= scoring_calls else spoil(logits)
    return forward


def test_a_nan_or_an_infinity_anywhere_in_the_evaluation_refuses_the_model():
    """max() skips a NaN and `nan > tolerance` is False: a probe that compared them passed a model
    that looks ahead when scored and returns NaN (or +inf, whose losses are NaN) in the probe's calls."""
    import pytest
    import torch
    sys.path.insert(0, str(ROOT))
    import prepare

    def nan_at_one_position(logits):
        logits = logits.clone()
        logits[0, 0, 0] = float("nan")  # the first row's first prediction: before every cut
        return logits

    spoils = [lambda l: l * float("nan"), lambda l: l + float("inf"), nan_at_one_position, lambda l: l - torch.inf]
    for spoil in spoils:
        with pytest.raises(prepare.NotFinite, match="non-finite logit .* in a probe call"):
            probe(looks_ahead_when_scored(spoil))
    # finite logits whose loss is not: the byte that comes is given -3e38, the others +3e38
    overflow = lambda idx: 3e38 * (1 - 2 * torch.nn.functional.one_hot(torch.roll(idx, -1, 1), 256))  # noqa: E731
    with pytest.raises(prepare.NotFinite, match="non-finite loss .* in a scoring call"):
        probe(overflow)

    def nan_in_the_padding(idx):  # the last group's unscored rows are copies of its first
        logits = torch.zeros(*idx.shape, 256)
        return logits.masked_fill((idx == idx[:1]).all(1)[:, None, None] & (torch.arange(len(idx)) > 0)[:, None, None],
                                  float("nan"))
    with pytest.raises(prepare.NotFinite, match="non-finite logit .* in a scoring call"):
        probe(nan_in_the_padding, seq_len=64 * 3, batch_size=8)  # 171 windows: the last group has 3


def test_the_attention_operators_a_cuda_export_produces_are_accepted():
    """The evaluator's operator check was first met by CPU exports, where scaled-dot-product
    attention becomes `_scaled_dot_product_flash_attention_for_cpu`; on CUDA it dispatches to the
    flash, memory-efficient or cuDNN kernels instead (no CUDA here: the variants come from torch's
    own operator tables). Each must pass, or every GPU night is refused at its baseline."""
    import torch
    sys.path.insert(0, str(ROOT))
    import prepare

    def program(target: str) -> dict:
        return {"graph_module": {"graph": {"nodes": [{"target": target, "inputs": [], "outputs": []}]},
                                 "signature": {"output_specs": [{"user_output": {}}]}}}
    variants = [f"torch.ops.aten.{name}.{overload}" for name in dir(torch.ops.aten)
                if "scaled_dot_product" in name and not name.endswith("backward")
                for overload in getattr(torch.ops.aten, name).overloads()]
    kernels = {v.split(".")[3] for v in variants}
    assert {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"} <= kernels
    refused = {v: prepare.check_program(program(v)) for v in variants}
    assert not any(refused.values()), {v: p for v, p in refused.items() if p}
    assert prepare.check_program(program("torch.ops.aten.add_.Tensor"))  # the check is not a pass-through


def test_the_evaluator_runs_an_exported_model_exactly_as_the_module_computes_it(tmp_path, monkeypatch):
    """prepare.AtenProgram (the evaluator's own graph runner) against the module the program was
    exported from: literals of each kind (a -inf mask, which the format writes as a string, dtypes,
    a memory format, a device), a node with several results, a split, a constant, a buffer."""
    import torch
    sys.path.insert(0, str(ROOT))
    import prepare

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(256, 16)
            self.head = torch.nn.Linear(16, 256)
            self.register_buffer("scale", torch.tensor([0.5, 2.0]), persistent=False)

        def forward(self, idx):
            x = self.embed(idx)
            t = idx.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
            x = (x @ x.transpose(1, 2)).masked_fill(mask, float("-inf")).softmax(-1) @ x
            a, b = x.chunk(2, dim=-1)
            x = torch.cat([a * self.scale[0], b * self.scale[1]], -1).to(torch.float64).to(torch.float32)
            var, mean = torch.var_mean(x, dim=-1, keepdim=True)
            x = ((x - mean) / (var + 1e-5).sqrt()).contiguous(memory_format=torch.contiguous_format)
            return self.head(x) + torch.arange(256, device=idx.device, dtype=torch.float32) * torch.tensor(1e-3)

    monkeypatch.setattr(prepare, "OUTPUT_DIR", str(tmp_path))
    model = Model()
    folder = prepare.save_model(model, 16, 4)
    assert '"-Infinity"' in (folder / "program.json").read_text()
    loaded, batch_size, seq_len = prepare.load_model(folder, torch.device("cpu"))
    x = torch.randint(0, 256, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))
        assert torch.equal(loaded(x), loaded(x))  # nothing kept from one call to the next
