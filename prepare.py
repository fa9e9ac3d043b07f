"""
The fixed part of the workload: data, tokenizer, time budget, evaluation, result reporting.
The researcher may never change this file; train.py imports it.

    python prepare.py                            # check the bundled corpus and print its split
    python prepare.py --data PATH [--name NAME]  # a .txt file, a folder of .txt, or parquet (`text` column)
    python prepare.py --download NAME            # fetch a public parquet corpus (see DOWNLOADS)
    python prepare.py --export-train DIR         # the harness: the training split alone, for the job
    python prepare.py --evaluate                 # the harness: score the model in $HARNESS_OUTPUT_DIR
    python prepare.py --evaluate --split test    # the harness: score it once on the private test split

Under the harness, train.py never sees the validation bytes: it trains on the split in
$HARNESS_DATA_DIR, saves its model with save_model(), and the harness scores that model with
`prepare.py --evaluate` in a separate sandboxed process, from prepare.py as committed at the
baseline (docs/robustness.md). Run alone, train.py is scored in-process as well.

A test split, held out before the validation split, is read by `--evaluate --split test` alone:
no training job, no researcher and no keep decision sees it. The harness scores the baseline and
the best on it once, at the end of a run, to tell how much of the validation gain carries over.

Then select a prepared dataset with HARNESS_DATASET=NAME (default: the bundled shakespeare).

Tokens are raw bytes (vocab 256), so the cross-entropy converts to bits per byte exactly,
and any model, tokenizer trick or not, is judged on the same bytes.
"""

import argparse
import functools
import hashlib
import json
import lzma
import math
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F

_clock = time.monotonic  # bound now: rebinding time.monotonic later does not move this clock
# What this module measured itself; report() signs these, not what its caller claims.
_STATE = {"imported": _clock(), "train_start": None, "eval_start": None, "val_bpb": None,
          "in_eval": False, "val_outside_eval": False, "in_test": False}

# -----------------------------------------------------------------------------
# The rules of the game

TIME_BUDGET = float(os.environ.get("HARNESS_TIME_BUDGET", "300"))  # seconds of training steps
MAX_STEPS = int(os.environ["HARNESS_MAX_STEPS"]) if os.environ.get("HARNESS_MAX_STEPS") else None  # optimizer steps
SEED = int(os.environ.get("HARNESS_SEED", "42"))  # for init and batch order
DATASET = os.environ.get("HARNESS_DATASET", "shakespeare")  # "shakespeare" = the bundled corpus
TRAIN_DATA_DIR = os.environ.get("HARNESS_DATA_DIR")  # set by the harness: the training split alone
OUTPUT_DIR = os.environ.get("HARNESS_OUTPUT_DIR")  # set by the harness: where save_model() writes
# set by the harness for its evaluation: the share of the GPU's memory it may take (a training job
# may be using the same GPU meanwhile)
GPU_MEMORY_FRACTION = float(os.environ.get("HARNESS_GPU_MEMORY_FRACTION") or 1.0)
VOCAB_SIZE = 256  # bytes
VAL_BYTES = 524_288  # tail of the corpus held out for validation (at most a tenth of it)
TEST_BYTES = 524_288  # held out just before the validation bytes, for the test split (at most a tenth)
EVAL_BYTES = {"cpu": 32_768, "cuda": 524_288}  # bytes scored by evaluate_bpb, fixed per device type
MIN_DATASET_BYTES = 100_000  # smaller corpora make the metric meaningless
DOC_SEPARATOR = b"\x00"  # between documents of a folder or parquet corpus; never occurs in text

# -----------------------------------------------------------------------------
# The bundled corpus, pinned by hash (see scripts/build_data.py and data/shakespeare.sha256)

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_XZ = DATA_DIR / "shakespeare.txt.xz"
BUNDLED_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"  # of the decompressed text
BUNDLED_VAL_SHA256 = "284886ad23e0cd7583eb03c2046a31440457ba716e709ce40b2f88a64524baef"  # of its last VAL_BYTES
BUNDLED_TEST_SHA256 = "11f18d4f8ba08b922aa66ab0f7ce61de8a462138a805ce4e4c206a3a64929259"  # of the TEST_BYTES before
REBUILD_HINT = "Rebuild it with: python scripts/build_data.py"

CACHE_DIR = Path(os.environ.get("HARNESS_CACHE_DIR", Path.home() / ".cache" / "autoresearch-harness"))

# Corpora suited to a 5-minute GPU run: a few shards of ~250M characters each. The last shard of
# each list is the dataset's own held-out shard, so validation bytes come from its tail.
# Checksums are None where unknown; a known one is verified after download.
CLIMBMIX = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
FINEWEB_EDU = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
DOWNLOADS = {
    "climbmix": [(f"{CLIMBMIX}/shard_{i:05d}.parquet", None) for i in (0, 1, 6542)],
    "fineweb-edu": [(f"{FINEWEB_EDU}/shard_{i:05d}.parquet", None) for i in (0, 1, 1822)],
}
HTTP_TIMEOUT = 60  # seconds without progress before a download gives up
CHUNK = 1 << 20  # bytes per read when streaming files


def _fail(message: str):
    """Stop with a message a person (or an LLM) can act on; SystemExit so train code cannot swallow it."""
    raise SystemExit(f"prepare.py: error: {message}")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


# -----------------------------------------------------------------------------
# Loading a split

