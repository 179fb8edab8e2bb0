"""`weights_file:` weights (and embeddings) from a numpy .npz, named by their YAML key
paths: the same numbers and the same checks as the YAML's, refused as the YAML's are."""

from __future__ import annotations

import copy
import io
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from random_configs import random_config, to_per_head
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config, load
from trace_tf.runner import run

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def flatten(value: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    """Each array of a YAML `weights`/`embeddings` value under its dotted key path."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and isinstance(value[0], dict):  # layers, heads
        for i, v in enumerate(value):
            flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = np.asarray(value, dtype=np.float64)


def split(data: dict[str, Any], d: Path, npz: str = "w.npz") -> tuple[Path, Path]:
    """The config written twice: every array in the YAML (all.yaml), and every array in
    an .npz beside a YAML holding the rest (npz.yaml)."""
    full = d / "all.yaml"
    full.write_text(yaml.safe_dump(data), encoding="utf-8")
    rest = copy.deepcopy(data)
    arrays: dict[str, np.ndarray] = {}
    flatten(rest.pop("weights", {}), "", arrays)
    flatten({"embeddings": rest.pop("embeddings", {})}, "", arrays)
    np.savez(d / npz, **arrays)
    rest["weights_file"] = npz
    (d / "npz.yaml").write_text(yaml.safe_dump(rest), encoding="utf-8")
    return full, d / "npz.yaml"


def same_trace(a: Config, b: Config) -> None:
    ta, tb = run(a), run(b)
    assert list(ta.steps) == list(tb.steps)
    for path in ta.steps:  # bit for bit
        assert np.array_equal(ta.value(path), tb.value(path)), path


def loaded(path: Path | str, **kw: Any) -> Config:
    cfg = load(str(path), **kw)
    assert isinstance(cfg, Config)
    return cfg


CASES = {
    "fused": dict(fused=True, decoder_layers=1, encoder_layers=2),
    "per_head": dict(fused=False, decoder_layers=1),
    "pre_learned_tied": dict(
        norm_position="pre",
        positional="learned",
        encoder_layers=0,
        decoder_layers=2,
        tie_embeddings=True,
    ),
    "relative_fused": dict(positional="relative", fused=True),
    "relative_per_head": dict(positional="relative", fused=False, norm="rms"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_npz_gives_the_same_trace_as_the_yaml(case: str, tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(7), d_model=6, n_heads=2, **CASES[case])
    full, npz = split(data, tmp_path)
    a, b = loaded(full), loaded(npz)
    same_trace(a, b)
    assert not b.drawn  # every array came from the file
    assert b.given_fused == a.given_fused
    assert b.weights_file == str(tmp_path / "w.npz") and b.overrides == ()


def test_the_arrays_are_named_as_the_drawing_rule_names_them(tmp_path: Path) -> None:
    """A per-head W_k and a score weight given in the npz, the rest drawn: the drawn
    ones are the numbers SPEC's rule gives, the given ones exactly the file's."""
    rng = np.random.default_rng(3)
    W_k = rng.standard_normal((4, 2))
    w = rng.uniform(0.5, 2, 2)
    np.savez(
        tmp_path / "w.npz",
        **{"encoder.0.self_attn.heads.1.W_k": W_k, "encoder.0.self_attn.heads.0.w": w},
    )
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4, n_heads: 2, score: gaussian, seed: 5}\n"
        "source: [[1, 2, 3, 4]]\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    cfg = loaded(tmp_path / "c.yaml")
    head0, head1 = cfg.encoder[0].self_attn.heads
    assert np.array_equal(head1.W_k, W_k) and np.array_equal(head0.score.w, w)
    drawn = np.random.default_rng([5, __import__("zlib").crc32(b"encoder.0.self_attn.heads.0.W_k")])
    assert np.array_equal(head0.W_k, drawn.standard_normal((4, 2)))
    assert "encoder.0.self_attn.heads.1.W_k" not in cfg.drawn


def test_float32_and_integer_arrays_are_widened_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    W32 = rng.standard_normal((4, 16)).astype(np.float32)
    b_int = np.arange(-8, 8, dtype=np.int32)
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": W32, "encoder.0.ffn.b_1": b_int})
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    ffn = loaded(tmp_path / "c.yaml").encoder[0].ffn
    assert ffn.W_1.dtype == np.float64 and ffn.b_1 is not None
    assert ffn.W_1.tolist() == [[float(x) for x in row] for row in W32.tolist()]
    assert ffn.b_1.tolist() == list(range(-8, 8))


def test_yaml_and_npz_mixed(tmp_path: Path) -> None:
    """Some arrays in the YAML, the others in the npz: the same as all in the YAML."""
    data = random_config(np.random.default_rng(2), d_model=4, n_heads=2, decoder_layers=1)
    full = tmp_path / "all.yaml"
    full.write_text(yaml.safe_dump(data), encoding="utf-8")
    mixed = copy.deepcopy(data)
    enc = mixed["weights"]["encoder"][0]
    out = mixed["weights"].pop("output")
    np.savez(
        tmp_path / "part.npz",
        **{
            "encoder.0.ffn.W_2": np.array(enc["ffn"].pop("W_2")),
            "encoder.0.self_attn.heads.1.W_q": np.array(enc["self_attn"]["heads"][1].pop("W_q")),
            "output.W": np.array(out["W"]),
            "output.b": np.array(out["b"]),
            "embeddings.t2": np.array(mixed["embeddings"].pop("t2")),
        },
    )
    mixed["weights_file"] = "part.npz"
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(mixed), encoding="utf-8")
    b = loaded(tmp_path / "mixed.yaml")
    same_trace(loaded(full), b)
    assert b.weights_file_arrays == 5


def test_the_path_is_relative_to_the_config_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "model"
    sub.mkdir()
    data = random_config(np.random.default_rng(4), d_model=4, n_heads=1)
    full, npz = split(data, sub)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    same_trace(loaded(full), loaded(npz))
    code, out, err = invoke("encode", str(npz))
    assert code == 0, err
    assert f"given in {sub / 'w.npz'} (" in out.replace("\n", "")


def test_set_and_variant_give_the_weights_file(tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(5), d_model=4, n_heads=2)
    full, npz = split(data, tmp_path)
    (tmp_path / "other.npz").write_bytes((tmp_path / "w.npz").read_bytes())
    rest = yaml.safe_load(npz.read_text(encoding="utf-8"))
    del rest["weights_file"]
    rest["variants"] = {"real": {"weights_file": "other.npz"}}
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(rest), encoding="utf-8")
    a = loaded(full)
    same_trace(a, loaded(bare, sets=["weights_file=w.npz"]))
    same_trace(a, loaded(bare, variant="real"))
    assert loaded(bare).drawn  # without it, drawn


def test_a_number_from_the_npz_is_checked_as_the_yaml_s_naming_both_files(
    tmp_path: Path,
) -> None:
    data = random_config(np.random.default_rng(6), d_model=4, n_heads=2)
    _, npz = split(data, tmp_path)
    arrays = dict(np.load(tmp_path / "w.npz"))
    cases: dict[str, tuple[dict[str, Any], list[str]]] = {
        "typo": (
            {"encoder.0.self_atn.W_x": np.zeros((4, 2))},
            [
                "weights.encoder.0.self_atn",
                "unknown key 'self_atn' (did you mean 'self_attn'?)",
                "array 'encoder.0.self_atn.W_x'",
            ],
        ),
        "shape": (
            {"encoder.0.ffn.W_1": np.zeros((4, 3))},
            [
                "weights.encoder.0.ffn.W_1: wrong shape",
                "expected shape 4 x 16",
                "found shape 4 x 3",
            ],
        ),
        "nan": (
            {"encoder.0.ffn.b_2": np.array([0, 1, np.nan, 0])},
            ["weights.encoder.0.ffn.b_2.2: not a finite number", "found the number nan"],
        ),
        "inf": (
            {"output.b": np.full(len(data["vocab"]), -np.inf)},
            ["weights.output.b.0: not a finite number"],
        ),
        "0-d": (
            {"encoder.0.ffn.b_1": np.array(2.0)},
            ["weights.encoder.0.ffn.b_1: wrong shape", "found shape scalar"],
        ),
        "layers": (
            {"encoder.3.ffn.W_1": np.zeros((4, 16))},
            ["weights.encoder.1: more encoder layers than model.encoder_layers (1)"],
        ),
        "token": (
            {"embeddings.tt": np.zeros(4)},
            ["embeddings.tt: token 'tt' is not in the vocabulary (did you mean"],
        ),
        "part": (
            {"encoder_final_norm.gamma": np.ones(4)},
            ["weights.encoder_final_norm: a final norm is given but model.final_norm is off"],
        ),
        "forms": (
            {"encoder.0.self_attn.W_q": np.zeros((4, 4))},
            ["one form per block"],
        ),
    }
    for name, (change, words) in cases.items():
        np.savez(tmp_path / "bad.npz", **{**arrays, **change})
        text = npz.read_text(encoding="utf-8").replace("w.npz", "bad.npz")
        (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
        code, out, err = invoke("encode", str(tmp_path / "bad.yaml"))
        assert code == 2, (name, out)
        assert err.count("\n") == 1 and "Traceback" not in err, (name, err)
        assert f"{tmp_path / 'bad.yaml'}:" in err, (name, err)
        if name != "forms":  # (that one names the YAML's per-head entry it meets)
            key = next(iter(change))
            assert f"(from weights_file {tmp_path / 'bad.npz'}, array '" in err, (name, err)
            assert f"'{key}'" in err, (name, err)
        for word in words:
            assert word in err, (name, word, err)


def test_a_key_in_both_the_yaml_and_the_npz_is_refused(tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(8), d_model=4, n_heads=1)
    _, npz = split(data, tmp_path)
    rest = yaml.safe_load(npz.read_text(encoding="utf-8"))
    rest["weights"] = {"encoder": [{"ffn": {"b_1": [0.0] * 16}}]}
    npz.write_text(yaml.safe_dump(rest), encoding="utf-8")
    code, _, err = invoke("encode", str(npz))
    assert code == 2
    assert "weights.encoder.0.ffn.b_1: given twice" in err
    assert f"array 'encoder.0.ffn.b_1' of weights_file {tmp_path / 'w.npz'}" in err
    code, _, err = invoke("encode", str(npz.with_name("all.yaml")), "--set", "weights_file=w.npz")
    assert code == 2 and "given twice" in err and "set" in err


@pytest.mark.parametrize(
    "sets",
    [
        [],
        # (were taken: the entry written over the second array, the first one unread)
        ["weights.encoder.0.ffn.b_1.3=5"],
        ["weights.encoder.00.ffn.b_1.3=5", "weights.encoder.0.ffn.b_1.2=6"],
        ["weights.encoder.0.ffn.b_1=[" + ", ".join(["0"] * 16) + "]"],
    ],
    ids=["alone", "entry", "entries", "whole"],
)
def test_two_arrays_of_the_npz_for_one_key_are_named_both(tmp_path: Path, sets: list[str]) -> None:
    """`encoder.00.ffn.b_1` is index 0 as in --set: with `encoder.0.ffn.b_1` beside it the
    key is given twice, by the npz alone (whatever a --set writes over it); the message
    said 'in c.yaml and as array'."""
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    np.savez(
        tmp_path / "w.npz",
        **{"encoder.0.ffn.b_1": np.zeros(16), "encoder.00.ffn.b_1": np.ones(16)},
    )
    code, _, err = invoke(
        "encode", str(tmp_path / "c.yaml"), *(a for s in sets for a in ("--set", s))
    )
    assert code == 2, err
    assert "given twice: as arrays 'encoder.0.ffn.b_1' and 'encoder.00.ffn.b_1' of " in err, err
    assert "in " + str(tmp_path / "c.yaml") + " and" not in err, err


def _bad_file(tmp_path: Path, write: Any) -> str:
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    write(tmp_path / "w.npz")
    code, out, err = invoke("encode", str(tmp_path / "c.yaml"))
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"trace-tf: error: {tmp_path / 'w.npz'}: ")
    assert f"(the weights_file of {tmp_path / 'c.yaml'}, line 3)" in err
    return err


def _corrupt(path: Path) -> None:
    np.savez(path, **{"encoder.0.ffn.W_1": np.arange(64.0).reshape(4, 16)})
    data = bytearray(path.read_bytes())
    at = data.find(b"NUMPY") + 200  # in the numbers: the CRC no longer matches
    data[at : at + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def _npy(array: np.ndarray) -> bytes:
    """An array as numpy.save writes it."""
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    """An .npy header for float64 numbers of this shape, with no data."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    return out.getvalue()


def _zip_of(members: dict[str, bytes]) -> Any:
    def write(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as z:
            for name, body in members.items():
                z.writestr(name, body)

    return write


BAD_FILES: dict[str, tuple[Any, list[str]]] = {
    "missing": (lambda p: None, ["no such file"]),
    "directory": (lambda p: p.mkdir(), ["is a directory"]),
    "not a zip": (lambda p: p.write_text("W_1: [1, 2]"), ["not an .npz file", "found the bytes"]),
    "an .npy": (
        lambda p: np.save(open(p, "wb"), np.zeros(3)),  # noqa: SIM115
        ["not an .npz file (a single .npy array)"],
    ),
    "truncated": (
        lambda p: (np.savez(p, a=np.zeros(100)), p.write_bytes(p.read_bytes()[:200])),
        ["corrupt or unreadable"],
    ),
    "corrupt member": (_corrupt, ["array 'encoder.0.ffn.W_1': corrupt or unreadable member"]),
    "not an array": (_zip_of({"notes.txt": b"hi"}), ["array 'notes.txt': not an array"]),
    "bad header": (_zip_of({"x.npy": b"\x93NUMPY\x01\x00garbage"}), ["array 'x': corrupt"]),
    "object": (
        lambda p: np.savez(p, **{"encoder.0.ffn.b_1": np.array([{}, 1], dtype=object)}),
        ["array 'encoder.0.ffn.b_1': not an array of real numbers", "found dtype object"],
    ),
    "complex": (
        lambda p: np.savez(p, **{"encoder.0.ffn.b_1": np.zeros(16, complex)}),
        ["found dtype complex128"],
    ),
    "bool": (lambda p: np.savez(p, x=np.ones(3, bool)), ["found dtype bool"]),
    "text": (lambda p: np.savez(p, x=np.array(["1.5"])), ["found dtype <U3"]),
    "long double": (
        lambda p: np.savez(p, x=np.ones(3, np.longdouble)),
        ["not an array of real numbers"],
    ),
    "empty archive": (lambda p: np.savez(p), ["holds no arrays", "found an empty archive"]),
    "more data than its shape": (
        _zip_of({"encoder.0.ffn.b_1.npy": _npy(np.zeros(16)) + b"\0" * 1000}),
        ["array 'encoder.0.ffn.b_1': corrupt", "more data than its header's shape holds"],
    ),
    "negative dimension": (
        _zip_of({"x.npy": _npy_header_only((-2,)) + b"\0" * 1000}),
        ["array 'x': corrupt", "a negative dimension"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_npz_is_refused_naming_it_and_the_config(case: str, tmp_path: Path) -> None:
    write, words = BAD_FILES[case]
    if case == "long double" and np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("long double is float64 here")
    err = _bad_file(tmp_path, write)
    for word in words:
        assert word in err, err


def test_too_many_numbers_are_refused_from_the_headers_before_any_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": np.zeros((4, 16))})
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )

    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("array data read")

    monkeypatch.setattr(np.lib.format, "read_array", never)
    code, _, err = invoke("encode", str(tmp_path / "c.yaml"), "--max-elements", "150")
    assert code == 2, err
    assert "too large" in err and "refused before reading them" in err
    assert "expected at most 150 numbers" in err and "found 64 numbers in 1 arrays" in err


def test_output_never_replaces_the_npz(tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(9), d_model=4, n_heads=1)
    _, npz = split(data, tmp_path)
    before = (tmp_path / "w.npz").read_bytes()
    code, _, err = invoke(
        "encode", str(npz), "--format", "npz", "--output", str(tmp_path / "w.npz"), "--force"
    )
    assert code == 2, err
    assert (tmp_path / "w.npz").read_bytes() == before


def test_weights_file_in_a_single_operation_file_is_refused(tmp_yaml: Any) -> None:
    path = tmp_yaml("norm: {x: [[1, 2]]}\nweights_file: w.npz\n")
    code, _, err = invoke("norm", path)
    assert code == 2 and "has no weights_file" in err


@pytest.mark.parametrize("value", ["[a]", '"w\\0.npz"'])
def test_weights_file_must_be_a_name(value: str, tmp_yaml: Any) -> None:
    """A list, or a string holding NUL (which no path can: an internal error, exit 3)."""
    path = tmp_yaml(f"model: {{d_model: 2}}\nsource: [[1, 2]]\nweights_file: {value}\n")
    code, _, err = invoke("encode", path)
    assert code == 2 and "weights_file: not a file name" in err, err
    assert err.count("\n") == 1, err


def test_cost_vary_d_draws_every_weight_of_the_new_width(tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(10), d_model=4, n_heads=2)
    _, npz = split(data, tmp_path)
    code, _, err = invoke("cost", str(npz), "--vary", "D=4,8")
    assert code == 0, err


def test_per_head_npz_of_a_fused_yaml(tmp_path: Path) -> None:
    """The fused YAML's columns given per head in the npz: the same trace."""
    data = random_config(np.random.default_rng(11), d_model=6, n_heads=3, fused=True)
    full = tmp_path / "all.yaml"
    full.write_text(yaml.safe_dump(data), encoding="utf-8")
    _, npz = split(to_per_head(data), tmp_path)
    same_trace(loaded(full), loaded(npz))


def test_fused_npz_beside_per_head_yaml_names_the_npz_array(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4, n_heads: 2}\nsource: [[1, 2, 3, 4]]\nweights:\n  encoder:\n"
        "    - self_attn: {heads: [{W_q: [[1, 2], [1, 2], [1, 2], [1, 2]]}]}\n"
        "weights_file: w.npz\n",
        encoding="utf-8",
    )
    np.savez(tmp_path / "w.npz", **{"encoder.0.self_attn.W_k": np.zeros((4, 4))})
    code, _, err = invoke("encode", str(tmp_path / "c.yaml"))
    assert code == 2, err
    assert "c.yaml:5: weights.encoder.0.self_attn.heads.0.W_q: one form per block" in err
    assert f"(fused W_k from weights_file {tmp_path / 'w.npz'}, array " in err
    assert "'encoder.0.self_attn.W_k')" in err


def test_an_array_name_that_cannot_be_placed_names_the_array(tmp_path: Path) -> None:
    """An index far past a list's end, or a name through another array or a number."""
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights: {encoder: 5}\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    cases = {
        "encoder.0.ffn.W_1": "weights.encoder is not a mapping or list (line 3 of",
        "decoder.99999.ffn.W_1": "index 99999 is far past the end of weights.decoder",
    }
    for array, words in cases.items():
        np.savez(tmp_path / "w.npz", **{array: np.zeros((4, 16))})
        code, _, err = invoke("encode", str(tmp_path / "c.yaml"))
        assert code == 2 and "Traceback" not in err
        assert f"(weights_file {tmp_path / 'w.npz'}, array '{array}')" in err, err
        assert words in err, err


@pytest.mark.parametrize(
    ("array", "why"),
    [
        ("encoder.0.ffn.b_1.", "an empty part between its dots"),
        ("encoder.0..ffn.b_1", "an empty part between its dots"),
        ("", "an empty name"),
    ],
)
def test_an_array_name_with_an_empty_part_is_refused_naming_it(
    array: str, why: str, tmp_path: Path
) -> None:
    """`encoder.0.ffn.b_1.` was placed as a mapping {'': ...} below b_1, and refused as
    'weights.encoder.0.ffn.b_1: not a number ... found a mapping'."""
    np.savez(tmp_path / "w.npz", **{array: np.zeros(16)})
    err = _bad_file(tmp_path, lambda p: None)
    assert f"w.npz: array '{array}': not a key path: {why}" in err, err
    assert "expected a key path below weights, such as encoder.0.ffn.W_1" in err, err


def test_an_empty_token_s_embedding_is_read_from_the_npz(tmp_path: Path) -> None:
    """`embeddings.` is the embedding of the token '' (a vocabulary may hold it, as it
    may hold '.' and 'a.b'): it was refused as 'an empty part between its dots'."""
    data = random_config(np.random.default_rng(7), d_model=4, n_heads=2)
    names = {"t3": "", "t4": ".", "t5": "a.b"}
    data["vocab"] = [names.get(t, t) for t in data["vocab"]]
    data["embeddings"] = {names.get(t, t): e for t, e in data["embeddings"].items()}
    data["source"] = [names.get(t, t) for t in data["source"]]
    assert data["source"] == ["a.b", ".", ""]
    full, npz = split(data, tmp_path)
    assert "embeddings." in np.load(tmp_path / "w.npz").files
    a, b = loaded(full), loaded(npz)
    same_trace(a, b)
    assert not b.drawn  # every embedding came from the file


def test_a_config_on_stdin_finds_its_weights_file_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random_config(np.random.default_rng(12), d_model=4, n_heads=2)
    full, npz = split(data, tmp_path)
    monkeypatch.chdir(tmp_path)
    a = runner.invoke(app, ["encode", "-", "--format", "json"], input=npz.read_text())
    b = runner.invoke(app, ["encode", str(full), "--format", "json"])
    assert a.exit_code == 0, a.stderr
    assert yaml.safe_load(a.stdout)["steps"] == yaml.safe_load(b.stdout)["steps"]
    monkeypatch.chdir(tmp_path.parent)
    a = runner.invoke(app, ["encode", "-"], input=npz.read_text())
    assert a.exit_code == 2 and "w.npz: no such file (the weights_file of <stdin>" in a.stderr


def test_a_number_beyond_float32_is_refused_under_dtype_float32(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    b_1 = np.zeros(16)
    b_1[5] = 1e39
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.b_1": b_1})
    assert invoke("encode", str(tmp_path / "c.yaml"))[0] == 0  # float64: a number
    code, _, err = invoke("encode", str(tmp_path / "c.yaml"), "--dtype", "float32")
    assert code == 2
    assert "weights.encoder.0.ffn.b_1.5: beyond the range of float32" in err
    assert "array 'encoder.0.ffn.b_1'" in err


def test_a_token_ending_in_npy_gets_its_own_vector(tmp_path: Path) -> None:
    """Tokens `a` and `a.npy`: numpy.load's npz["embeddings.a.npy"] reads the member
    of that name, the array `embeddings.a`; each must have its own vector."""
    data = random_config(np.random.default_rng(4), d_model=4, n_heads=1)
    rename = {data["vocab"][0]: "a", data["vocab"][1]: "a.npy"}
    data["vocab"] = [rename.get(t, t) for t in data["vocab"]]
    data["embeddings"] = {rename.get(t, t): v for t, v in data["embeddings"].items()}
    data["tokens"] = {k: rename.get(v, v) for k, v in data["tokens"].items()}
    data["source"] = ["a.npy", "a", "a.npy"]
    full, npz = split(data, tmp_path)
    embed = run(loaded(npz)).value("encoder.embed")
    assert embed.tolist() == [data["embeddings"][t] for t in data["source"]]
    same_trace(loaded(full), loaded(npz))


def test_a_header_claiming_gigabytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A version-2.0 .npy header may claim 4 GB; numpy reads all of it before checking
    its length, so a few kB of compressed spaces filled the memory. Refused unread."""
    claimed = 50_000_000
    with (
        zipfile.ZipFile(tmp_path / "w.npz", "w", zipfile.ZIP_DEFLATED) as z,
        z.open("encoder.0.ffn.b_1.npy", "w") as member,
    ):
        member.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", claimed))
        for _ in range(claimed // 1_000_000):
            member.write(b" " * 1_000_000)
    assert (tmp_path / "w.npz").stat().st_size < 1_000_000
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    tracemalloc.start()
    try:
        code, _, err = invoke("encode", str(tmp_path / "c.yaml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and "array 'encoder.0.ffn.b_1': corrupt" in err, err
    assert "an array header of 50,000,000 bytes" in err, err
    assert peak < 10_000_000, peak


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_pipe_as_weights_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO with no writer made open() wait for ever; a zip needs seeking anyway."""
    os.mkfifo(tmp_path / "w.npz")
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "trace_tf", "encode", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        f"trace-tf: error: {tmp_path / 'w.npz'}: not a regular file (a pipe)"
    )
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


W_1 = "weights.encoder.0.ffn.W_1"


def _with_arrays_changed(data: dict[str, Any], d: Path, change: Any) -> Path:
    """The all-YAML config with `change` applied by numpy to its arrays (a mapping of
    key path -> array, written back into the YAML): the independent side of a test."""
    changed = copy.deepcopy(data)
    arrays: dict[str, np.ndarray] = {}
    flatten(changed["weights"], "weights", arrays)
    flatten({"embeddings": changed["embeddings"]}, "", arrays)
    for key, new in change(arrays).items():
        node: Any = changed
        *above, last = key.split(".")
        for part in above:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = np.asarray(new).tolist()
    path = d / "changed.yaml"
    path.write_text(yaml.safe_dump(changed), encoding="utf-8")
    return path


def test_a_set_over_an_npz_array_changes_a_copy_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry, a row and a whole weight set over arrays of the npz: the run is the YAML's
    with numpy's changes; the npz file and the arrays read from it are not modified."""
    data = random_config(np.random.default_rng(21), d_model=4, n_heads=2, d_ff=6)
    _, npz = split(data, tmp_path)
    before = (tmp_path / "w.npz").read_bytes()
    row, whole = [1.0, -2.0, 3.0, -4.0, 5.0, -6.0], np.arange(24.0).reshape(6, 4) / 10
    W_2 = "weights.encoder.0.ffn.W_2"
    sets = [f"{W_1}.0.1=5", f"{W_1}.2={row}", f"{W_2}={whole.tolist()}", "embeddings.t1.3=-7"]

    def change(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w1, t1 = a[W_1].copy(), a["embeddings.t1"].copy()
        w1[0, 1], w1[2, :], t1[3] = 5, row, -7
        return {W_1: w1, W_2: whole, "embeddings.t1": t1}

    expected = loaded(_with_arrays_changed(data, tmp_path, change))
    import trace_tf.config as config_module

    read: list[tuple[np.ndarray, np.ndarray]] = []
    read_npz = config_module.read_npz

    def recording(*args: Any) -> list[tuple[str, Any]]:
        arrays = read_npz(*args)
        read.extend((v, np.array(v, copy=True)) for _, v in arrays)
        return arrays

    monkeypatch.setattr(config_module, "read_npz", recording)
    got = loaded(npz, sets=sets)
    same_trace(expected, got)
    assert got.encoder[0].ffn.W_1[0, 1] == 5 and list(got.encoder[0].ffn.W_1[2]) == row
    # each array as read is untouched (a float64 one is a read-only view of the bytes)
    assert read and all(np.array_equal(v, was) for v, was in read)
    assert (tmp_path / "w.npz").read_bytes() == before
    same_trace(loaded(npz), loaded(tmp_path / "all.yaml"))  # (read again: the file's)
    # H = X W_1 + b_1 by hand, over the FFN's input as traced
    t = run(got)
    x = t.value("encoder.0.self_attn.norm")
    w1 = np.array(data["weights"]["encoder"][0]["ffn"]["W_1"])
    w1[0, 1], w1[2, :] = 5, row
    b1 = np.array(data["weights"]["encoder"][0]["ffn"]["b_1"])
    assert np.allclose(t.value("encoder.0.ffn.hidden"), x @ w1 + b1, rtol=1e-13, atol=1e-13)


def test_a_set_over_an_npz_array_names_both_as_its_source(tmp_path: Path) -> None:
    """The source of an npz array with entries set is the array, then the entries (as a
    YAML weight's); a fused one's heads name the entries in their columns only."""
    data = random_config(np.random.default_rng(22), d_model=4, n_heads=2, fused=True)
    _, npz = split(data, tmp_path)
    name = tmp_path / "w.npz"
    W_q = "weights.encoder.0.self_attn.W_q"
    sets = [f"{W_1}.0.1=5", f"{W_1}.2.0=6", f"{W_q}.1.3=7"]
    cfg = loaded(npz, sets=sets)
    src = cfg.sources[W_1]
    assert src.kind == "npz" and src.array == "encoder.0.ffn.W_1", src
    assert src.text == (
        f"{name}, array 'encoder.0.ffn.W_1'; entries set by --set {W_1}.0.1, --set {W_1}.2.0"
    )
    assert src.partly == (f"--set {W_1}.0.1", f"--set {W_1}.2.0")
    assert cfg.sources[W_q].text == f"{name}, array 'encoder.0.self_attn.W_q'; " + (
        f"entries set by --set {W_q}.1.3"
    )
    head = "weights.encoder.0.self_attn.heads.{}.W_q"
    assert cfg.sources[head.format(0)].partly == ()
    assert cfg.sources[head.format(1)].text == (
        f"columns 2..3 of {W_q} ({name}, array 'encoder.0.self_attn.W_q'; "
        f"entries set by --set {W_q}.1.3)"
    )
    fused = np.array(data["weights"]["encoder"][0]["self_attn"]["W_q"])
    fused[1, 3] = 7
    assert np.array_equal(cfg.encoder[0].self_attn.heads[1].W_q, fused[:, 2:])
    assert np.array_equal(cfg.encoder[0].self_attn.heads[0].W_q, fused[:, :2])
    assert cfg.weights_file_arrays == len(np.load(name).files)
    code, out, err = invoke(
        "weights", str(npz), "--format", "json", *(a for s in sets for a in ("--set", s))
    )
    assert code == 0, err
    assert f"entries set by --set {W_1}.0.1" in out
    # a variant is an override as --set is
    rest = yaml.safe_load(npz.read_text(encoding="utf-8"))
    rest["variants"] = {"v": {f"{W_1}.0.1": 5}}
    npz.write_text(yaml.safe_dump(rest), encoding="utf-8")
    text = loaded(npz, variant="v").sources[W_1].text
    assert text == f"{name}, array 'encoder.0.ffn.W_1'; entries set by variant 'v'"


def test_a_set_over_an_npz_array_is_checked_as_over_the_yaml_s(tmp_path: Path) -> None:
    """Shapes and numbers of what a --set writes over an npz array are checked, naming
    the --set (before, any --set of an npz array was refused as given twice)."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.b_1": np.zeros(16)})
    b_1 = "weights.encoder.0.ffn.b_1"
    for value, message in [
        (f"{b_1}=[1]", f"{b_1}: wrong shape (set by --set {b_1}); expected shape 16 (d_ff)"),
        (f"{b_1}.16=1", f"{b_1}.16: no such entry (set by --set {b_1}.16); expected indices"),
        (f"{b_1}.3=x", f"{b_1}.3: not a number (set by --set {b_1}.3)"),
        (f"{b_1}.3.0=1", f"{b_1}.3.0: no such entry (set by --set {b_1}.3.0)"),
    ]:
        code, _, err = invoke("encode", str(config), "--set", value)
        assert code == 2, err
        assert message in err and "given twice" not in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    b = loaded(config, sets=[f"{b_1}.3=1"]).encoder[0].ffn.b_1
    assert b is not None and list(b) == [0, 0, 0, 1] + [0] * 12


def test_diff_set_b_over_an_npz_array(tmp_path: Path) -> None:
    data = random_config(np.random.default_rng(23), d_model=4, n_heads=1)
    _, npz = split(data, tmp_path)
    code, out, err = invoke("diff", str(npz), "--set-b", f"{W_1}.1.2=9", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["first_difference"] == "encoder.0.ffn.hidden", result
    # column 2 of H = X W_1 changes by (9 − W_1[1, 2]) x[:, 1]: by numpy
    hidden = next(s for s in result["steps"] if s["path"] == "encoder.0.ffn.hidden")
    a = run(loaded(npz))
    change = (9 - data["weights"]["encoder"][0]["ffn"]["W_1"][1][2]) * a.value(
        "encoder.0.self_attn.norm"
    )[:, 1]
    assert np.isclose(hidden["max_abs_diff"], np.abs(change).max(), rtol=1e-12)


def test_an_entry_of_a_gaussian_w_the_npz_gives_as_one_number_says_so(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 2, score: gaussian}\nsource: [[1, 2]]\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    np.savez(tmp_path / "w.npz", **{"encoder.0.self_attn.heads.0.w": np.float64(2)})
    w = "weights.encoder.0.self_attn.heads.0.w"
    code, _, err = invoke("encode", str(config), "--set", f"{w}.0=3")
    assert code == 2, err
    assert f"{w}: w is a single number here, with no entries to set (from weights_file" in err
    assert "expected a single number" in err, err
    w_set = loaded(config, sets=[f"{w}=3"]).encoder[0].self_attn.heads[0].score.w  # type: ignore[union-attr]
    assert w_set == 3


@pytest.mark.parametrize("vocab", ["vocab: [x, x.y]\n", ""], ids=["vocab", "no-vocab"])
@pytest.mark.parametrize(
    ("sets", "x", "xy"),
    [
        (["embeddings.x.0=5"], [5, 2], [3, 4]),  # (was: 'embeddings.x.y: no such entry')
        (["embeddings.x=[5, 6]"], [5, 6], [3, 4]),
        (["embeddings.x=[7, 7]", "embeddings.x.0=5"], [5, 7], [3, 4]),
        (["embeddings.x=[5, 6]", "embeddings.x.y.1=-4"], [5, 6], [3, -4]),  # (x.y was drawn)
        (["embeddings.x.y.1=-4", "embeddings.x=[5, 6]"], [5, 6], [3, -4]),
        (["embeddings.x.0=5", "embeddings.x.y.1=-4"], [5, 2], [3, -4]),
        (["embeddings.x.y.0=5"], [1, 2], [5, 4]),  # (no vocab: 'x.y.0: no such entry')
        (["embeddings.x.y=[5, 6]"], [1, 2], [5, 6]),
        (["embeddings.x.y.1=-4", "embeddings.x.0=7"], [7, 2], [3, -4]),
        (["embeddings.x.0=7", "embeddings.x.y.1=-4"], [7, 2], [3, -4]),  # (x: a list first)
    ],
)
def test_a_set_below_a_token_that_begins_another_leaves_the_other_the_npz_s(
    tmp_path: Path, vocab: str, sets: list[str], x: list[float], xy: list[float]
) -> None:
    """Tokens `x` and `x.y` from the npz: a --set of `x` or of its entries is not inside
    `x.y` (a key path below embeddings is not a prefix of the text), so neither is
    refused nor the npz's `x.y` dropped for a drawn one. With no vocab in the YAML the
    tokens are the npz's, and keys are read against them as against a vocab (README:
    the longest token the key goes on with is one part)."""
    np.savez(tmp_path / "w.npz", **{"embeddings.x": [1.0, 2.0], "embeddings.x.y": [3.0, 4.0]})
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {{d_model: 2, n_heads: 1, decoder_layers: 0}}\n{vocab}"
        "source: [x, x.y]\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    before = (tmp_path / "w.npz").read_bytes()
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = invoke("step", str(config), *args, "--stage", "embed", "--format", "json")
    assert code == 0, err
    (step,) = json.loads(out)["steps"]
    assert step["value"] == [x, xy]  # (embed: the rows of the embeddings, unscaled)
    code, out, err = invoke("weights", str(config), *args, "--format", "json")
    assert code == 0, err
    source = {w["path"]: w for w in json.loads(out)["weights"]}["embeddings.x.y"]
    if "embeddings.x.y=[5, 6]" in sets:  # (set whole: none of the npz's numbers left)
        assert source["kind"] == "set", source
    else:
        assert source["kind"] == "npz" and source["array"] == "embeddings.x.y", source
        entries = [f"--set {k.partition('=')[0]}" for k in sets if k.startswith("embeddings.x.y.")]
        assert source.get("partly", []) == entries, source
    assert (tmp_path / "w.npz").read_bytes() == before


@pytest.mark.parametrize(
    "sets",
    [
        ["weights.encoder.0.ffn={}"],  # (the npz's W_1 was kept)
        ["weights.encoder.0.ffn={}", "weights.encoder.0.ffn.W_1.0.1=5"],  # (drawn: as now)
        ["weights.encoder.0.ffn=null"],
        ["weights.encoder.0={}"],
        ["weights=null"],
        ["embeddings={b: [1, 2, 3, 4]}"],  # (a kept, unlike a YAML's a)
    ],
)
def test_a_set_above_an_npz_array_stands_over_it_as_over_the_yaml_s(
    tmp_path: Path, sets: list[str]
) -> None:
    """An override of a key above arrays of the npz replaces them as it replaces the
    YAML's: what it does not give is drawn by SPEC's rule, whether or not an entry is
    set below it too (before, the npz's arrays stayed unless an entry was set)."""
    rng = np.random.default_rng(5)
    W_1, W_2, a = rng.standard_normal((4, 6)), rng.standard_normal((6, 4)), rng.standard_normal(4)
    np.savez(
        tmp_path / "w.npz",
        **{"encoder.0.ffn.W_1": W_1, "encoder.0.ffn.W_2": W_2, "embeddings.a": a},
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 4, n_heads: 2, d_ff: 6, decoder_layers: 0, seed: 9}\n"
        "vocab: [a, b]\nsource: [a, b]\nweights_file: w.npz\n",
        encoding="utf-8",
    )

    def drawn(path: str, shape: tuple[int, ...]) -> np.ndarray:
        import zlib

        return np.random.default_rng([9, zlib.crc32(path.encode())]).standard_normal(shape)

    cfg = loaded(config, sets=sets)
    ffn = cfg.encoder[0].ffn
    if sets[0].startswith("embeddings"):
        assert np.array_equal(ffn.W_1, W_1) and np.array_equal(ffn.W_2, W_2)
        assert np.array_equal(cfg.embeddings["a"], drawn("embeddings.a", (4,)))
        assert list(cfg.embeddings["b"]) == [1, 2, 3, 4]
        return
    want = drawn("encoder.0.ffn.W_1", (4, 6))
    if len(sets) > 1:
        want[0, 1] = 5
    assert np.array_equal(ffn.W_1, want)
    assert np.array_equal(ffn.W_2, drawn("encoder.0.ffn.W_2", (6, 4)))
    assert np.array_equal(cfg.embeddings["a"], a)


def test_a_set_above_made_before_the_weights_file_is_named_leaves_its_arrays(
    tmp_path: Path,
) -> None:
    """`weights: null` then `weights_file: w.npz` (a variant that swaps the YAML's
    weights for the npz's, or two --set in that order): the npz fills what is not given."""
    W = np.arange(24.0).reshape(4, 6) / 7
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": W})
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 4, n_heads: 2, d_ff: 6, decoder_layers: 0}\n"
        "source: [[1, 2, 3, 4]]\nweights: {encoder: [{ffn: {W_1: "
        + str(np.ones((4, 6)).tolist())
        + "}}]}\nvariants: {npz: {weights: null, weights_file: w.npz}}\n",
        encoding="utf-8",
    )
    entry = W.copy()
    entry[0, 1] = 5
    for cfg, want in (
        (loaded(config, variant="npz"), W),
        (loaded(config, sets=["weights=null", "weights_file=w.npz"]), W),
        (loaded(config, sets=["weights=null", "weights_file=w.npz", f"{W_1}.0.1=5"]), entry),
    ):
        assert np.array_equal(cfg.encoder[0].ffn.W_1, want)
    # after the weights_file is named, the override stands over the array: drawn
    cfg = loaded(config, sets=["weights_file=w.npz", "weights=null"])
    assert not np.array_equal(cfg.encoder[0].ffn.W_1, W)
    assert cfg.sources[W_1].kind == "drawn"


def test_an_entry_set_over_a_nan_of_the_npz_replaces_it(tmp_path: Path) -> None:
    """The npz's array is checked once the entries are written over it, as the YAML's is:
    a NaN an entry (or row) replaces is gone; one left is named as the array's (before,
    its first NaN was refused as set by the --set, even where the --set replaced it)."""
    W = np.arange(16.0).reshape(4, 4)
    W[0, 1] = np.nan
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": W})
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 4, n_heads: 1, d_ff: 4, decoder_layers: 0}\n"
        "source: [[1, 2, 3, 4]]\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    entry, row = W.copy(), W.copy()
    entry[0, 1], row[0] = 5, 5
    for set_, want in ((f"{W_1}.0.1=5", entry), (f"{W_1}.0=[5, 5, 5, 5]", row)):
        assert np.array_equal(loaded(config, sets=[set_]).encoder[0].ffn.W_1, want)
    code, _, err = invoke("encode", str(config), "--set", f"{W_1}.1.1=5")
    assert code == 2, err
    assert f"{W_1}.0.1: not a finite number (from weights_file" in err, err
    assert "set by --set" not in err, err


