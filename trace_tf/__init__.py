"""trace-tf: a calculator that traces every step of a Transformer."""

__version__ = "0.1.0"
