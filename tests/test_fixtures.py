"""Every fixture's `expect` entries hold: the documents' numbers, replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES

from trace_tf.config import read_document
from trace_tf.runner import check

FILES = sorted(FIXTURES.glob("*.yaml"))


def test_there_are_fixtures_for_every_document() -> None:
    names = " ".join(p.name for p in FILES)
    for doc in ("hello", "000_", "002_", "003_", "004_"):
        assert doc in names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fixture_expectations_hold(path: Path) -> None:
    results = check(read_document(str(path)))
    assert results, f"{path.name} has no expect entries"
    failed = [(r.step, r.variant, r.max_abs_error, r.problem) for r in results if not r.ok]
    assert not failed, failed


def test_hello_fixture_is_the_packaged_example() -> None:
    from trace_tf.config import examples_dir

    packaged = (examples_dir() / "hello.yaml").read_bytes()
    assert (FIXTURES / "hello.yaml").read_bytes() == packaged
