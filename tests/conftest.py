"""Shared test helpers: build a Config straight from a dict, run it, compare."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # reference_torch, random_configs

from trace_tf.config import Config, Document, OpConfig, build
from trace_tf.loader import Lines

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


def readme_python(section: str) -> str:
    """The one Python block of README's section `section` (a `###` heading), as printed."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text.split(f"### {section}\n", 1)[1]
    body = re.split(r"\n#{2,3} ", body, maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert len(blocks) == 1, f"README's {section!r} holds one Python block"
    return str(blocks[0])


def shape_id(shape: dict[str, Any]) -> str:
    """A parametrised shape's test id: its keys and values, `d_model=4,n_heads=2`."""
    return ",".join(f"{k}={v}" for k, v in shape.items())


def config_from(data: dict[str, Any], **kw: Any) -> Config | OpConfig:
    """A config built from plain data, as if read from a file named test.yaml."""
    return build(Document("test.yaml", data, Lines()), **kw)


@pytest.fixture
def tmp_yaml(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "c.yaml") -> str:
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return str(p)

    return write
