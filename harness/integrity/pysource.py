"""Python source parsed and compiled one at a time across the harness's threads.

CPython 3.11 (seen on 3.11.7) keeps the AST validator's recursion depth in state that threads
share: two lanes' workers that parse or compile candidates at once can fail with "SystemError: AST
constructor recursion depth mismatch" (seen in the suite, two lanes with pipelining). Every ast.parse and compile of a candidate's source goes through this lock."""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes) -> ast.Module:
    with _LOCK:
        return ast.parse(source)


def compile_check(source: str | bytes, path: str) -> None:
    """Raises SyntaxError/ValueError when source does not compile."""
    with _LOCK:
        compile(source, path, "exec", dont_inherit=True)
