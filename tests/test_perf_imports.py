"""`trace-tf --help` and `trace-tf examples` start without importing numpy (issue 6)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from typer.testing import CliRunner
from trace_tf.cli import app
result = CliRunner().invoke(app, {args!r})
assert result.exit_code == 0, result.output
assert {expect!r} in result.output, result.output
heavy = sorted(m for m in ("numpy", "trace_tf.config", "trace_tf.model") if m in sys.modules)
print(",".join(heavy) or "none")
"""


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--help"], "encode"),
        (["--version"], "trace-tf 0."),
        (["examples"], "hello"),
        (["examples", "hello"], "title:"),
    ],
    ids=["help", "version", "examples", "examples-name"],
)
def test_command_does_not_import_numpy(args: list[str], expect: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args, expect=expect)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"


def test_the_probe_does_see_numpy_when_it_is_imported() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=["encode"], expect="encoder.0")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "numpy" in out.stdout
