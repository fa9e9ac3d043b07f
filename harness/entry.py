"""The `harness` command's entry: a Ctrl-C in its first second (while the CLI's modules import,
before the run's own handlers exist, driver/signals.py's interrupts) ends it with one line and 130, never a
traceback; then the CLI (cli/) takes over."""
from __future__ import annotations

import os
import signal

EARLY = "harness: interrupted while starting; nothing was changed\n"


def _early(signum, frame) -> None:
    os.write(2, EARLY.encode())
    os._exit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGINT, _early)
    from .cli import main as cli
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cli()
