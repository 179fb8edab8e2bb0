"""The errors trace-tf shows a user: one clear line each, never a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from trace_tf.text import printable


class InputNote(str):
    """A warning about a number the user gave (stored with fewer digits), not about the
    run: shown as NaN and overflow warnings are, but --strict does not make it an error
    (the input is used as the dtype holds it; nothing the run computed went wrong)."""


def clipped(text: str, limit: int = 200) -> str:
    """`text`, or its start and end around `…` when longer than `limit` characters."""
    return text if len(text) <= limit else f"{text[: limit - 20]}…{text[-10:]}"


def quoted(text: str, limit: int = 60) -> str:
    """Text the user gave, quoted for a message: its middle left out, and its length
    said, when longer than `limit` (a token, key or stage of a million characters
    would otherwise make a message of a million)."""
    if len(text) <= limit:
        return repr(text)
    return f"{clipped(text, limit)!r} ({len(text):,} characters)"


def suggest(key: str, valid: Sequence[str]) -> str:
    """` (did you mean 'x'?)`: the valid name nearest to `key`, compared without case
    (`w` for `W`); a name that alone begins with the key's first three letters wins
    (`Sine` for `sinusoidal`, where spelling alone is nearer `none`)."""
    by_lower = {v.lower(): v for v in valid}
    k = key.lower()
    near = [by_lower[k]] if k in by_lower else []
    if not near and len(k) >= 3:
        near = [v for low, v in by_lower.items() if low.startswith(k[:3])]
    if len(near) != 1:
        near = [by_lower[m] for m in difflib.get_close_matches(k, list(by_lower), n=1, cutoff=0.5)]
    return f" (did you mean {near[0]!r}?)" if near else ""


def suggest_path(path: str, valid: Sequence[str]) -> str:
    """` (did you mean 'p'?)` for a misspelt step path: the valid path it differs from by
    the fewest letters, when at most two (a letter missing, added or changed). suggest's
    looser rules, made for short keys, would name any path of the same head
    (`h0.v` for `h0.nope`)."""

    def apart(other: str) -> int:  # letters in one path and not matched in the other
        same = sum(b.size for b in difflib.SequenceMatcher(None, path, other).get_matching_blocks())
        return len(path) + len(other) - 2 * same

    near = min(valid, key=apart, default=None)
    return f" (did you mean {near!r}?)" if near is not None and apart(near) <= 2 else ""


class InputError(Exception):
    """Bad usage or bad input (exit code 2): names the file, key path, expected and found."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        path: str | None = None,
        line: int | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.path = path
        self.line = line
        self.expected = expected
        self.found = found

    def with_file(self, file: str) -> InputError:
        """Attach the file name if the error does not carry one yet."""
        if self.file is None:
            self.file = file
        return self

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(clipped(self.file) + (f":{self.line}" if self.line else ""))
        elif self.line:
            where.append(f"line {self.line}")
        if self.path:
            where.append(clipped(self.path))
        text = ": ".join([*where, self.message])
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.found is not None:
            text += f", found {self.found}"
        return printable(text)  # one line: a key, token or file name with a newline


class NumericalError(InputError):
    """A NaN or overflow raised to an error by --strict."""
