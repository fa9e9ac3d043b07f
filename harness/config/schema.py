"""The settings schema's machinery: what one setting is (`Setting`), the kinds of value it takes
(`Kind`: type, bounds or choices, and the words that say what is allowed), and what is derived from
the table of them: validation, the comments `harness init` writes, the docs' settings table.

The table itself is declared in config/__init__.py, on `RunConfig`'s own fields: each field that is a setting
carries its `Setting` in the dataclass field's metadata (`setting(...)`), so a setting's name, type,
default, bounds, help, flag and resume rule are one declaration, and the frozen `RunConfig` stays a
plain dataclass.

Why not pydantic (DESIGN.md names it as one way): `RunConfig` is a frozen dataclass that callers
`dataclasses.replace` (commands/check.py, workload/testsplit.py, the Ray executor and worker), pickle into Ray tasks and
`asdict` into run.json; a pydantic model breaks `replace`, a pydantic dataclass re-validates on every
`replace` and coerces in lax mode ("300" -> 300, 1 -> True) unless each field is made strict; its
messages ("Input should be greater than 0") would be rewritten for every kind anyway to name the key,
the value, what is allowed and where it came from; and importing it costs 150-300 ms on the path of
every `harness` command (the CLI imports config). The kinds here are a few dozen lines, import nothing
and keep today's messages.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

# How a resumed run treats a changed setting (config.compare_resume).
REFUSED = "refused"  # it changes what a row measures or how it is judged: the resume is refused
RECORDED = "recorded"  # a limit or pacing: accepted, recorded as an event
FILE, CLI = "file", "cli"  # where a setting may be given: the repo's file and the flags, or flags only


class Bad(ValueError):
    """A value the setting does not allow; its text says what is allowed."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Kind:
    """A kind of value: `check` returns it normalised or raises Bad(what is allowed)."""
    none: bool = False  # None is allowed (it means the default described by the setting's `none`)
    py: ClassVar[str] = "str"  # the Python type of a checked value

    @property
    def annotation(self) -> str:
        """The type a RunConfig field of this kind is declared with."""
        return self.py + (" | None" if self.none else "")

    @property
    def what(self) -> str:
        raise NotImplementedError

    @property
    def type_name(self) -> str:  # the docs' word for the TOML type
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        if value is None and self.none:
            return None
        return self._check(value)

    def _check(self, value: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Number(Kind):
    """A number with a lower bound: `gt` (exclusive) or `ge` (inclusive); integer or float."""
    gt: float | None = None
    ge: float | None = None
    integer: bool = False
    unit: str = ""  # "seconds", "minutes", "MB": said in the message and the docs
    noun: str = "number"  # "a positive amount of USD"
    zero: str = ""  # what 0 means, e.g. "no bound"

    @property
    def what(self) -> str:
        low, strict = (self.gt, True) if self.gt is not None else (self.ge, False)
        sign = ("positive" if (low == 0 and strict) or (low == 1 and not strict and self.integer) else
                "non-negative" if low == 0 else "")
        if self.unit and sign:
            text = f"a {sign} {self.noun} of {self.unit}"
        elif sign and not self.integer:
            text = f"a {sign} number"
        else:
            text = f"{'an integer' if self.integer else 'a number'} {'>' if strict else '>='} {low:g}"
            text += f" ({self.unit})" if self.unit else ""
        return text + (f" (0 = {self.zero})" if self.zero else "")

    @property
    def annotation(self) -> str:
        return ("int" if self.integer else "float") + (" | None" if self.none else "")

    @property
    def type_name(self) -> str:
        return "integer" if self.integer else "number"

    def _check(self, value: Any) -> Any:
        ok = isinstance(value, int) and not isinstance(value, bool) if self.integer else _number(value)
        if not ok or (self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge):
            raise Bad(self.what)
        return value if self.integer else float(value)


@dataclass(frozen=True)
class Text(Kind):
    """A string: non-empty unless `empty` (what a model name may be)."""
    describe: str = "a non-empty string"
    empty: bool = False

    @property
    def what(self) -> str:
        return self.describe

    @property
    def type_name(self) -> str:
        return "string"

    def _check(self, value: Any) -> Any:
        if not isinstance(value, str) or (not self.empty and not value.strip()):
            raise Bad(self.what)
        return value


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        quoted = [repr(o) for o in self.options]
        return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    @property
    def type_name(self) -> str:
        return " \\| ".join(f"`{o}`" for o in self.options)

    def _check(self, value: Any) -> Any:
        if value not in self.options:
            raise Bad(self.what)
        return value


@dataclass(frozen=True)
class Flag(Kind):
    py: ClassVar[str] = "bool"

    @property
    def what(self) -> str:
        return "true or false"

    @property
    def type_name(self) -> str:
        return "boolean"

    def _check(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise Bad(self.what)
        return value


@dataclass(frozen=True)
class Strings(Kind):
    """A list of strings, kept as a tuple; `paths`: file paths inside the repo; `nonempty`: at least one."""
    paths: bool = False
    nonempty: bool = False

    py: ClassVar[str] = "tuple[str, ...]"

    @property
    def what(self) -> str:
        return "a list of file paths relative to the repo root" if self.paths else "a list of strings"

    @property
    def type_name(self) -> str:
        return "list of paths" if self.paths else "list of strings"

    def _check(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and (v or not self.paths)
                                                             for v in value):
            raise Bad(self.what)
        if self.paths and not all(not Path(v).is_absolute() and ".." not in Path(v).parts for v in value):
            raise Bad("paths inside the repo (relative, no '..')")
        if self.nonempty and not value:
            raise Bad("a non-empty list")
        return tuple(value)


@dataclass(frozen=True)
class Resources(Kind):
    """Ray resources by name: a table (or its JSON, from the command line) of amounts > 0."""
    py: ClassVar[str] = "dict[str, float]"

    @property
    def what(self) -> str:
        return 'resource amounts > 0 by name, e.g. {"GPU": 1} or {"CPU": 1}'

    @property
    def type_name(self) -> str:
        return "table"

    def _check(self, value: Any) -> Any:
        if isinstance(value, str):  # --job-resources '{"GPU": 1}'
            try:
                value = json.loads(value)
            except ValueError:
                raise Bad('a JSON object of resource amounts, e.g. {"GPU": 1} or {"CPU": 1}') from None
        if value is None and self.none:
            return None
        if not (isinstance(value, dict) and value and all(isinstance(k, str) and _number(v) and v > 0
                                                          for k, v in value.items())):
            raise Bad(self.what)
        return {k: float(v) for k, v in value.items()}


@dataclass(frozen=True)
class Tracker(Kind):
    """An experiment tracker, optionally with :URI; "none" = no tracking."""
    backends: tuple[str, ...] = ("mlflow",)

    @property
    def what(self) -> str:
        return (f"one of {', '.join(self.backends)} (optionally with :URI, e.g. mlflow:http://127.0.0.1:5000) "
                f"or none")

    @property
    def type_name(self) -> str:
        return "string"

    def _check(self, value: Any) -> Any:
        backend = value.partition(":")[0] if isinstance(value, str) else value
        if backend not in (*self.backends, "none"):
            raise Bad(self.what)
        return None if backend == "none" else value


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: everything else (validation, init's comments, the docs' table,
    the resume check, the flag named in a message) is derived from it."""
    name: str
    default: Any
    kind: Kind
    help: str
    where: str = FILE  # FILE: the repo's settings file and the command line; CLI: the command line only
    flag: str | None = None  # the `harness run` flag, e.g. "--stall-after"; None: none
    resume: str | None = None  # REFUSED, RECORDED, or None: not compared on resume
    none: str = ""  # what None (the default) means, e.g. "2 x time_budget + 120"
    aliases: tuple[str, ...] = ()  # older names a settings file may still use
    hint: str = ""  # said after the value in a refusal, e.g. "Leave it out for no limit."
    option: str = ""  # a researcher setting: its key in RunConfig.agent_options (not a RunConfig field)

    def check(self, value: Any) -> Any:
        return self.kind.check(value)


def declare(default: Any, kind: Kind, help: str, **rest: Any) -> Any:
    """A RunConfig field that is a setting: its default, with the Setting in the field's metadata
    (its name is filled in from the field's own)."""
    return field(default=default, metadata={"setting": (default, kind, help, rest)})


def from_fields(fields: Any) -> dict[str, Setting]:
    """The settings declared on a dataclass's fields, by field name, in declaration order."""
    out = {}
    for f in fields:
        if "setting" in f.metadata:
            default, kind, help, rest = f.metadata["setting"]
            out[f.name] = Setting(f.name, default, kind, help, **rest)
    return out


def message(setting: Setting | str, value: Any, what: str, source: str) -> str:
    """A refusal: where the value came from (a file's path and key, or the flag), the value, what is allowed."""
    hint = f". {setting.hint}" if isinstance(setting, Setting) and setting.hint else ""
    return f"{source} must be {what}, got {value!r}{hint}"


# ---------------------------------------------------------------------------
# Derived text: TOML values with their help (harness init), the docs' table


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def toml_lines(settings: dict[str, Setting], values: dict[str, Any], width: int = 36) -> str:
    """`key = value  # help` for each value given, the comments aligned (what `harness init` writes)."""
    lines = []
    for key, value in values.items():
        text = f"{key} = {toml_value(value)}"
        lines.append(f"{text.ljust(width - 2)}  # {settings[key].help}")
    return "\n".join(lines) + "\n"


def default_text(s: Setting) -> str:
    if s.default is None:
        return s.none or "none"
    if s.default == () and s.none:
        return s.none
    return f"`{toml_value(s.default)}`"


def markdown_table(settings: dict[str, Setting], cell: Callable[[str], str] = lambda t: t.replace("|", "\\|")) -> str:
    """The docs' settings table (docs/configuration.md), one row per setting."""
    rows = ["| key | flag | value | default | on `--resume` | meaning |", "|---|---|---|---|---|---|"]
    for s in settings.values():
        key = f"`{s.name}`" if s.where == FILE else "(flag only)"
        if s.aliases:
            key += " (was " + ", ".join(f"`{a}`" for a in s.aliases) + ")"
        flag = f"`{s.flag}`" if s.flag else ""
        value = s.kind.type_name if isinstance(s.kind, Choice) else cell(s.kind.what)
        resume = s.resume or ""
        rows.append(f"| {key} | {cell(flag)} | {value} | {cell(default_text(s))} | {resume} | {cell(s.help)} |")
    return "\n".join(rows) + "\n"
