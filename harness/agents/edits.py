"""SEARCH/REPLACE edit blocks: parse a model's answer and apply it to file contents.

Pure functions on strings. Their error text goes back to the model in a repair turn, so
it says exactly what failed and how to fix it (the idea of aider's edit blocks).

The format, per change:

    train.py
    <<<<<<< SEARCH
    lines copied exactly from the current file
    =======
    the new lines
    >>>>>>> REPLACE

An empty SEARCH section replaces the whole file. The last line of the answer outside
the blocks is the one-line description of the change.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

SEARCH_RE = re.compile(r"^\s*<{5,9} ?SEARCH\s*$")
DIVIDER_RE = re.compile(r"^\s*={5,9}\s*$")
REPLACE_RE = re.compile(r"^\s*>{5,9} ?REPLACE\s*$")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
HINT_MIN_RATIO = 0.6  # similarity above which the closest lines are shown as a hint
MAX_HINT_LINES = 30

FORMAT_HELP = """Answer with one or more SEARCH/REPLACE blocks, each preceded by the file's path:

train.py
<<<<<<< SEARCH
(lines copied exactly from the current file, indentation included)
=======
(the new lines)
>>>>>>> REPLACE

SEARCH must match exactly one place in the current file; keep it short but unique.
An empty SEARCH section replaces the whole file with the REPLACE section.
The last line of your answer, after the blocks, is a one-line description of the change."""


class EditError(ValueError):
    """The answer's edits cannot be applied; the message is written for the model to act on."""


@dataclass(frozen=True)
class EditBlock:
    path: str | None  # as written before the block; None if no path line
    search: str
    replace: str
    line: int  # 1-based line of the SEARCH marker in the answer


# ---------------------------------------------------------------------------
# Parsing


def _clean_path(line: str) -> str | None:
    text = line.strip().strip("`*").strip()
    text = re.sub(r"^(#+\s*|file:\s*|path:\s*)", "", text, flags=re.I).strip().strip("`*:").strip()
    if not text or " " in text or len(text) > 200 or not re.search(r"[./]", text):
        return None
    return text[2:] if text.startswith("./") else text


def _join(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def parse_blocks(answer: str) -> tuple[list[EditBlock], str]:
    """The edit blocks of an answer, and its description (the last line outside the blocks)."""
    lines = answer.splitlines()
    blocks: list[EditBlock] = []
    outside: list[str] = []
    i = 0
    while i < len(lines):
        if not SEARCH_RE.match(lines[i]):
            outside.append(lines[i])
            i += 1
            continue
        start = i
        path = None
        for back in range(len(outside) - 1, -1, -1):  # the path line: the nearest real line above
            prev = outside[back]
            if not prev.strip() or FENCE_RE.match(prev):
                continue
            path = _clean_path(prev)
            if path is not None:
                outside[back] = ""  # a path line is not the description
            break
        divider = next((j for j in range(start + 1, len(lines)) if DIVIDER_RE.match(lines[j])), None)
        if divider is None or any(SEARCH_RE.match(lines[j]) for j in range(start + 1, divider)):
            raise EditError(f"The block that starts at line {start + 1} (<<<<<<< SEARCH) has no "
                            f"======= line. Each block needs <<<<<<< SEARCH, =======, >>>>>>> REPLACE.")
        end = next((j for j in range(divider + 1, len(lines)) if REPLACE_RE.match(lines[j])), None)
        if end is None or any(SEARCH_RE.match(lines[j]) for j in range(divider + 1, end)):
            raise EditError(f"The block that starts at line {start + 1} (<<<<<<< SEARCH) has no "
                            f">>>>>>> REPLACE line after its ======= line.")
        blocks.append(EditBlock(path, _join(lines[start + 1:divider]), _join(lines[divider + 1:end]),
                                start + 1))
        i = end + 1
    return blocks, _description(outside)


def _description(lines: list[str]) -> str:
    for line in reversed(lines):
        text = line.strip()
        if not text or FENCE_RE.match(text):
            continue
        text = re.sub(r"\*+|`", "", text)  # markdown emphasis; underscores may be names
        text = re.sub(r"^([-#>]+\s*)+", "", text).strip()
        return re.sub(r"^description\s*:\s*", "", text, flags=re.I)
    return ""


def _whole_file_blocks(answer: str, editable: tuple[str, ...]) -> list[EditBlock]:
    """The alternative form: a path line, then the whole new file in one fenced code block."""
    lines = answer.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        path = _clean_path(lines[i])
        if path in editable and i + 1 < len(lines) and FENCE_RE.match(lines[i + 1]):
            fence = lines[i + 1].strip()[:3]
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence), None)
            if end is not None:
                blocks.append(EditBlock(path, "", _join(lines[i + 2:end]), i + 1))
                i = end + 1
                continue
        i += 1
    return blocks


