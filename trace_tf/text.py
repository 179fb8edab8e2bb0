"""How a number the user gave is written back, in formulas and messages."""

from __future__ import annotations


def exact(x: float) -> str:
    """The shortest text that reads back as `x` (1e-05, 10000, 1.23456789e-05), as
    Python's repr: a constant the user gave is never shown rounded."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text
