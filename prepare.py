"""
The fixed part of the workload: data, tokenizer, time budget, evaluation, result reporting.
The researcher may never change this file; train.py imports it.

    python prepare.py                            # check the bundled corpus and print its split
    python prepare.py --data PATH [--name NAME]  # a .txt file, a folder of .txt, or parquet (`text` column)
    python prepare.py --download NAME            # fetch a public parquet corpus (see DOWNLOADS)

Then select a prepared dataset with HARNESS_DATASET=NAME (default: the bundled shakespeare).

Tokens are raw bytes (vocab 256), so the cross-entropy converts to bits per byte exactly,
and any model, tokenizer trick or not, is judged on the same bytes.
"""

import argparse
import hashlib
import hmac
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

# The seal key must be gone from the environment before train.py's own code runs:
# train.py imports this module first, so popping it here hides it from os.environ.
# The harness passes it through a pipe (HARNESS_SEAL_FD), which can be read only once and
# never shows in /proc/self/environ; HARNESS_SEAL_KEY is the plain variant for other callers.


def _take_seal_key():
    key, fd = os.environ.pop("HARNESS_SEAL_KEY", None), os.environ.pop("HARNESS_SEAL_FD", None)
    if fd is None:
        return key, False
    try:
        with os.fdopen(int(fd), "rb") as pipe:
            data = pipe.read(4096).decode().strip()
    except (OSError, ValueError):
        data = ""
    return data or None, not data  # an empty pipe: someone read the key before this module


_SEAL_KEY, _SEAL_STOLEN = _take_seal_key()
_clock = time.monotonic  # bound now: rebinding time.monotonic later does not move this clock
# What this module measured itself; report() signs these, not what its caller claims.
_STATE = {"imported": _clock(), "train_start": None, "eval_start": None, "val_bpb": None,
          "in_eval": False, "val_outside_eval": False}

# -----------------------------------------------------------------------------
# The rules of the game

TIME_BUDGET = float(os.environ.get("HARNESS_TIME_BUDGET", "300"))  # seconds of training steps
MAX_STEPS = int(os.environ["HARNESS_MAX_STEPS"]) if os.environ.get("HARNESS_MAX_STEPS") else None  # optimizer steps
SEED = int(os.environ.get("HARNESS_SEED", "42"))  # for init and batch order
DATASET = os.environ.get("HARNESS_DATASET", "shakespeare")  # "shakespeare" = the bundled corpus
VOCAB_SIZE = 256  # bytes
VAL_BYTES = 524_288  # tail of the corpus held out for validation (at most a tenth of it)
EVAL_BYTES = {"cpu": 32_768, "cuda": 524_288}  # bytes scored by evaluate_bpb, fixed per device type
MIN_DATASET_BYTES = 100_000  # smaller corpora make the metric meaningless
DOC_SEPARATOR = b"\x00"  # between documents of a folder or parquet corpus; never occurs in text

# -----------------------------------------------------------------------------
# The bundled corpus, pinned by hash (see scripts/build_data.py and data/shakespeare.sha256)

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_XZ = DATA_DIR / "shakespeare.txt.xz"
BUNDLED_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"  # of the decompressed text
BUNDLED_VAL_SHA256 = "284886ad23e0cd7583eb03c2046a31440457ba716e709ce40b2f88a64524baef"  # of its last VAL_BYTES
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

def _load_bundled() -> tuple[bytes, bytes]:
    if not BUNDLED_XZ.exists():
        _fail(f"{BUNDLED_XZ} is missing. {REBUILD_HINT}")
    try:
        text = lzma.decompress(BUNDLED_XZ.read_bytes())
    except lzma.LZMAError as e:
        _fail(f"{BUNDLED_XZ} is corrupt ({e}). {REBUILD_HINT}")
    digest = hashlib.sha256(text).hexdigest()
    if digest != BUNDLED_SHA256:
        _fail(f"{BUNDLED_XZ} has sha256 {digest} after decompression, expected {BUNDLED_SHA256}. {REBUILD_HINT}")
    train, val = text[:-VAL_BYTES], text[-VAL_BYTES:]
    if hashlib.sha256(val).hexdigest() != BUNDLED_VAL_SHA256:  # VAL_BYTES was changed: the metric would be too
        _fail("the validation split of the bundled corpus changed; restore prepare.py")
    return train, val