def _dotted_npz_config(tmp_path: Path, extra: str = "") -> Path:
    """No vocab in the YAML; the npz gives tokens x and x.y (x.y holding a dot)."""
    arrays = {"embeddings.x": [1.0, 2.0], "embeddings.x.y": [3.0, 4.0]}
    np.savez(tmp_path / "w.npz", **arrays)  # type: ignore[arg-type]
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 2, n_heads: 1, d_ff: 4, decoder_layers: 0}\nsource: [x, x.y]\n"
        "weights_file: w.npz\n" + extra,
        encoding="utf-8",
    )
    return config


def test_a_variant_setting_below_a_token_with_dots_only_the_npz_gives_reads_it(
    tmp_path: Path,
) -> None:
    """A variant's keys below embeddings are read against the npz's tokens as a --set's
    are: {embeddings.x.0: 7, embeddings.x.y.1: -4} sets entry 0 of x and entry 1 of x.y
    (before, the variant was applied before the npz was read: 'embeddings.x is a list')."""
    config = _dotted_npz_config(
        tmp_path, "variants:\n  v:\n    embeddings.x.0: 7\n    embeddings.x.y.1: -4\n"
    )
    for extra in ([], ["--set", "embeddings.x.1=8"]):
        args = ["--variant", "v", *extra, "--stage", "embed", "--format", "json"]
        code, out, err = invoke("step", str(config), *args)
        assert code == 0, err
        (step,) = json.loads(out)["steps"]
        assert step["value"] == [[7, 8 if extra else 2], [3, -4]]