# ---------------------------------------------------------------------------
# Applying


def _resolve_path(block: EditBlock, files: dict[str, str]) -> str:
    names = ", ".join(sorted(files))
    if block.path is None:
        if len(files) == 1:
            return next(iter(files))
        raise EditError(f"the block at line {block.line} has no file path on the line before "
                        f"<<<<<<< SEARCH; write one of: {names}")
    if block.path in files:
        return block.path
    same_name = [p for p in files if p.rsplit("/", 1)[-1] == block.path.rsplit("/", 1)[-1]]
    if len(same_name) == 1:
        return same_name[0]
    raise EditError(f"the block at line {block.line} edits {block.path}, which you may not edit; "
                    f"you may edit only: {names}")


def _find_lines(hay: list[str], needle: list[str], key) -> list[int]:
    keyed = [key(h) for h in hay]
    want = [key(n) for n in needle]
    n = len(want)
    return [i for i in range(len(keyed) - n + 1) if keyed[i:i + n] == want]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(replace: list[str], have: str, wrote: str) -> list[str]:
    """Shift the REPLACE lines by the indentation the SEARCH lines got wrong."""
    if have.startswith(wrote):
        extra = have[len(wrote):]
        return [extra + r if r.strip() else r for r in replace]
    if wrote.startswith(have):
        cut = wrote[len(have):]
        return [r[len(cut):] if r.startswith(cut) else r for r in replace]
    return replace


def _closest(text: str, search: str) -> str:
    """The lines of text most similar to search, as a hint for the model."""
    hay, needle = text.splitlines(), search.splitlines()
    n = len(needle)
    if not hay or not n:
        return ""
    best, best_i = 0.0, 0
    target = "\n".join(needle)
    for i in range(max(1, len(hay) - n + 1)):
        ratio = difflib.SequenceMatcher(None, "\n".join(hay[i:i + n]), target).ratio()
        if ratio > best:
            best, best_i = ratio, i
    if best < HINT_MIN_RATIO:
        return ""
    return "\n".join(hay[best_i:best_i + min(n, MAX_HINT_LINES)])


def apply_block(text: str, block: EditBlock, path: str) -> str:
    """Apply one block to one file's text; raise EditError saying why it does not match."""
    if not block.search.strip():
        return block.replace
    count = text.count(block.search)
    if count == 1:
        return text.replace(block.search, block.replace, 1)
    if count > 1:
        raise EditError(f"the SEARCH section of the block at line {block.line} matches {count} places "
                        f"in {path}; include more surrounding lines so that it matches exactly one.")
    hay = text.splitlines()
    needle = block.search.splitlines()
    replace = block.replace.splitlines()
    for key, reindent in ((str.rstrip, False), (str.strip, True)):
        found = _find_lines(hay, needle, key)
        if len(found) > 1:
            raise EditError(f"the SEARCH section of the block at line {block.line} matches "
                            f"{len(found)} places in {path}; include more surrounding lines.")
        if len(found) == 1:
            i = found[0]
            if reindent:
                first = next((k for k, line in enumerate(needle) if line.strip()), 0)
                replace = _reindent(replace, _indent(hay[i + first]), _indent(needle[first]))
            new = hay[:i] + replace + hay[i + len(needle):]
            return "\n".join(new) + ("\n" if text.endswith("\n") or not text else "")
    hint = _closest(text, block.search)
    msg = (f"the SEARCH section of the block at line {block.line} does not match {path}: it must "
           f"copy the current lines exactly, indentation included.")
    if hint:
        msg += f" The most similar lines in {path} are:\n```\n{hint}\n```"
    raise EditError(msg)


def apply_edits(files: dict[str, str], answer: str) -> tuple[dict[str, str], str]:
    """Apply an answer's blocks to {path: text}; return the changed files and the description.

    All or nothing: when a block fails, EditError lists every failure and nothing is changed.
    """
    blocks, description = parse_blocks(answer)
    if not blocks:
        blocks = _whole_file_blocks(answer, tuple(files))
    if not blocks:
        raise EditError("Your answer has no SEARCH/REPLACE block, so nothing was changed.\n\n"
                        + FORMAT_HELP)
    new = dict(files)
    problems = []
    for block in blocks:
        try:
            path = _resolve_path(block, files)
            new[path] = apply_block(new[path], block, path)
        except EditError as e:
            problems.append(str(e))
    if problems:
        raise EditError("Your edit did not apply, so no file was changed:\n- " + "\n- ".join(problems)
                        + "\n\nSend all of your SEARCH/REPLACE blocks again, corrected, and end with "
                          "the one-line description.")
    changed = {p: t for p, t in new.items() if t != files[p]}
    if not changed:
        raise EditError("Your edit leaves every file exactly as it was. Propose one real change, as "
                        "SEARCH/REPLACE blocks, and end with the one-line description.")
    return changed, description