def _load_prepared(name: str) -> tuple[bytes, bytes]:
    folder = CACHE_DIR / "datasets" / name
    if not (folder / "meta.json").exists():
        _fail(f"dataset {name!r} is not prepared in {folder}. "
              f"Run: python prepare.py --data PATH --name {name}  (or --download {name})")
    meta = json.loads((folder / "meta.json").read_text())
    splits = []
    for split in ("train", "val"):
        data = (folder / f"{split}.bin").read_bytes()
        if hashlib.sha256(data).hexdigest() != meta[f"{split}_sha256"]:
            _fail(f"{folder / f'{split}.bin'} does not match meta.json. Prepare the dataset {name!r} again.")
        splits.append(data)
    return splits[0], splits[1]


_SPLITS: dict = {}  # (split, device) -> uint8 tensor, loaded once per process


def load_split(split: str, device="cpu") -> torch.Tensor:
    """The bytes of `split` ("train" or "val") of the selected dataset, as a uint8 tensor on `device`."""
    if split == "val" and not _STATE["in_eval"]:
        _STATE["val_outside_eval"] = True  # only evaluate_bpb may read the validation bytes
    if not _SPLITS:  # first use: load and verify the corpus once
        train, val = _load_bundled() if DATASET == "shakespeare" else _load_prepared(DATASET)
        _SPLITS[("train", "cpu")] = torch.frombuffer(bytearray(train), dtype=torch.uint8)
        _SPLITS[("val", "cpu")] = torch.frombuffer(bytearray(val), dtype=torch.uint8)
        _SPLITS["val_sha256"] = hashlib.sha256(val).hexdigest()
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
    The result is kept here too: report() signs this value, not the one it is handed."""
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
    n = min(EVAL_BYTES[device.type], len(val) - 1)  # the same bytes are scored whatever seq_len is
    was_training = model.training
    model.eval()
    total_nats = 0.0
    starts = list(range(0, n, seq_len))
    full = [s for s in starts if s + seq_len <= n]
    groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
    groups += [[s] for s in starts if s + seq_len > n]  # the short window at the end, if any
    for group in groups:
        length = min(seq_len, n - group[0])
        idx = torch.tensor(group, device=device)[:, None] + torch.arange(length + 1, device=device)
        window = val[idx].long()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), window[:, 1:].reshape(-1), reduction="sum")
        total_nats += loss.item()
    if not _is_causal(model, val, min(seq_len, n)):
        _refuse(["the model's prediction for a byte depends on later bytes (it is not causal), so it "
                 "sees the answers; keep attention causal (is_causal=True)"])
    model.train(was_training)
    bpb = total_nats / n / math.log(2)
    _STATE["val_bpb"] = bpb
    return bpb


@torch.no_grad()
def _is_causal(model, val, seq_len: int) -> bool:
    """Changing the second half of a window must not change the predictions in its first half.
    A causal model gives identical numbers (same shapes, same kernels); a model that looks
    ahead differs by far more than the tolerance after even a few steps (~1e-3 after 3 CPU steps)."""
    if seq_len < 2:
        return True
    half = seq_len // 2
    x = val[:seq_len].long()[None]
    y = x.clone()
    y[0, half:] = (y[0, half:] + 1) % VOCAB_SIZE
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
        a, b = model(x).float(), model(y).float()
    tolerance = 1e-5 if x.device.type == "cpu" else 1e-2 * (1.0 + a.abs().max().item())  # bf16 on GPUs
    return (a[:, :half] - b[:, :half]).abs().max().item() <= tolerance


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
    to $HARNESS_RESULT_FILE, sealed with an HMAC when the harness gave a seal key.

    val_bpb is the value evaluate_bpb measured (a different one is refused), and training_seconds
    is at least this module's own clock: from the first touch of the training data to the
    evaluation."""
    problems = _integrity_problems()
    if _SEAL_STOLEN:
        problems.append("the seal key's pipe was read before prepare.py could read it; train.py must "
                        "not touch HARNESS_SEAL_FD")
    measured = _STATE["val_bpb"]
    if measured is None:
        problems.append("report() was called but evaluate_bpb never measured val_bpb; call "
                        "evaluate_bpb(model, ...) and report its result")
    elif "val_bpb" in metrics and not (isinstance(metrics["val_bpb"], (int, float))
                                       and abs(metrics["val_bpb"] - measured) <= 1e-9 * max(1.0, abs(measured))):
        problems.append(f"report(val_bpb={metrics['val_bpb']!r}) differs from what evaluate_bpb measured "
                        f"({measured:.6f}); report the measured value")
    if problems:
        _refuse(problems)
    metrics["val_bpb"] = measured
    start = _STATE["train_start"] if _STATE["train_start"] is not None else _STATE["imported"]
    measured_s = _STATE["eval_start"] - start
    claimed_s = metrics.get("training_seconds")
    metrics["training_seconds"] = max(measured_s, claimed_s if isinstance(claimed_s, (int, float)) else 0.0)
    figures = {k: float(f"{v:.6f}") if isinstance(v, float) else v for k, v in metrics.items()}
    print("---")
    for key, value in figures.items():
        print(f"{key}: {value:.6f}" if isinstance(value, float) else f"{key}: {value}")
    sys.stdout.flush()
    path = os.environ.get("HARNESS_RESULT_FILE")
    if path:
        sealed = dict(figures)
        if _SEAL_KEY:
            canonical = json.dumps(figures, sort_keys=True, separators=(",", ":"))
            sealed["seal"] = hmac.new(_SEAL_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(sealed, indent=2) + "\n")
        tmp.replace(path)


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
    """Concatenate the documents, hold out the last bytes for validation, and cache both splits."""
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
    val_bytes = min(VAL_BYTES, total // 10)
    with open(tmp, "r+b") as f:  # split by cutting the tail off, so no second copy of the corpus
        f.seek(total - val_bytes)
        (folder / "val.bin").write_bytes(f.read())
        f.truncate(total - val_bytes)
    tmp.replace(folder / "train.bin")
    meta = {"name": name, "sources": [str(s) for s in sources], "vocab_size": VOCAB_SIZE,
            "train_bytes": total - val_bytes, "val_bytes": val_bytes,
            "train_sha256": _sha256_file(folder / "train.bin"), "val_sha256": _sha256_file(folder / "val.bin")}
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
    args = parser.parse_args()
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
        train, val = _load_bundled()
        print(f"bundled corpus OK: {len(train):,} train bytes, {len(val):,} val bytes")
        return
    print(f"prepared {meta['name']!r}: {meta['train_bytes']:,} train bytes, {meta['val_bytes']:,} val bytes "
          f"in {CACHE_DIR / 'datasets' / meta['name']}")
    print(f"use it with: HARNESS_DATASET={meta['name']} python train.py")


# Everything the evaluation depends on, as it was at import (see _integrity_problems).
_PRISTINE = {name: (dict(value) if isinstance(value, dict) else value) for name, value in globals().items()
             if (name.isupper() and not name.startswith("_"))
             or name in ("_SEAL_KEY", "_clock", "load_split", "get_batch", "evaluate_bpb", "report",
                         "_load_bundled", "_load_prepared", "_integrity_problems", "_is_causal", "_refuse",
                         "_same")}
_CROSS_ENTROPY, _LOG = F.cross_entropy, math.log


if __name__ == "__main__":
    main()