def test_a_bad_set_is_said_not_one_below_a_token_only_the_npz_gives(tmp_path: Path) -> None:
    """--set embeddings.x.0=7 --set embeddings.x.y.1=-4 is right (x.y is the npz's); a
    bad --set after them is the error said (before: the overrides re-applied without the
    npz's tokens blamed the good embeddings.x.y.1, 'embeddings.x is a list')."""
    config = _dotted_npz_config(tmp_path)
    sets = ["embeddings.x.0=7", "embeddings.x.y.1=-4", "model.d_ff.q=1"]
    code, _, err = invoke("encode", str(config), *[a for s in sets for a in ("--set", s)])
    assert code == 2, err
    assert "model.d_ff.q: model.d_ff is not a mapping or list" in err, err
    assert "embeddings.x is a list" not in err, err


def test_a_bad_set_below_embeddings_is_said_before_a_missing_npz(tmp_path: Path) -> None:
    """The overrides are applied before the weights_file is read: a --set that cannot be
    applied (embeddings.a.0.q, a.0 being a number of the YAML) is the error said, as a
    --set above embeddings is, not the npz that is missing (before: 'no such file')."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {d_model: 2, n_heads: 1, decoder_layers: 0}\nvocab: [a]\n"
        "embeddings: {a: [1, 2]}\nsource: [a]\nweights_file: missing.npz\n",
        encoding="utf-8",
    )
    for key in ("embeddings.a.0.q", "model.d_model.q"):
        code, _, err = invoke("encode", str(config), "--set", f"{key}=1")
        assert code == 2, err
        assert f"--set: {key}: " in err and "no such file" not in err, err
    code, _, err = invoke("encode", str(config), "--set", "embeddings.a.0=3")
    assert code == 2, err
    assert "missing.npz: no such file" in err, err


@pytest.mark.parametrize("npz", [False, True])
def test_entries_are_named_in_the_order_set_where_one_filled_an_entry_left_empty(
    tmp_path: Path, npz: bool
) -> None:
    """A variant setting entry 1 of x.y adds entry 0 empty; a --set of entry 0 then sets
    it: the sources name the variant, then the --set, as they were applied (before: the
    --set in the place of the empty entry, first). In a YAML's drawn embedding too."""
    body = "variants:\n  v:\n    embeddings.x.y.1: -4\n"
    if npz:
        config = _dotted_npz_config(tmp_path, body)
    else:
        config = tmp_path / "c.yaml"
        config.write_text(
            "model: {d_model: 2, n_heads: 1, d_ff: 4, decoder_layers: 0}\n"
            "vocab: [x, x.y]\nsource: [x, x.y]\n" + body,
            encoding="utf-8",
        )
    cfg = loaded(config, sets=["embeddings.x.y.0=0.5"], variant="v")
    assert cfg.sources["embeddings.x.y"].partly == ("variant 'v'", "--set embeddings.x.y.0")
    assert np.array_equal(cfg.embeddings["x.y"], [0.5, -4.0])
    sets = ["embeddings.x.y.1=-4", "embeddings.x.y.0=0.5"]
    partly = loaded(config, sets=sets).sources["embeddings.x.y"].partly
    assert partly == ("--set embeddings.x.y.1", "--set embeddings.x.y.0")


def test_cost_vary_reads_a_set_below_a_token_only_the_npz_gives(tmp_path: Path) -> None:
    """`cost --vary L` applies the --set again to repeat the tokens: it reads a key below
    embeddings against the npz's tokens as build does (before: embeddings.x.y.0 was read
    as x, y, 0, and x.y's array then refused: 'embeddings.x.y.0: no such entry')."""
    config = _dotted_npz_config(tmp_path)
    for sets in (["embeddings.x.y.0=9"], ["embeddings.x.0=7", "embeddings.x.y.1=-4"]):
        args = [a for s in sets for a in ("--set", s)]
        code, out, err = invoke("cost", str(config), *args, "--vary", "L=2,4")
        assert code == 0, err
        assert "growth exponent over L" in out, out