def _load_bundled() -> tuple[bytes, bytes, bytes]:
    """(train, val, test): the corpus is train | test | val, val its last VAL_BYTES."""
    if not BUNDLED_XZ.exists():
        _fail(f"{BUNDLED_XZ} is missing. {REBUILD_HINT}")
    try:
        text = lzma.decompress(BUNDLED_XZ.read_bytes())
    except lzma.LZMAError as e:
        _fail(f"{BUNDLED_XZ} is corrupt ({e}). {REBUILD_HINT}")
    digest = hashlib.sha256(text).hexdigest()
    if digest != BUNDLED_SHA256:
        _fail(f"{BUNDLED_XZ} has sha256 {digest} after decompression, expected {BUNDLED_SHA256}. {REBUILD_HINT}")
    train, test, val = text[:-VAL_BYTES - TEST_BYTES], text[-VAL_BYTES - TEST_BYTES:-VAL_BYTES], text[-VAL_BYTES:]
    if hashlib.sha256(val).hexdigest() != BUNDLED_VAL_SHA256:  # VAL_BYTES was changed: the metric would be too
        _fail("the validation split of the bundled corpus changed; restore prepare.py")
    if hashlib.sha256(test).hexdigest() != BUNDLED_TEST_SHA256:
        _fail("the test split of the bundled corpus changed; restore prepare.py")
    return train, val, test


def _load_prepared(name: str) -> tuple[bytes, bytes, bytes | None]:
    """(train, val, test); test is None for a dataset prepared before the test split existed."""
    folder = CACHE_DIR / "datasets" / name
    if not (folder / "meta.json").exists():
        _fail(f"dataset {name!r} is not prepared in {folder}. "
              f"Run: python prepare.py --data PATH --name {name}  (or --download {name})")
    meta = json.loads((folder / "meta.json").read_text())
    splits = []
    for split in ("train", "val", "test"):
        if split == "test" and "test_sha256" not in meta:
            splits.append(None)
            continue
        data = (folder / f"{split}.bin").read_bytes()
        if hashlib.sha256(data).hexdigest() != meta[f"{split}_sha256"]:
            _fail(f"{folder / f'{split}.bin'} does not match meta.json. Prepare the dataset {name!r} again.")
        splits.append(data)
    return splits[0], splits[1], splits[2]


