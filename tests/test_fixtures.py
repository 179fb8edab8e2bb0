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


def test_001_decoder_add_norm_is_replayed_from_its_two_printed_inputs() -> None:
    """001's decoder section 5 prints layer_norm(Z_self_attention + E) and both inputs.
    The fixture's x is their sum and its expected row is the printed one, which the
    document's own layer_norm, (x - mean) / (std + 1e-6), reproduces from them to its
    8-decimal printing; trace-tf's sqrt(var + 1e-5) is within the stated 1e-7."""
    import math

    import yaml

    z_self_attention = [2.19334924, 10.61851198, -4.50089666, -2.76366551]  # section 4
    e = [1, 1, 0, 1]  # section 4's E = [[1, 1, 0, 1]]
    printed = [0.17236212, 1.54684892, -1.0828824, -0.63632864]  # section 5
    path = FIXTURES / "001_decoder_self_attention_norm.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    x = [a + b for a, b in zip(z_self_attention, e, strict=True)]
    assert data["norm"]["x"] == [pytest.approx(x, abs=1e-15)]
    [entry] = data["expect"]
    assert entry["step"] == "norm.out" and entry["value"] == [printed]
    mean = sum(x) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / 4)
    document = [(v - mean) / (std + 1e-6) for v in x]
    assert max(abs(a - b) for a, b in zip(document, printed, strict=True)) < 5e-9
    results = check(read_document(str(path)))
    assert [r.ok for r in results] == [True]
    assert 4e-8 < results[0].max_abs_error < entry["atol"] == 1e-7
