"""A static check of the proposed diff: the lines a proposal adds, read for known cheats.

Runtime checks (the seal, prepare.py's integrity checks, protected hashes, the budget) catch
what a cheat does; this layer catches what runtime cannot see or would only see after a
training run: reading the seal key, patching the evaluation, reading the data files or the
validation split directly, setting HARNESS_* variables, printing a result block. It reads
only added lines, so the baseline's own code is never held against a proposal. Pure
functions on strings; every message says what to do instead, so an LLM can act on it.
"""
from __future__ import annotations

import difflib
import re

FIXED = "the data, time budget and evaluation in prepare.py are fixed; improve the model or training in train.py"

# (pattern, what it is) over one added line, comments stripped. RULES hold for every workload;
# SEALED_RULES only where prepare.py seals the result (the bundled kind), whose train.py gets
# everything from prepare: there, reading data files, the val split or HARNESS_* is a cheat,
# while a foreign train.py may have to do those things itself.
SEALED_RULES: tuple[tuple[str, str], ...] = (
    (r"HARNESS_\w*", "reads or sets a HARNESS_* variable; use TIME_BUDGET, MAX_STEPS and SEED from prepare"),
    (r"\bdata/|\.xz\b|\blzma\b|\bshakespeare\b|\b(DATA_DIR|BUNDLED_\w+|CACHE_DIR|_SPLITS|_load_bundled|_load_prepared|_STATE)\b|\b(train|val)\.bin\b",
     "reads the dataset files or prepare's caches directly; get training data through get_batch('train', ...)"),
    (r"""(load_split|get_batch)\s*\(\s*(split\s*=\s*)?['"]val['"]|['"]val['"]""",
     "uses the validation split; train and tune on 'train' only, the harness scores validation once"),
)
RULES: tuple[tuple[str, str], ...] = (
    (r"(?i)seal", "refers to the result seal (HARNESS_SEAL_*, prepare's seal key); results are sealed by prepare.py only"),
    (r"/proc/(self|\d+|\{)|/proc/['\"]", "reads process internals (/proc/self/environ, /proc/<pid>/...)"),
    (r"\bos\.environ\s*\[\s*['\"]HARNESS_\w*['\"]\s*\]\s*=[^=]", "sets a HARNESS_* variable; the harness sets those"),
    (r"\bputenv\b|\bos\.environ\s*\.\s*(update|setdefault|pop|clear)\b|\bos\.environ\s*\[[^\]]*\]\s*=[^=]",
     "changes the environment of the training job"),
    (r"\bsetattr\s*\(|\bdelattr\s*\(|__dict__|\bvars\s*\(|__closure__|__globals__|__code__|\bgc\s*\.\s*get_(objects|referents|referrers)",
     "reaches into other modules' internals (setattr, __dict__, __closure__, gc); it looks like patching the evaluation"),
    (r"sys\s*\.\s*modules|importlib\s*\.\s*reload|\b__import__\s*\(", "swaps or reloads modules at run time"),
    (r"\b(time|torch\.nn\.functional|F|math|builtins|torch)\s*\.\s*\w+\s*=[^=]",
     "replaces a library function (a clock, cross_entropy, ...) that the evaluation relies on"),
)


def _strip_comment(line: str) -> str:
    # good enough for a check: a '#' outside quotes starts a comment
    out, quote = [], None
    for ch in line:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            break
        out.append(ch)
    return "".join(out)


def added_lines(old: str, new: str) -> list[tuple[int, str]]:
    """(line number in new, text) of the lines new adds to old."""
    out = []
    matcher = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    new_lines = new.splitlines()
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            out += [(j + 1, new_lines[j]) for j in range(j1, j2)]
    return out


def module_aliases(source: str, module: str = "prepare") -> set[str]:
    """The names under which source can reach `module` itself (import prepare [as p])."""
    names = set()
    for m in re.finditer(r"^\s*import\s+(.+)$", source, re.M):
        for part in m.group(1).split(","):
            bits = part.split()
            if bits and bits[0] == module:
                names.add(bits[2] if len(bits) == 3 and bits[1] == "as" else module)
    return names


def problems(path: str, old: str, new: str, metric: str = "val_bpb", protected_module: str = "prepare",
             sealed: bool = True) -> list[str]:
    """What the lines that new adds to old (one editable file) do that a proposal may not.

    sealed: the workload's result is sealed by prepare.py (the stricter rules apply, and
    printing a result block is a forgery rather than the workload's contract)."""
    found = []
    aliases = module_aliases(new, protected_module)
    rules = list(RULES) + (list(SEALED_RULES) if sealed else [])
    if aliases:
        alt = "|".join(re.escape(a) for a in sorted(aliases))
        rules.append((rf"\b({alt})\s*\.\s*\w+(\s*\[[^\]]*\])?\s*(=|\+=|-=|\*=)[^=]",
                      f"assigns to an attribute of {protected_module} (monkeypatching the evaluation)"))
    if sealed:
        rules.append((rf"""['"][^'"]*\b{re.escape(metric)}\s*:|print\s*\(\s*['"]---['"]""",
                      f"prints a result block ({metric}: ...); only prepare.report() reports results"))
    for lineno, raw in added_lines(old, new):
        line = _strip_comment(raw)
        for pattern, what in rules:
            if re.search(pattern, line):
                found.append(f"{path}:{lineno}: `{raw.strip()[:80]}` {what}")
                break
    return found


def explain(found: list[str]) -> str:
    """One message for the ledger and the next prompt."""
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return "policy: " + "; ".join(found[:3]) + more + f". {FIXED}."
