"""How a number or text the user gave is written back, in formulas, tables and messages."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import IO, Any


def exact(x: float) -> str:
    """The shortest text that reads back as `x` (1e-05, 10000, 1.23456789e-05), as
    Python's repr: a constant the user gave is never shown rounded."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


class Typed(float):
    """A number read from a command-line option, holding the text the user typed: a
    message shows that (`1e-400`, `1e400`, `-0.0`), not the float it became (0, inf)."""

    text: str

    def __new__(cls, value: float, text: str) -> Typed:
        number = super().__new__(cls, value)
        number.text = text
        return number


def typed(x: float) -> str:
    """A number as the user typed it, when it came from an option; else `exact(x)`."""
    return x.text.strip() if isinstance(x, Typed) else exact(x)


def root_text(name: str, n: int) -> str:
    """A square root the program takes, named and valued: `sqrt(d_model) = 2`, or
    `sqrt(d_k) ≈ 1.73205` (6 significant digits) when the root is not whole, so that
    a rounded value is not read as the one divided by."""
    root = math.sqrt(n)
    return f"{name} = {exact(root)}" if root.is_integer() else f"{name} ≈ {root:.6g}"


def printable(text: str) -> str:
    """A token, label or message as printed: control characters (a newline token, a
    tab, an escape) written as escapes, so that it stays on its line and nothing is
    sent to the terminal raw; anything else as it is, a file name's bytes that are not
    UTF-8 too (Python holds byte 0xNN as U+DCNN; they are written back as they were)."""
    if text.isprintable():
        return text
    control = (c for c in text if not c.isprintable() and not "\udc80" <= c <= "\udcff")
    escapes = {c: repr(c)[1:-1] for c in control}
    return "".join(escapes.get(c, c) for c in text)


def wrapped(text: str, width: int) -> list[str]:
    """`text` over lines of at most `width` cells (a CJK character takes two), broken
    at its spaces only: a word wider than that is a line of its own, whole."""
    from rich.cells import cell_len

    lines: list[str] = []
    for word in text.split():
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def beside(entries: Sequence[tuple[str, str]], width: int, least: int) -> list[str]:
    """Each (name, text) of `entries` as lines of at most `width` cells where its words
    fit (see `wrapped`): the texts in one column after the longest name, one space
    apart; where that column would be under `least` cells, each text under its name,
    indented 4. A name with no text is a line of its own."""
    from rich.cells import cell_len

    column = max((cell_len(name) for name, _ in entries), default=0) + 1
    side = width - column >= least
    indent = column if side else 4
    lines = []
    for name, text in entries:
        rest = wrapped(text, width - indent)
        if side and rest:
            lines.append(name + " " * (column - cell_len(name)) + rest.pop(0))
        else:
            lines.append(name)
        lines.extend(" " * indent + line for line in rest)
    return lines


def counted(n: int, noun: str) -> str:
    """`1 number`, `2 numbers`: a count in a message, with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def spaced(values: Sequence[object], limit: int = 12) -> str:
    """`0 0 1 1`: short values (token types) on one line, a long list's middle elided
    (`0 0 0 0 0 0 0 0 … 1 1 1 1`), so that a header or formula stays one line."""
    shown = [str(v) for v in values]
    if len(shown) > limit:
        shown = [*shown[: limit - 4], "…", *shown[-4:]]
    return " ".join(shown)


def shape_text(shape: Sequence[int], times: str = "×") -> str:
    """`4 × 3`, as tables write a shape, or with `times="x"` `4 x 3`, as messages do;
    `scalar` for no axes."""
    return f" {times} ".join(str(s) for s in shape) if len(shape) else "scalar"


def whole_number(text: str, signed: bool = False) -> bool:
    """Whether `text` is a whole number in ASCII digits ("12"; with `signed`, "-1" too),
    as the user's indices and counts must be: int() alone also takes `1_0` as 10, `+1`,
    ` 1` and other scripts' digits."""
    return re.fullmatch(r"-?[0-9]+" if signed else "[0-9]+", text) is not None


class Each:
    """A JSON array whose items are made one at a time, as `write_json` writes them: a
    trace's steps, each step's numbers turned into lists only while it is written."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


def write_json(fh: IO[str], obj: Any) -> None:
    """`json.dumps(obj, allow_nan=False)` written to `fh`, the same text, but each `Each`
    among `obj`'s values (string keys) written item by item. The large model's trace,
    written whole, is 187 MiB of text and ten times that as Python lists at once."""
    import json

    if isinstance(obj, Each):
        fh.write("[")
        for i, item in enumerate(obj.items):
            fh.write(", " if i else "")
            write_json(fh, item)
        fh.write("]")
    elif isinstance(obj, dict) and any(isinstance(v, Each) for v in obj.values()):
        fh.write("{")
        for i, (key, value) in enumerate(obj.items()):
            fh.write((", " if i else "") + json.dumps(key) + ": ")
            write_json(fh, value)
        fh.write("}")
    else:
        fh.write(json.dumps(obj, allow_nan=False))