def _load_exported(folder: Path) -> bytes:
    """The training split that `prepare.py --export-train` wrote for a training job."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        data = (folder / "train.bin").read_bytes()
    except (OSError, ValueError) as e:
        _fail(f"the training split in {folder} cannot be read ({e}); the harness exports it before the job")
    if hashlib.sha256(data).hexdigest() != meta.get("train_sha256"):
        _fail(f"{folder / 'train.bin'} does not match its meta.json")
    return data


def export_train(dest: Path) -> dict:
    """Write the selected dataset's training split alone (the harness gives it to the job)."""
    train = _load_corpus()[0]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "train.bin").write_bytes(train)
    meta = {"dataset": DATASET, "train_bytes": len(train), "train_sha256": hashlib.sha256(train).hexdigest()}
    (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _load_corpus() -> tuple[bytes, bytes, bytes | None]:
    return _load_bundled() if DATASET == "shakespeare" else _load_prepared(DATASET)


_SPLITS: dict = {}  # (split, device) -> uint8 tensor, loaded once per process


def load_split(split: str, device="cpu") -> torch.Tensor:
    """The bytes of `split` ("train" or "val") of the selected dataset, as a uint8 tensor on `device`.
    The test split is for the harness's test evaluation (`--evaluate --split test`) alone."""
    if split == "test" and not _STATE["in_test"]:
        _fail("the test split is read only by the harness's test evaluation (prepare.py --evaluate --split "
              "test), never by training or tuning; train.py may only use load_split/get_batch on 'train'")
    if split == "val" and not _STATE["in_eval"]:
        _STATE["val_outside_eval"] = True  # only evaluate_bpb may read the validation bytes
    if not _SPLITS:  # first use: load and verify the corpus once
        if TRAIN_DATA_DIR is not None:
            train, val, test = _load_exported(Path(TRAIN_DATA_DIR)), None, None
        else:
            train, val, test = _load_corpus()
        _SPLITS[("train", "cpu")] = torch.frombuffer(bytearray(train), dtype=torch.uint8)
        if val is not None:
            _SPLITS[("val", "cpu")] = torch.frombuffer(bytearray(val), dtype=torch.uint8)
            _SPLITS["val_sha256"] = hashlib.sha256(val).hexdigest()
        if test is not None and _STATE["in_test"]:  # never kept in a process that trains
            _SPLITS[("test", "cpu")] = torch.frombuffer(bytearray(test), dtype=torch.uint8)
    if split == "test" and ("test", "cpu") not in _SPLITS:
        _fail(f"the dataset {DATASET!r} has no test split (prepared before test splits existed, or under the "
              f"harness's training split alone); prepare it again: python prepare.py --data PATH --name {DATASET}")
    if split == "val" and ("val", "cpu") not in _SPLITS:
        _fail("the validation bytes are not available to the training job (HARNESS_DATA_DIR holds the "
              "training split alone): the harness scores the model that save_model() writes")
    key = (split, str(device))
    if key not in _SPLITS:
        _SPLITS[key] = _SPLITS[(split, "cpu")].to(device)
    if split == "train" and _STATE["train_start"] is None:
        _STATE["train_start"] = _clock()  # the training clock starts once the training data is loaded
    return _SPLITS[key]


def get_batch(split: str, batch_size: int, seq_len: int, device, generator: torch.Generator):
    """Random windows of `split`: inputs x and next-byte targets y, both (batch_size, seq_len) int64.
    The generator must live on `device`; then sampling never waits for the host."""
    data = load_split(split, device)
    starts = torch.randint(len(data) - seq_len - 1, (batch_size, 1), device=device, generator=generator)
    window = data[starts + torch.arange(seq_len + 1, device=device)].long()
    return window[:, :-1], window[:, 1:]


# -----------------------------------------------------------------------------
# The metric

@torch.no_grad()
def evaluate_bpb(model, seq_len: int, batch_size: int) -> float:
    """Bits per byte of `model` on the first EVAL_BYTES[device] validation bytes, scored in order
    by consecutive windows of seq_len bytes. model(idx) must return logits (B, T, 256).
    The result is kept here too: report() checks that it reports this value."""
    if _STATE["eval_start"] is None:
        _STATE["eval_start"] = _clock()  # the training clock stops here
    device = next(model.parameters()).device
    _STATE["in_eval"] = True
    try:
        val = load_split("val", device)
    finally:
        _STATE["in_eval"] = False
    problems = _integrity_problems(val)
    if problems:
        _refuse(problems)
    was_training = model.training
    model.eval()
    try:
        bpb, causal = score(model, val, seq_len, batch_size, device)
    except NotFinite as e:
        _refuse([str(e)])
    if not causal:
        _refuse([NOT_CAUSAL])
    model.train(was_training)
    _STATE["val_bpb"] = bpb
    return bpb


NOT_CAUSAL = ("the model's prediction for a byte depends on later bytes (it is not causal), so it sees the "
              "answers; keep attention causal (is_causal=True)")


class NotFinite(ValueError):
    """A NaN or an infinity seen anywhere in the evaluation (a logit of any call, a loss, the score).
    Such a model is refused, never scored: a NaN compares False with everything and max() skips
    it, so a check it reached would pass whatever it hid (a look ahead in the probe's calls)."""


def _finite(values, what: str, where: str):
    """values, when every one is a finite number; else NotFinite naming what and where."""
    if not bool(torch.isfinite(torch.as_tensor(values)).all()):
        raise NotFinite(f"the evaluation saw a non-finite {what} (NaN or infinity) in {where}; the model "
                        f"must return finite logits in every call (mask with a large negative number, not -inf)")
    return values


@torch.no_grad()
def score(forward, val, seq_len: int, batch_size: int, device) -> tuple[float, bool]:
    """(bits per byte, causal) of forward on the first EVAL_BYTES[device] bytes of val.

    Every call has the shape (batch_size, seq_len), so an exported model of fixed shape is scored
    exactly like the module it came from: a short last group is padded with copies of its first
    window and a short last window with the bytes after it, and the padding is not scored. This
    one function serves evaluate_bpb (in-process) and the harness's separate evaluation.

    Every call starts from one random seed, drawn for this evaluation and kept secret, so a
    model's random numbers are the same in every call and cannot count them; the probe's plan
    comes from another secret seed, so they tell nothing of it either. The global random state is
    restored afterwards."""
    device = torch.device(device)
    n = min(EVAL_BYTES[device.type], len(val) - 1)  # the same bytes are scored whatever seq_len is
    starts = list(range(0, n, seq_len))
    calls_seed, plan_seed = (int.from_bytes(os.urandom(8), "little") for _ in range(2))

    def call(x, where: str):
        torch.manual_seed(calls_seed)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = forward(x)
        return _finite(logits, "logit", where)

    positions = torch.arange(seq_len + 1, device=device)
    lengths = torch.tensor([min(seq_len, n - s) for s in starts], device=device)
    scored = torch.empty(len(starts), seq_len, device=device)  # each window's loss by position
    total_nats = 0.0
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for i in range(0, len(starts), batch_size):
            group = starts[i:i + batch_size]
            rows = group + [group[0]] * (batch_size - len(group))
            window = _windows(val, torch.tensor(rows, device=device), positions)
            nll = _losses(call(window[:, :-1], "a scoring call"), window[:, 1:], "a scoring call")
            total_nats += nll[:len(group)][positions[None, :seq_len] < lengths[i:i + len(group), None]].sum().item()
            scored[i:i + len(group)] = nll[:len(group)]
        bpb = total_nats / n / math.log(2)
        _finite(bpb, "val_bpb", "the score")  # a sum of finite losses can still overflow
        causal = _is_causal(call, val, starts, lengths, scored, batch_size, plan_seed)
    return bpb, causal


def _windows(val, starts, positions):
    return val[(starts[:, None] + positions).clamp(max=len(val) - 1)].long()


def _losses(logits, targets, where: str):
    """Each prediction's loss in nats; finite logits can still overflow it (a logit of 1e38)."""
    nll = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), targets.reshape(-1), reduction="none")
    return _finite(nll.view(targets.shape), "loss", where)


# The causality probe. Each scored window is fed again (PROBE_ROUNDS times, at least PROBE_ROWS
# rows in all) with its bytes from a random cut on replaced by text from elsewhere, among other
# rows than when it was scored; its loss before the cut must not move. The cuts, the rows' order
# and the replacement text come from the evaluation's secret seed, and the model keeps nothing
# between calls (check_program), so a probe call is no different to it from a scoring call: a
# model that looks ahead, or at its neighbours, wherever a probe may look is refused. Cut =
# seq_len changes the other rows only (a look at the next window's first byte).
PROBE_ROWS = 1024
PROBE_ROUNDS = 2
NLL_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-2}  # nats one prediction's loss may move (bf16 on GPUs)


