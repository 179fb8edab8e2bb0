"""The errors trace-tf shows a user: one clear line each, never a traceback."""

from __future__ import annotations


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
            where.append(self.file + (f":{self.line}" if self.line else ""))
        elif self.line:
            where.append(f"line {self.line}")
        if self.path:
            where.append(self.path)
        text = ": ".join([*where, self.message])
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.found is not None:
            text += f", found {self.found}"
        return text


class NumericalError(InputError):
    """A NaN or overflow raised to an error by --strict."""
