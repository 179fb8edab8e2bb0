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


def test_every_fixture_is_a_packaged_example_and_every_example_a_fixture() -> None:
    """The worked examples were only in a clone's fixtures/: `pip install` shipped hello
    alone. Each lives in the package now, fixtures/ linking it (a relative link, so
    that a clone anywhere keeps it), and the two sets are one."""
    import os

    from trace_tf.loader import example_names, examples_dir

    for path in FILES:
        assert path.is_symlink(), f"{path.name} is not a link into the package"
        target = os.readlink(path)
        assert target == f"../trace_tf/examples/{path.name}", target
        assert path.resolve() == (examples_dir() / path.name).resolve()
    assert [p.stem for p in FILES] == example_names()
    assert len(FILES) == 14


def test_001_decoder_add_norm_is_replayed_from_its_two_printed_inputs() -> None:
    """001's decoder section 5 prints layer_norm(Z_self_attention + E) and both inputs.
    The fixture's x is their sum and its expected row is the printed one, which the
    document's own layer_norm, (x - mean) / (std + 1e-6), reproduces from them to its
    8-decimal printing; trace-tf's sqrt(var + 1e-5) is within the stated 6e-8: the
    printing's 5e-9, the 4.7e-8 between the two forms, and the inputs' rounding."""
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
    theirs = [(v - mean) / math.sqrt(sum((v - mean) ** 2 for v in x) / 4 + 1e-5) for v in x]
    gap = max(abs(a - b) for a, b in zip(document, theirs, strict=True))
    assert 4.6e-8 < gap < 4.7e-8
    assert entry["atol"] == 6e-8 and 5e-9 + gap + 2e-9 <= entry["atol"]  # justified, not loose
    assert 4e-8 < results[0].max_abs_error < entry["atol"]


def test_001_greedy_choice_from_the_printed_probabilities() -> None:
    """001 'Generating the output': from its printed logits the softmax gives, word by
    word, the probabilities it lists, and greedy decoding picks hola (0.46780959). Its
    own greedy loop ('SOS how a c') draws fresh random weights at every call and cannot
    be replayed; this is its one greedy step with printed numbers."""
    import json

    from typer.testing import CliRunner

    from trace_tf.cli import app

    printed = {  # the document's list, in its vocabulary order
        "hello": 0.01602618,
        "mundo": 0.06261303,
        "world": 0.38162024,
        "how": 0.03087794,
        "?": 0.0102383,
        "EOS": 0.00446011,
        "SOS": 0.01777314,
        "a": 0.00068275,
        "hola": 0.46780959,
        "c": 0.00789871,
    }
    args = ["generate", "--variant", "document_logits", "--greedy", "--max-tokens", "1"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    [first] = json.loads(result.stdout)["iterations"]
    assert first["next"] == "hola" == max(printed, key=printed.__getitem__)
    assert list(first["probs"]) == list(printed)
    for token, p in printed.items():  # 5e-9 printing + 4.7e-9 from the rounded logits
        assert abs(first["probs"][token] - p) <= 1e-8, token


def test_each_recorded_document_value_is_a_document_error() -> None:
    """Every `document` value a fixture records is a document error by the check's own
    count: the entry passes, and at least one cell is off by more than the document's
    printed precision."""
    recorded = []
    for path in FILES:
        doc = read_document(str(path))
        for r in check(doc):
            if r.document is not None:
                assert r.ok and not r.problem, (path.name, r.step)
                assert 0 < r.document.cells_wrong <= r.document.cells
                assert r.document.max_abs_error > r.document.atol
                recorded.append((path.name, r.step, r.variant))
    assert sorted(recorded) == [
        ("002_database_query.yaml", "attn.context", None),
        ("002_database_query.yaml", "attn.softmax", None),
        ("hello.yaml", "encoder.input", None),
        ("hello.yaml", "encoder.pe", None),
    ]