def _is_causal(call, val, starts, lengths, scored, batch_size: int, plan_seed: int) -> bool:
    seq_len, device = scored.shape[1], scored.device
    gen = torch.Generator().manual_seed(plan_seed)
    n_windows = len(starts)
    rounds = max(PROBE_ROUNDS, -(-PROBE_ROWS // n_windows))
    positions = torch.arange(seq_len + 1, device=device)
    tolerance = NLL_TOLERANCE.get(device.type, NLL_TOLERANCE["cuda"])
    moved, at_cut = 0.0, []
    for _ in range(rounds):
        order = torch.randperm(n_windows, generator=gen)
        cuts = torch.randint(1, seq_len + 1, (n_windows,), generator=gen)
        for i in range(0, n_windows, batch_size):
            w = order[i:i + batch_size]
            k = len(w)  # probed rows; the rest of the call is text from random offsets (unscored)
            offsets = torch.randint(0, max(1, len(val) - seq_len - 1), (batch_size,), generator=gen)
            original = _windows(val, torch.tensor([starts[j] for j in w.tolist()], device=device), positions)
            elsewhere = _windows(val, offsets.to(device), positions)
            w, cut = w.to(device), cuts[w].to(device)
            probe = torch.where(positions[None, :] >= cut[:, None], elsewhere[:k], original)
            same = (probe == original) & (positions[None, :] == cut[:, None])  # the first replaced byte must differ
            probe = torch.where(same, (original + 1) % VOCAB_SIZE, probe)
            x = torch.cat([probe[:, :-1], elsewhere[k:, :-1]])
            targets = torch.cat([original[:, 1:], elsewhere[k:, 1:]])
            loss = _losses(call(x, "a probe call"), targets, "a probe call")[:k]
            shift = loss - scored[w]  # how far each prediction moved from when it was scored
            before_cut = positions[None, :seq_len] < torch.minimum(cut, lengths[w])[:, None]
            if before_cut.any():  # fails closed: a NaN here (there is none: see _finite) is a move
                largest = shift[before_cut].abs().max().item()
                moved = moved if largest <= moved else largest
            scored_cut = cut <= lengths[w]
            at_cut += shift[scored_cut, (cut - 1)[scored_cut]].tolist()
    _STATE["probe_moved"] = moved  # the largest move seen, for benchmarks/probe_noise.py (never a decision)
    if not moved <= tolerance:  # not `moved > tolerance`, which a NaN would pass
        return False
    # a small look ahead, under the tolerance, still shows as a loss that rises at the cut on average
    d = torch.tensor(at_cut, dtype=torch.float64)
    if len(d) >= 2 and not d.mean().item() <= 5 * d.std().item() / math.sqrt(len(d)) + tolerance / 10:
        return False
    return True


# -----------------------------------------------------------------------------
# Integrity: the evaluation is fixed. What it depends on is remembered at import and checked
# before scoring and before sealing, so patching it at run time is refused, not rewarded.

def _integrity_problems(val=None) -> list:
    problems = []
    changed = [name for name, value in _PRISTINE.items() if not _same(globals().get(name), value)]
    if changed:
        problems.append(f"prepare.{', prepare.'.join(changed)} changed at run time; the data, budget and "
                        f"evaluation are fixed: change the model or training in train.py instead")
    if F.cross_entropy is not _CROSS_ENTROPY or math.log is not _LOG:
        problems.append("a function the evaluation uses (F.cross_entropy or math.log) was replaced at run time")
    if val is not None and "val_sha256" in _SPLITS:
        if hashlib.sha256(val.cpu().numpy().tobytes()).hexdigest() != _SPLITS["val_sha256"]:
            problems.append("the validation bytes in memory were changed")
    if _STATE["val_outside_eval"]:
        problems.append("the validation split was read outside evaluate_bpb (training or tuning on the "
                        "validation bytes); train.py may only use load_split/get_batch on 'train'")
    return problems


def _same(a, b) -> bool:
    if callable(b):
        return a is b
    try:
        return type(a) is type(b) and a == b
    except Exception:  # an exotic value that cannot even be compared
        return False


def _refuse(problems: list) -> None:
    """Write the refusal where the harness looks for the result, and stop the job."""
    path = os.environ.get("HARNESS_RESULT_FILE")
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps({"refused": "; ".join(problems)}) + "\n")
        tmp.replace(path)
    raise SystemExit("prepare.py: refused: " + "; ".join(problems))


# -----------------------------------------------------------------------------
# Reporting

def report(**metrics) -> None:
    """Print the result block (a `---` line, then `key: value`) and write the same figures as JSON
    to $HARNESS_RESULT_FILE. Under the harness this is a log: the metric comes from its separate
    evaluation of the saved model.

    val_bpb is the value evaluate_bpb measured (a different one is refused), and training_seconds
    is at least this module's own clock: from the first touch of the training data to the
    evaluation."""
    problems = _integrity_problems()
    measured = _STATE["val_bpb"]
    if measured is None and TRAIN_DATA_DIR is None:
        problems.append("report() was called but evaluate_bpb never measured val_bpb; call "
                        "evaluate_bpb(model, ...) and report its result")
    elif measured is not None and "val_bpb" in metrics and not (
            isinstance(metrics["val_bpb"], (int, float))
            and abs(metrics["val_bpb"] - measured) <= 1e-9 * max(1.0, abs(measured))):
        problems.append(f"report(val_bpb={metrics['val_bpb']!r}) differs from what evaluate_bpb measured "
                        f"({measured:.6f}); report the measured value")
    if problems:
        _refuse(problems)
    if measured is not None:
        metrics["val_bpb"] = measured
    else:
        metrics.pop("val_bpb", None)  # scored by the harness, not here
    start = _STATE["train_start"] if _STATE["train_start"] is not None else _STATE["imported"]
    measured_s = (_STATE["eval_start"] or _clock()) - start
    claimed_s = metrics.get("training_seconds")
    metrics["training_seconds"] = max(measured_s, claimed_s if isinstance(claimed_s, (int, float)) else 0.0)
    _print_block(metrics)


def _print_block(metrics: dict) -> dict:
    figures = {k: float(f"{v:.6f}") if isinstance(v, float) else v for k, v in metrics.items()}
    print("---")
    for key, value in figures.items():
        print(f"{key}: {value:.6f}" if isinstance(value, float) else f"{key}: {value}")
    sys.stdout.flush()
    path = os.environ.get("HARNESS_RESULT_FILE")
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(figures, indent=2) + "\n")
        tmp.replace(path)
    return figures


