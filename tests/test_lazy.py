"""harness.lazy: a module loaded on first use is whole for every reader, whichever thread reads
it first and even when a Ctrl-C lands in the middle of its import."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from harness.cli.lazy import lazy_function, lazy_module


@pytest.fixture
def modules(tmp_path: Path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name
    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_threads_reading_a_module_at_once_all_see_it_whole(modules):
    """The driver's threads (a job's executor, the researcher, the monitor) may touch one lazy module
    together: none sees it half imported."""
    name = modules("lazy_slow", "import time\ntime.sleep(0.5)\nvalue = 42\n")
    mod = lazy_module(name)
    seen: list[object] = []
    start = threading.Barrier(8)

    def read():
        start.wait()
        try:
            seen.append(mod.value)
        except Exception as e:  # noqa: BLE001 - the failure under test
            seen.append(e)
    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen == [42] * 8


def test_an_import_interrupted_by_ctrl_c_is_imported_again_on_the_next_read(modules, tmp_path):
    marker = tmp_path / "interrupted-once"
    name = modules("lazy_interrupted", f"import pathlib\nm = pathlib.Path({str(marker)!r})\n"
                   "if not m.exists():\n    m.touch()\n    raise KeyboardInterrupt\nvalue = 7\n")
    mod = lazy_module(name)
    with pytest.raises(KeyboardInterrupt):
        mod.value
    assert mod.value == 7


def test_a_module_that_does_not_exist_is_named_at_once():
    with pytest.raises(ImportError, match="no_such_module_here"):
        lazy_module("no_such_module_here")


def test_a_lazy_function_imports_its_module_at_the_first_call(modules):
    name = modules("lazy_func", "def double(x):\n    return 2 * x\n")
    double = lazy_function(name, "double")
    assert name not in sys.modules
    assert double(21) == 42 and double.__name__ == "double"