# -----------------------------------------------------------------------------
# The saved model and the separate evaluation
#
# The model travels as torch.export's graph of ATen operators (JSON) plus its tensors
# (safetensors): the evaluator builds it from those without running any of train.py's Python.
# torch.export.load is not used: it unpickles parts of the archive, and unpickling runs code.
# What the evaluator reads is checked first (check_program): only ATen operators (none that
# touches files), fixed shapes, no guard code, no symbolic expressions, no custom objects; node
# metadata is dropped unread.

MODEL_DIR = "model"  # under HARNESS_OUTPUT_DIR
OPERATOR_OK = ("torch.ops.aten.", "_operator.getitem")
DENIED_OPERATORS = ("torch.ops.aten.from_file.", "torch.ops.aten.save.")  # ATen ops that read or write files
FORBIDDEN_ARGS = ("as_sym_int", "as_sym_ints", "as_sym_float", "as_sym_floats", "as_sym_bool", "as_sym_bools",
                  "as_graph", "as_custom_obj", "as_operator", "as_complex")


def save_model(model, seq_len: int, batch_size: int) -> Path | None:
    """Under the harness ($HARNESS_OUTPUT_DIR): export the model for input (batch_size, seq_len)
    and save it for the separate evaluation. Returns the folder, or None when run alone."""
    if OUTPUT_DIR is None:
        return None
    from safetensors.torch import save_file
    from torch._export.serde.serialize import serialize
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(batch_size, seq_len, dtype=torch.long, device=device),))
        program = program.run_decompositions(decomp_table={})  # functional: in-place ops rewritten, none decomposed
    model.train(was_training)
    tensors = {f"state_dict/{k}": v.detach().clone().contiguous() for k, v in program.state_dict.items()}
    for k, v in program.constants.items():
        if not isinstance(v, torch.Tensor):
            _fail(f"the model holds a constant {k!r} that is not a tensor; it cannot be saved for evaluation")
        tensors[f"constants/{k}"] = v.detach().clone().contiguous()
    folder = Path(OUTPUT_DIR) / MODEL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "program.json").write_bytes(serialize(program).exported_program)
    save_file(tensors, folder / "weights.safetensors")
    meta = {"seq_len": seq_len, "batch_size": batch_size, "device": device.type, "vocab_size": VOCAB_SIZE}
    (folder / "meta.json").write_text(json.dumps(meta) + "\n")
    return folder




def _keeps_state(target: str) -> bool:
    """Does the ATen operator `torch.ops.aten.NAME.OVERLOAD` mutate an argument (a buffer, kept
    between calls) or hand back memory as an earlier call left it (empty*, resize)? An operator
    this torch does not know counts as such."""
    name, _, overload = target[len(OPERATOR_OK[0]):].partition(".")
    op = getattr(getattr(torch.ops.aten, name, None), overload or "default", None)
    schema = getattr(op, "_schema", None)
    uninitialised = "empty" in name or name.lstrip("_").startswith("resize")  # empty*, new_empty*, resize
    return schema is None or schema.is_mutable or uninitialised


def check_program(program: dict) -> list:
    """Why this serialized program may not be loaded (empty: only ATen on fixed shapes)."""
    problems = []
    graph = program.get("graph_module", {}).get("graph", {})
    targets = {node.get("target") for node in graph.get("nodes", [])}
    bad = sorted(str(t) for t in targets if not (isinstance(t, str) and t.startswith(OPERATOR_OK[0]))
                 and t != OPERATOR_OK[1])
    if bad:
        problems.append(f"operators other than torch's ATen ops: {', '.join(bad[:5])}")
    io = sorted(str(t) for t in targets if isinstance(t, str) and t.startswith(DENIED_OPERATORS))
    if io:  # from_file could read the validation bytes off the disk during scoring
        problems.append(f"operators that read or write files: {', '.join(io)}")
    stateful = sorted(str(t) for t in targets if isinstance(t, str) and t.startswith(OPERATOR_OK[0]) and _keeps_state(t))
    if stateful:  # a model that remembers its calls could tell the causality probe from the scoring
        problems.append(f"operators that change tensors in place or return uninitialised memory (state kept "
                        f"between calls): {', '.join(stateful[:5])}; export a model whose forward has no "
                        f"side effects")
    outputs = program.get("graph_module", {}).get("signature", {}).get("output_specs", [])
    kinds = sorted({kind for spec in outputs for kind in spec if kind != "user_output"})
    if kinds:  # a buffer it writes back is state kept between calls
        problems.append(f"outputs other than the logits ({', '.join(kinds)}): the model changes its own tensors "
                        f"when called; export a model whose forward has no side effects")
    if program.get("range_constraints") or program.get("guards_code"):
        problems.append("dynamic shapes (guards or range constraints); export with fixed shapes")
    if any(graph.get(k) for k in ("sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")):
        problems.append("symbolic values or custom objects in the graph")
    stack = [graph.get("nodes", [])]
    while stack:  # every argument of every node, however nested
        item = stack.pop()
        if isinstance(item, dict):
            found = [k for k in item if k in FORBIDDEN_ARGS]
            if found:
                problems.append(f"an argument of kind {found[0]}")
                break
            stack.extend(v for k, v in item.items() if k != "metadata")
        elif isinstance(item, list):
            stack.extend(item)
    return problems


def load_model(folder: Path, device):
    """The saved model as a callable that runs its graph's ATen calls, and its (batch_size, seq_len);
    nothing it holds runs as Python."""
    from safetensors.torch import load_file
    meta = json.loads((folder / "meta.json").read_text())
    program = json.loads((folder / "program.json").read_text())
    problems = check_program(program)
    if problems:
        _refuse(["the saved model cannot be evaluated safely: " + "; ".join(problems)])
    tensors = load_file(str(folder / "weights.safetensors"), device=str(device))
    split = {prefix: {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
             for prefix in ("state_dict/", "constants/")}
    try:
        module = AtenProgram(program, split["state_dict/"], split["constants/"])
    except Unsafe as e:
        _refuse([f"the saved model cannot be evaluated safely: {e}"])
    return module, int(meta["batch_size"]), int(meta["seq_len"])


class Unsafe(ValueError):
    """A part of a saved program the evaluator does not run (an input, argument or output kind)."""


class AtenProgram:
    """A checked program (check_program) run node by node: each node one ATen operator called on the
    tensors named by its inputs and the literals it holds, in the graph's order, on fresh values in
    every call (only the weights are shared, and no operator may change them).

    Written here rather than loaded with torch's deserializer, which imports torch's compiler stack
    (a second or more of every evaluation) and turns the graph into Python source that it then
    runs. Here no code is made from what the job saved: an input, an argument or an output of a
    kind not listed below is refused at load, before any call."""

    def __init__(self, program: dict, state: dict, constants: dict):
        module = program["graph_module"]
        graph = module["graph"]
        self.inputs = []  # (name, tensor), None for the model's input
        for spec in module["signature"]["input_specs"]:
            (kind, value), = spec.items()
            arg = value["arg"]
            name = arg["as_tensor"]["name"] if "as_tensor" in arg else arg["name"]
            if kind == "parameter":
                self.inputs.append((name, state[value["parameter_name"]]))
            elif kind == "buffer":  # a non-persistent buffer is saved with the constants
                key = value["buffer_name"]
                self.inputs.append((name, state[key] if key in state else constants[key]))
            elif kind == "tensor_constant":
                self.inputs.append((name, constants[value["tensor_constant_name"]]))
            elif kind == "user_input":
                self.inputs.append((name, None))
            else:
                raise Unsafe(f"an input of kind {kind}")
        if [t for _, t in self.inputs].count(None) != 1:
            raise Unsafe("a model must take exactly one input (the bytes)")
        known = {name for name, _ in self.inputs}
        self.nodes = []  # (operator, positional, keyword, output names, names let go after it)
        for node in graph["nodes"]:
            if not str(node["target"]).startswith(OPERATOR_OK[0]):
                raise Unsafe(f"a node that calls {str(node['target'])[:60]}, not an ATen operator")
            name, _, overload = node["target"][len(OPERATOR_OK[0]):].partition(".")
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
            args, kwargs = [], {}
            for item in node["inputs"]:
                decoded = _argument(item["arg"], known)
                if item.get("kind", 1) == 1:
                    args.append(decoded)
                else:
                    kwargs[item["name"]] = decoded
            outputs = _outputs(node["outputs"])
            known.update(n for n in outputs if n)
            self.nodes.append((op, args, kwargs, outputs, []))
        out = graph["outputs"]
        if len(out) != 1 or set(out[0]) != {"as_tensor"} or out[0]["as_tensor"]["name"] not in known:
            raise Unsafe("a model must return one tensor (the logits)")
        self.output = out[0]["as_tensor"]["name"]
        # each value is let go after the last node that reads it (as torch's generated code does), so
        # a call holds the tensors still needed, not every one it made
        last = {}
        for i, (_, args, kwargs, outputs, _) in enumerate(self.nodes):
            for name in [*outputs, *_names([*args, *kwargs.values()])]:
                last[name] = i
        for name, i in last.items():
            if name and name != self.output and name not in dict(self.inputs):
                self.nodes[i][4].append(name)

    def __call__(self, x):
        env = {name: x if tensor is None else tensor for name, tensor in self.inputs}
        fetch = lambda v: env[v[1]] if type(v) is _Ref else [fetch(u) for u in v] if type(v) is list else v  # noqa: E731
        for op, args, kwargs, outputs, done in self.nodes:
            result = op(*[fetch(a) for a in args], **{k: fetch(v) for k, v in kwargs.items()})
            if isinstance(outputs, _Many):  # a sequence of results (none, for an assertion)
                for name, value in zip(outputs, result or (), strict=True):
                    if name:
                        env[name] = value
            else:
                env[outputs[0]] = result
            for name in done:
                env.pop(name, None)
        return env[self.output]


class _Ref(tuple):
    """("ref", name): a tensor the graph made or took as input."""


def _names(values) -> list:
    """The tensor names decoded arguments refer to."""
    found = []
    for v in values:
        if type(v) is _Ref:
            found.append(v[1])
        elif type(v) is list:
            found += _names(v)
    return found


class _Many(list):
    """A node's outputs that come as a sequence (a split, an operator with several results)."""


@functools.lru_cache(maxsize=1)
def _literal_tables():
    from torch._export.serde.schema import Layout, MemoryFormat, ScalarType  # the format's tags (no compiler import)
    dtypes = {"BYTE": torch.uint8, "CHAR": torch.int8, "SHORT": torch.int16, "INT": torch.int32, "LONG": torch.int64,
              "HALF": torch.float16, "FLOAT": torch.float32, "DOUBLE": torch.float64, "BOOL": torch.bool,
              "BFLOAT16": torch.bfloat16}
    formats = {"ContiguousFormat": torch.contiguous_format, "ChannelsLast": torch.channels_last,
               "ChannelsLast3d": torch.channels_last_3d, "PreserveFormat": torch.preserve_format}
    return ({int(ScalarType[k]): v for k, v in dtypes.items()}, {int(MemoryFormat[k]): v for k, v in formats.items()},
            {int(Layout.Strided): torch.strided})


def _argument(arg: dict, known: set):
    """One node input, decoded: a _Ref to a tensor, a list of them, or a literal; else Unsafe."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise Unsafe("an argument that is not one tagged value")
    (kind, value), = arg.items()

    def ref(t):
        if not isinstance(t, dict) or t.get("name") not in known:
            raise Unsafe("an argument that names no tensor made before it")
        return _Ref(("ref", t["name"]))

    if kind == "as_tensor":
        return ref(value)
    if kind == "as_tensors":
        return [ref(t) for t in value]
    if kind == "as_optional_tensors":
        return [ref(t["as_tensor"]) if "as_tensor" in t else None for t in value]
    if kind == "as_none":
        return None
    if kind.rstrip("s") in LITERAL_KINDS:  # one literal, or a list of them for the plural kind
        plural = kind != kind.rstrip("s")
        items = value if plural and isinstance(value, list) else [value] if not plural else None
        if items is not None:
            # the format writes a non-finite float as a string
            items = [NON_FINITE.get(v, v) if kind.startswith("as_float") and isinstance(v, str) else v for v in items]
            if all(LITERAL_KINDS[kind.rstrip("s")](v) for v in items):
                return items if plural else items[0]
    tables = dict(zip(("as_scalar_type", "as_memory_format", "as_layout"), _literal_tables()))
    if kind in tables and isinstance(value, int) and value in tables[kind]:
        return tables[kind][value]
    if kind == "as_device" and isinstance(value, dict) and value.get("type") in ("cpu", "cuda") \
            and isinstance(value.get("index"), (int, type(None))):
        return torch.device(value["type"], value.get("index"))
    raise Unsafe(f"an argument of kind {kind} ({str(value)[:60]})")


LITERAL_KINDS = {  # kind (as_ints: a list of as_int) -> what its value may be
    "as_int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "as_float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "as_bool": lambda v: isinstance(v, bool),
    "as_string": lambda v: isinstance(v, str),
}
NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _outputs(outputs: list) -> list:
    """The names a node's results are bound to (None: a result not used)."""
    if len(outputs) == 1 and set(outputs[0]) == {"as_tensor"}:
        return [outputs[0]["as_tensor"]["name"]]
    if len(outputs) == 1 and set(outputs[0]) == {"as_tensors"}:
        return _Many(t["name"] for t in outputs[0]["as_tensors"])
    names = _Many()
    for out in outputs:
        if set(out) == {"as_tensor"}:
            names.append(out["as_tensor"]["name"])
        elif set(out) == {"as_none"}:
            names.append(None)
        else:
            raise Unsafe(f"an output of kind {', '.join(out)}")
    return names


def evaluate_saved(output_dir: Path, split: str = "val") -> dict:
    """The harness's separate evaluation: score the model a training job saved, on the validation
    bytes (or, split "test", once on the test bytes: the figure is written under the metric's name,
    the contract of evaluate_command)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and 0 < GPU_MEMORY_FRACTION < 1:  # the training job beside it keeps the rest
        torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_FRACTION, device)
    folder = output_dir / MODEL_DIR
    if not (folder / "program.json").exists():
        _refuse([f"the job saved no model in {MODEL_DIR}/ of HARNESS_OUTPUT_DIR: train.py must call "
                 f"save_model(model, SEQ_LEN, BATCH_SIZE) after training"])
    try:
        module, batch_size, seq_len = load_model(folder, device)
    except Exception as e:  # noqa: BLE001 - whatever the job saved, a file that does not load is refused
        _refuse([f"the saved model cannot be loaded: {type(e).__name__}: {str(e)[:300]}"])
    _STATE["in_eval"] = _STATE["in_test"] = split == "val", split == "test"
    val = load_split(split, device)
    _STATE["in_eval"] = _STATE["in_test"] = False
    try:
        bpb, causal = score(module, val, seq_len, batch_size, device)
    except NotFinite as e:
        _refuse([str(e)])
    except Exception as e:  # noqa: BLE001
        _refuse([f"the saved model failed on input of shape ({batch_size}, {seq_len}): {str(e)[:300]}"])
    if not causal:
        _refuse([NOT_CAUSAL])
    return _print_block({"val_bpb": bpb, "eval_seq_len": seq_len, "eval_batch_size": batch_size})


# -----------------------------------------------------------------------------
# Preparing a dataset from local files

def _documents(path: Path):
    """Yield the documents (bytes) of a .txt file, a folder of .txt files, or parquet file(s)."""
    if path.is_dir():
        files = sorted(path.glob("*.parquet")) or sorted(path.glob("*.txt"))
        if not files:
            _fail(f"{path} holds no .txt or .parquet files")
    elif path.exists():
        files = [path]
    else:
        _fail(f"{path} does not exist")
    for file in files:
        if file.suffix != ".parquet":
            yield file.read_bytes()
            continue
        import pyarrow.parquet as pq  # only needed for parquet corpora
        pf = pq.ParquetFile(file)
        if "text" not in pf.schema_arrow.names:
            _fail(f"{file} has no `text` column (columns: {pf.schema_arrow.names})")
        for i in range(pf.num_row_groups):  # row group by row group keeps memory flat
            for text in pf.read_row_group(i, columns=["text"]).column("text").to_pylist():
                yield text.encode("utf-8")


def prepare_dataset(sources: list[Path], name: str) -> dict:
    """Concatenate the documents, hold out the last bytes for validation and those before them for
    the test split, and cache the three splits."""
    folder = CACHE_DIR / "datasets" / name
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "all.bin.tmp"
    with open(tmp, "wb") as out:
        first = True
        for source in sources:
            for doc in _documents(Path(source)):
                out.write(doc if first else DOC_SEPARATOR + doc)
                first = False
    total = tmp.stat().st_size
    if total < MIN_DATASET_BYTES:
        tmp.unlink()
        _fail(f"{name}: {total:,} bytes of text, need at least {MIN_DATASET_BYTES:,}")
    val_bytes, test_bytes = min(VAL_BYTES, total // 10), min(TEST_BYTES, total // 10)
    with open(tmp, "r+b") as f:  # split by cutting the tail off, so no second copy of the corpus
        f.seek(total - val_bytes)
        (folder / "val.bin").write_bytes(f.read())
        f.seek(total - val_bytes - test_bytes)
        (folder / "test.bin").write_bytes(f.read(test_bytes))
        f.truncate(total - val_bytes - test_bytes)
    tmp.replace(folder / "train.bin")
    meta = {"name": name, "sources": [str(s) for s in sources], "vocab_size": VOCAB_SIZE,
            "train_bytes": total - val_bytes - test_bytes, "val_bytes": val_bytes, "test_bytes": test_bytes,
            "train_sha256": _sha256_file(folder / "train.bin"), "val_sha256": _sha256_file(folder / "val.bin"),
            "test_sha256": _sha256_file(folder / "test.bin")}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# -----------------------------------------------------------------------------
# Downloading a public corpus (stdlib HTTP, resumable)

def download(url: str, dest: Path, sha256: str | None = None) -> Path:
    """Fetch url to dest, resuming a leftover dest.part with an HTTP Range request."""
    if dest.exists():
        if sha256 is None or _sha256_file(dest) == sha256:
            return dest
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            resumed = response.status == 206  # a server that ignores Range answers 200: start over
            with open(part, "ab" if resumed else "wb") as out:
                while block := response.read(CHUNK):
                    out.write(block)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the .part is not a prefix of this file (or is all of it): start over
            part.unlink()
            return download(url, dest, sha256)
        _fail(f"download of {url} failed ({e})")
    except OSError as e:  # connection errors and timeouts; the .part file stays for the next try
        _fail(f"download of {url} failed ({e}); run the same command again to resume")
    if sha256 is not None and (got := _sha256_file(part)) != sha256:
        part.unlink()
        _fail(f"{url}: sha256 {got}, expected {sha256}; the partial file was deleted, run again")
    part.replace(dest)
    return dest


def download_dataset(name: str, urls: list[str], sha256s: list[str | None]) -> dict:
    folder = CACHE_DIR / "downloads" / name
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for url, sha256 in zip(urls, sha256s):
        print(f"downloading {url}", file=sys.stderr)
        files.append(download(url, folder / url.rsplit("/", 1)[-1], sha256))
    return prepare_dataset(files, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a .txt file, a folder of .txt files, or parquet file(s)")
    parser.add_argument("--download", metavar="NAME", help=f"fetch a corpus: {', '.join(DOWNLOADS)} "
                        "(any NAME with --url)")
    parser.add_argument("--name", help="dataset name (default: the file or folder name, or the download NAME)")
    parser.add_argument("--url", action="append", default=[], help="download these URLs instead (repeatable)")
    parser.add_argument("--sha256", action="append", default=[], help="checksum of each --url, in order")
    parser.add_argument("--base-url", help="fetch the registry's files from this base URL (a mirror)")
    parser.add_argument("--export-train", nargs="?", const="", metavar="DIR",
                        help="write the training split alone to DIR (default $HARNESS_OUTPUT_DIR)")
    parser.add_argument("--evaluate", action="store_true", help="score the model in $HARNESS_OUTPUT_DIR")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="with --evaluate: the split to score (test: the private test split)")
    args = parser.parse_args()
    if args.split != "val" and not args.evaluate:
        _fail("--split goes with --evaluate: python prepare.py --evaluate --split test")
    if args.evaluate:
        if OUTPUT_DIR is None:
            _fail("--evaluate scores the model in $HARNESS_OUTPUT_DIR; set it to the training job's output folder")
        evaluate_saved(Path(OUTPUT_DIR), args.split)
        return
    if args.export_train is not None:
        dest = args.export_train or OUTPUT_DIR
        if not dest:
            _fail("--export-train needs a DIR (or $HARNESS_OUTPUT_DIR)")
        meta = export_train(Path(dest))
        print(f"exported {meta['train_bytes']:,} training bytes of {meta['dataset']!r} to {dest}")
        return
    if args.data:
        meta = prepare_dataset([args.data], args.name or args.data.stem)
    elif args.download:
        if args.url:
            urls, sha256s = args.url, args.sha256 + [None] * (len(args.url) - len(args.sha256))
        elif args.download in DOWNLOADS:
            urls, sha256s = map(list, zip(*DOWNLOADS[args.download]))
            if args.base_url:
                urls = [f"{args.base_url.rstrip('/')}/{u.rsplit('/', 1)[-1]}" for u in urls]
        else:
            _fail(f"unknown corpus {args.download!r}; known: {', '.join(DOWNLOADS)} (or give --url)")
        meta = download_dataset(args.name or args.download, urls, sha256s)
    else:
        train, val, test = _load_bundled()
        print(f"bundled corpus OK: {len(train):,} train bytes, {len(val):,} val bytes, {len(test):,} test bytes")
        return
    print(f"prepared {meta['name']!r}: {meta['train_bytes']:,} train bytes, {meta['val_bytes']:,} val bytes, "
          f"{meta['test_bytes']:,} test bytes "
          f"in {CACHE_DIR / 'datasets' / meta['name']}")
    print(f"use it with: HARNESS_DATASET={meta['name']} python train.py")


# Everything the evaluation depends on, as it was at import (see _integrity_problems).
_PRISTINE = {name: (dict(value) if isinstance(value, dict) else value) for name, value in globals().items()
             if (name.isupper() and not name.startswith("_"))
             or name in ("_clock", "load_split", "get_batch", "evaluate_bpb", "report",
                         "_load_bundled", "_load_prepared", "_load_corpus", "_integrity_problems", "_is_causal", "_refuse", "score",
                         "_windows", "_losses", "_finite", "NotFinite",
                         "_same")}
_CROSS_ENTROPY, _LOG = F.cross_entropy, math.log


if __name__ == "__main__":
    main()
