"""A corpus of bad inputs (issue 5, SPEC section 6): each one must exit 2 with one line on
stderr naming the file, the key path and (where the YAML parser knows it) the line, what
was expected and what was found; never a traceback, never a word on stdout, and the
input file is left exactly as it was.

The expected line of each case is found in the case's own text (`at(text, needle)`),
and the expected shapes follow from the model sizes the text declares.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import load
from trace_tf.errors import InputError
from trace_tf.loader import FLOAT64_MOST
from trace_tf.runner import run

runner = CliRunner()


@dataclass(frozen=True)
class Bad:
    """One bad input: a file's content and a command line (`{file}` is the file's path)."""

    text: str | bytes | None  # None: no file is written
    path: str | None  # the key path the message must name
    line: int | None  # the line it must name, when the YAML parser knows it
    says: tuple[str, ...] = ()  # message, expected and found parts
    args: tuple[str, ...] = ("encode", "{file}")
    names: str = "{file}"  # what the message must name as its source


def at(text: str, needle: str, nth: int = 1) -> int:
    """The 1-based line of the nth line of `text` containing `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[nth - 1]


def case(
    id: str,
    text: str | bytes | None,
    path: str | None,
    line: int | str | None,
    *says: str,
    args: tuple[str, ...] = ("encode", "{file}"),
    names: str = "{file}",
) -> object:
    """A pytest param; `line` given as a string is the needle whose line is meant."""
    if isinstance(line, str):
        assert isinstance(text, str)
        line = at(text, line)
    return pytest.param(Bad(text, path, line, says, args, names), id=id)


# Line 1-5; appended text starts on line 6.
BASE = "model:\n  d_model: 4\n  n_heads: 2\nvocab: [a, b, c]\nsource: [a, b]\n"
# Every size different, so each weight's expected shape is its own: d_k 3, d_v 5, d_ff 6.
SIZES = (
    "model:\n  d_model: 4\n  n_heads: 2\n  d_k: 3\n  d_v: 5\n  d_ff: 6\n"
    "vocab: [a, b, c]\nsource: [a, b]\n"
)
ENC_DEC = (
    "model:\n  d_model: 4\n  n_heads: 2\n  decoder_layers: 1\n"
    "vocab: [a, b, c, S]\ntokens: {bos: S}\nsource: [a, b]\ntarget: [S, a]\n"
)
DEC_ONLY = "model: {d_model: 4, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, b]\ntarget: [a]\n"
PRE = BASE.replace("n_heads: 2", "n_heads: 2\n  norm_position: pre")
GATED = SIZES.replace("d_ff: 6", "d_ff: 6\n  activation: swiglu")


def _indent(body: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in body.splitlines())


def attn(body: str, base: str = SIZES, block: str = "self_attn", stack: str = "encoder") -> str:
    """`body` (lines of YAML) as the first attention block of the first layer."""
    return base + f"weights:\n  {stack}:\n    - {block}:\n" + _indent(body, 8)


def ffn(body: str, base: str = SIZES) -> str:
    return base + "weights:\n  encoder:\n    - ffn:\n" + _indent(body, 8)


M22 = "[[1, 2], [3, 4]]"  # a 2 x 2 matrix: the wrong shape for every weight below
V2 = "[1, 2]"
M4x12 = str([[0] * 12] * 4)  # the right shape of a fused W_k of 4 heads of d_k 3, d_model 4


def wrong_shape(id: str, text: str, path: str, needle: str, expected: str, found: str) -> object:
    return case(id, text, path, needle, "wrong shape", f"expected {expected}, found {found}")


SHAPES = [
    # per-head weights and biases (d_model 4, d_k 3, d_v 5)
    *(
        wrong_shape(
            f"head-{k}",
            attn(f"heads:\n  - {{{k}: {M22}}}"),
            f"weights.encoder.0.self_attn.heads.0.{k}",
            k,
            f"shape 4 x {n} (d_model x {dim})",
            "shape 2 x 2",
        )
        for k, n, dim in (("W_q", 3, "d_k"), ("W_k", 3, "d_k"), ("W_v", 5, "d_v"))
    ),
    *(
        wrong_shape(
            f"head-{k}",
            attn(f"heads:\n  - {{{k}: {V2}}}"),
            f"weights.encoder.0.self_attn.heads.0.{k}",
            k,
            f"shape {n} ({dim})",
            "shape 2",
        )
        for k, n, dim in (("b_q", 3, "d_k"), ("b_k", 3, "d_k"), ("b_v", 5, "d_v"))
    ),
    # fused weights and biases: n_heads 2 side by side
    *(
        wrong_shape(
            f"fused-{k}",
            attn(f"{k}: {M22}"),
            f"weights.encoder.0.self_attn.{k}",
            k,
            f"shape 4 x {n} (d_model x n_heads·{dim})",
            "shape 2 x 2",
        )
        for k, n, dim in (("W_q", 6, "d_k"), ("W_k", 6, "d_k"), ("W_v", 10, "d_v"))
    ),
    *(
        wrong_shape(
            f"fused-{k}",
            attn(f"{k}: {V2}"),
            f"weights.encoder.0.self_attn.{k}",
            k,
            f"shape {n} (n_heads·{dim})",
            "shape 2",
        )
        for k, n, dim in (("b_q", 6, "d_k"), ("b_k", 6, "d_k"), ("b_v", 10, "d_v"))
    ),
    wrong_shape(
        "W_o",
        attn(f"W_o: {M22}"),
        "weights.encoder.0.self_attn.W_o",
        "W_o",
        "shape 10 x 4 (n_heads·d_v x d_model)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "b_o",
        attn(f"b_o: {V2}"),
        "weights.encoder.0.self_attn.b_o",
        "b_o",
        "shape 4 (d_model)",
        "shape 2",
    ),
    *(
        wrong_shape(
            f"attn-norm-{k}",
            attn(f"norm: {{{k}: {V2}}}"),
            f"weights.encoder.0.self_attn.norm.{k}",
            "norm",
            "shape 4 (d_model)",
            "shape 2",
        )
        for k in ("gamma", "beta")
    ),
    *(
        wrong_shape(
            f"ffn-norm-{k}",
            ffn(f"norm: {{{k}: [1, 2, 3]}}"),
            f"weights.encoder.0.ffn.norm.{k}",
            "norm",
            "shape 4 (d_model)",
            "shape 3",
        )
        for k in ("gamma", "beta")
    ),
    wrong_shape(
        "ffn-W_1",
        ffn(f"W_1: {M22}"),
        "weights.encoder.0.ffn.W_1",
        "W_1",
        "shape 4 x 6 (d_model x d_ff)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "ffn-b_1",
        ffn(f"b_1: {V2}"),
        "weights.encoder.0.ffn.b_1",
        "b_1",
        "shape 6 (d_ff)",
        "shape 2",
    ),
    wrong_shape(
        "ffn-W_2",
        ffn(f"W_2: {M22}"),
        "weights.encoder.0.ffn.W_2",
        "W_2",
        "shape 6 x 4 (d_ff x d_model)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "ffn-b_2",
        ffn(f"b_2: {V2}"),
        "weights.encoder.0.ffn.b_2",
        "b_2",
        "shape 4 (d_model)",
        "shape 2",
    ),
    # a gated FFN's up projection (model.activation swiglu / geglu)
    wrong_shape(
        "ffn-W_3",
        ffn(f"W_3: {M22}", GATED),
        "weights.encoder.0.ffn.W_3",
        "W_3",
        "shape 4 x 6 (d_model x d_ff)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "ffn-b_3",
        ffn(f"b_3: {V2}", GATED.replace("swiglu", "geglu")),
        "weights.encoder.0.ffn.b_3",
        "b_3",
        "shape 6 (d_ff)",
        "shape 2",
    ),
    wrong_shape(
        "cross-attn-W_k",
        attn(f"heads:\n  - {{W_k: {M22}}}", ENC_DEC, "cross_attn", "decoder"),
        "weights.decoder.0.cross_attn.heads.0.W_k",
        "W_k",
        "shape 4 x 2 (d_model x d_k)",
        "shape 2 x 2",
    ),
    *(
        wrong_shape(
            f"encoder-final-norm-{k}",
            PRE + f"weights:\n  encoder_final_norm: {{{k}: {V2}}}\n",
            f"weights.encoder_final_norm.{k}",
            "encoder_final_norm",
            "shape 4 (d_model)",
            "shape 2",
        )
        for k in ("gamma", "beta")
    ),
    wrong_shape(
        "decoder-embed-norm",
        DEC_ONLY.replace("decoder_layers: 1", "decoder_layers: 1, embed_norm: true")
        + f"weights:\n  decoder_embed_norm: {{beta: {V2}}}\n",
        "weights.decoder_embed_norm.beta",
        "decoder_embed_norm",
        "shape 4 (d_model)",
        "shape 2",
    ),
    wrong_shape(
        "decoder-final-norm",
        ENC_DEC.replace("decoder_layers: 1", "decoder_layers: 1\n  final_norm: true")
        + f"weights:\n  decoder_final_norm: {{gamma: {V2}}}\n",
        "weights.decoder_final_norm.gamma",
        "decoder_final_norm",
        "shape 4 (d_model)",
        "shape 2",
    ),
    wrong_shape(
        "positional",
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: learned\n  max_len: 3")
        + f"weights:\n  positional: {M22}\n",
        "weights.positional",
        "positional: [[",
        "shape 3 x 4 (max_len x d_model)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "output-W",
        BASE + f"weights:\n  output: {{W: {M22}}}\n",
        "weights.output.W",
        "output",
        "shape 4 x 3 (d_model x vocab size)",
        "shape 2 x 2",
    ),
    wrong_shape(
        "output-b",
        BASE + f"weights:\n  output: {{b: {V2}}}\n",
        "weights.output.b",
        "output",
        "shape 3 (vocab size)",
        "shape 2",
    ),
    wrong_shape(
        "embedding",
        BASE + f"embeddings:\n  b: {V2}\n",
        "embeddings.b",
        "b: [1",
        "shape 4 (d_model)",
        "shape 2",
    ),
    case(
        "numeric-source",
        BASE.replace("source: [a, b]", f"source: {M22}"),
        "source",
        "source",
        "wrong shape for a numeric sequence",
        "expected shape L x 4 (d_model 4), found shape 2 x 2",
    ),
    case(
        "numeric-target",
        ENC_DEC.replace("target: [S, a]", "target: [[1, 2, 3]]"),
        "target",
        "target",
        "expected shape L x 4 (d_model 4), found shape 1 x 3",
        args=("decode", "{file}"),
    ),
    case(
        "numeric-source-no-columns",
        BASE.replace("source: [a, b]", "source: [[]]"),
        "source",
        "source",
        "found shape 1 x 0",
    ),
    wrong_shape(
        "scalar-for-a-matrix",
        attn("W_o: 3"),
        "weights.encoder.0.self_attn.W_o",
        "W_o",
        "shape 10 x 4 (n_heads·d_v x d_model)",
        "shape scalar",
    ),
    wrong_shape(
        "3-D-for-a-matrix",
        attn("W_o: [[[1]]]"),
        "weights.encoder.0.self_attn.W_o",
        "W_o",
        "shape 10 x 4 (n_heads·d_v x d_model)",
        "shape 1 x 1 x 1",
    ),
    wrong_shape(
        "empty-matrix",
        attn("W_o: []"),
        "weights.encoder.0.self_attn.W_o",
        "W_o",
        "shape 10 x 4 (n_heads·d_v x d_model)",
        "shape 0",
    ),
]

MALFORMED = [
    case("unclosed-flow", "model: {d_model: 4\nsource: [a]\n", None, 2, "malformed YAML"),
    case("bad-indent", "model:\n  d_model: 4\n n_heads: 2\n", None, 3, "malformed YAML"),
    case(
        "tab-indent",
        "model:\n\td_model: 4\n",
        None,
        2,
        "malformed YAML",
        "tabs cannot indent YAML; use spaces",
    ),
    case(
        "tab-indenting-a-later-line",
        "model:\n  d_model: 4\n\tn_heads: 2\n",
        None,
        3,
        "tabs cannot indent YAML",
    ),
    case("extra-bracket", "vocab: [a, b]]\nmodel: {d_model: 4}\n", None, 1, "malformed YAML"),
    case(
        "unterminated-string",
        'title: "abc\nmodel: {d_model: 4}\n',
        None,
        None,
        "malformed YAML",
    ),
    # A \u escape of a UTF-16 surrogate: libyaml refuses it; PyYAML's Python parser made
    # a str that no output could encode, an internal error (exit 3) when shown or drawn.
    *(
        case(
            f"surrogate-escape-{where}",
            BASE + text,
            path,
            text.split(":")[0],
            f"a \\u escape of a UTF-16 surrogate in {shown}",
            f"found U+{code}",
        )
        for where, text, path, shown, code in (
            ("token", 'tokens: {bos: "\\ud800"}\n', "tokens.bos", "'\\ud800'", "D800"),
            ("title", 'title: "x \\udcff"\n', "title", "'x \\udcff'", "DCFF"),
            ("pair", 'title: "\\ud83d\\ude00"\n', "title", "'\\ud83d\\ude00'", "D83D"),
        )
    ),
    case(
        "two-documents",
        "model: {d_model: 4}\n---\nmodel: {d_model: 5}\n",
        None,
        2,
        "malformed YAML: expected a single document in the stream, but found another document",
    ),
    case("undefined-alias", "model: *nope\n", None, 1, "malformed YAML", "undefined alias"),
    case(
        "merge-key",
        "base: &b {d_model: 4}\nmodel:\n  <<: *b\n",
        "model",
        3,
        "merge keys (<<) are not supported",
    ),
    case("complex-key", "? [a, b]\n: 1\n", None, 1, "a mapping key must be a plain scalar"),
    case("recursive-alias", "model: &a [*a]\n", "model.0", 1, "recursive YAML alias"),
    case(
        "too-deep",
        "model: " + "[" * 5000 + "]" * 5000 + "\n",
        None,
        1,
        "nests too deeply",
        "expected at most 64 nested lists or mappings",
    ),
    case(
        "too-deep-block-style",
        "model:\n" + "".join(" " * i + "- \n" for i in range(1, 3000)),
        None,
        65,  # line n opens level n: the mapping is level 1, the sequences follow
        "nests too deeply",
    ),
    case(
        "deeper-than-64",  # few brackets: composed by libyaml, then measured, with its line
        "model:\n  d_model: " + "[" * 200 + "]" * 200 + "\n",
        None,
        2,
        "nests too deeply",
        "expected at most 64 nested lists or mappings, found more than 64 levels",
    ),
    case(
        "integer-beyond-float64",
        BASE + "embeddings:\n  a: [1, 2, 3, " + "9" * 400 + "]\n",
        "embeddings.a.3",
        7,
        "integer too large",
        "found an integer of 400 characters",
    ),
    case(
        "bad-explicit-int",
        "model: {d_model: !!int four}\n",
        "model.d_model",
        1,
        "not a valid int",
        "found 'four'",
    ),
]

DUPLICATES = [
    case(
        "duplicate-top",
        BASE + "vocab: [a]\n",
        "vocab",
        6,
        "duplicate key 'vocab' (first given on line 4)",
    ),
    case(
        "duplicate-model",
        "model:\n  d_model: 4\n  d_model: 2\n",
        "model.d_model",
        3,
        "duplicate key 'd_model' (first given on line 2)",
    ),
    case(
        "duplicate-flow",
        "model: {d_model: 4, n_heads: 1, d_model: 4}\n",
        "model.d_model",
        1,
        "duplicate key 'd_model' (first given on line 1)",
    ),
    case(
        "duplicate-head-weight",
        attn("heads:\n  - W_q: [[1]]\n    W_q: [[2]]"),
        "weights.encoder.0.self_attn.heads.0.W_q",
        at(attn("heads:\n  - W_q: [[1]]\n    W_q: [[2]]"), "W_q", 2),
        "duplicate key 'W_q'",
    ),
    case(
        "duplicate-layer-block",
        SIZES + "weights:\n  encoder:\n    - ffn: {}\n      ffn: {}\n",
        "weights.encoder.0.ffn",
        12,
        "duplicate key 'ffn' (first given on line 11)",
    ),
    case(
        "duplicate-embedding",
        BASE + "embeddings:\n  a: [1, 2, 3, 4]\n  a: [1, 2, 3, 4]\n",
        "embeddings.a",
        8,
        "duplicate key 'a' (first given on line 7)",
    ),
    case(
        "duplicate-expect-field",
        BASE + "expect:\n  - {step: encoder.output, step: encoder.input, value: 1}\n",
        "expect.0.step",
        7,
        "duplicate key 'step'",
    ),
    case(
        "duplicate-number-keys",  # 1 and 1.0 are the same token
        "model: {d_model: 2}\nvocab: [1, b]\nembeddings:\n  1: [1, 2]\n  1.0: [1, 2]\nsource: [1]\n",
        "embeddings.1",
        5,
        "duplicate key '1' (first given on line 4)",
    ),
]

RAGGED = [
    case(
        "ragged-W_o",
        attn("W_o: [[1, 2, 3, 4], [1, 2, 3]]"),
        "weights.encoder.0.self_attn.W_o.1",
        "W_o",
        "ragged matrix: rows differ in length",
        "expected shape 4 like row 0, found shape 3",
    ),
    case(
        "ragged-fused-W_q",
        attn("W_q: [[1, 2, 3, 4, 5, 6], [1]]"),
        "weights.encoder.0.self_attn.W_q.1",
        "W_q",
        "ragged matrix",
        "found shape 1",
    ),
    case(
        "ragged-source",
        BASE.replace("source: [a, b]", "source: [[1, 2, 3, 4], [1, 2]]"),
        "source.1",
        5,
        "ragged matrix",
    ),
    case(
        "list-among-numbers",
        BASE + "embeddings:\n  a: [1, [2], 3, 4]\n",
        "embeddings.a.1",
        7,
        "ragged matrix: a list among numbers",
        "found a list of 1",
    ),
]

NOT_NUMBERS = [
    case(
        "string-in-matrix",
        attn("heads:\n  - {W_q: [[1, x, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]]}"),
        "weights.encoder.0.self_attn.heads.0.W_q.0.1",
        "W_q",
        "not a number",
        "expected a number, found the string 'x'",
    ),
    case(
        "boolean-in-vector",
        BASE + "embeddings:\n  a: [1, true, 3, 4]\n",
        "embeddings.a.1",
        7,
        "found a boolean (true)",
    ),
    case(
        "null-in-vector",
        BASE + "embeddings:\n  a: [1, ~, 3, 4]\n",
        "embeddings.a.1",
        7,
        "expected a number, found null",
    ),
    case(
        "null-row",
        attn("W_o: [[1, 2, 3, 4], null]"),
        "weights.encoder.0.self_attn.W_o.1",
        "W_o",
        "found null",
    ),
    case(
        "string-for-a-matrix",
        attn("W_o: hello"),
        "weights.encoder.0.self_attn.W_o",
        "W_o",
        "found the string 'hello'",
    ),
    case(
        "mapping-for-a-vector",
        attn("norm: {gamma: {a: 1}}"),
        "weights.encoder.0.self_attn.norm.gamma",
        "gamma",
        "expected a number, found a mapping",
    ),
    case(
        "d_model-word",
        "model: {d_model: four}\n",
        "model.d_model",
        1,
        "expected a whole number, found the string 'four'",
    ),
    case(
        "d_model-boolean",
        "model: {d_model: true}\n",
        "model.d_model",
        1,
        "found a boolean (true)",
    ),
    case("d_model-null", "model: {d_model: null}\n", "model.d_model", 1, "found null"),
    case(
        "d_model-fraction",
        "model: {d_model: 4.5}\n",
        "model.d_model",
        1,
        "not a whole number",
        "found the number 4.5",
    ),
    case(
        "scale-yes",
        BASE.replace("n_heads: 2", "n_heads: 2\n  scale: yes"),
        "model.scale",
        4,
        "expected a positive number or sqrt_dk, found the string 'yes'",
    ),
    case(
        "norm_eps-quoted",
        BASE.replace("n_heads: 2", "n_heads: 2\n  norm_eps: '1e-5'"),
        "model.norm_eps",
        4,
        "expected a number, found the string '1e-5'",
    ),
    case(
        "final_norm-number",
        BASE.replace("n_heads: 2", "n_heads: 2\n  final_norm: 1"),
        "model.final_norm",
        4,
        "expected true or false, found the number 1",
    ),
    case(
        "tie_embeddings-yes",
        BASE.replace("n_heads: 2", "n_heads: 2\n  tie_embeddings: yes"),
        "model.tie_embeddings",
        4,
        "expected true or false, found the string 'yes'",
    ),
    case(
        "atol-word",
        BASE + "expect:\n  - {step: encoder.output, value: 1, atol: tight}\n",
        "expect.0.atol",
        7,
        "found the string 'tight'",
        args=("check", "{file}"),
    ),
    case(
        "vocab-mapping",
        "model: {d_model: 2}\nvocab: {a: 1}\nsource: [a]\n",
        "vocab",
        2,
        "expected a list of tokens, found a mapping",
    ),
    case(
        "model-list",
        "model: [1, 2]\n",
        "model",
        1,
        "not a mapping",
        "expected a mapping of keys, found a list of 2",
    ),
]

NON_FINITE = [
    *(
        case(
            f"embedding-{name}",
            BASE + f"embeddings:\n  a: [1, {lit}, 3, 4]\n",
            "embeddings.a.1",
            7,
            "not a finite number",
            f"expected a finite number, found the number {shown}",
        )
        for name, lit, shown in (
            ("nan", ".nan", "nan"),
            ("inf", ".inf", "inf"),
            ("minus-inf", "-.inf", "-inf"),
            ("NaN-spelling", ".NaN", "nan"),
        )
    ),
    case(  # beyond float64, not .inf: said so, not "found the number inf"
        "embedding-1e400",
        BASE + "embeddings:\n  a: [1, 1e400, 3, 4]\n",
        "embeddings.a.1",
        7,
        "number too large",
        "expected a number of magnitude at most 1.79769e+308 (float64), found 1e400",
    ),
    *(  # a nonzero number below float64's least: float() reads it as 0, silently
        case(
            f"embedding-{lit}",
            BASE + f"embeddings:\n  a: [1, {lit}, 3, 4]\n",
            "embeddings.a.1",
            7,
            "number too small",
            "expected 0, or a number of magnitude above 2.47033e-324 (float64 rounds less to "
            f"0), found {lit}",
        )
        for lit in ("1e-400", "-2.47e-324", "0.000001e-320")
    ),
    case(
        "weight-inf",
        attn("heads:\n  - {W_k: [[1, 2, 3], [1, .inf, 3], [1, 2, 3], [1, 2, 3]]}"),
        "weights.encoder.0.self_attn.heads.0.W_k.1.1",
        "W_k",
        "found the number inf",
    ),
    case(
        "source-matrix-nan",
        BASE.replace("source: [a, b]", "source: [[1, 2, 3, .nan]]"),
        "source.0.3",
        5,
        "found the number nan",
    ),
    case(
        "scale-inf",
        BASE.replace("n_heads: 2", "n_heads: 2\n  scale: .inf"),
        "model.scale",
        4,
        "expected a finite number, found the number inf",
    ),
    case(
        "norm_eps-nan",
        BASE.replace("n_heads: 2", "n_heads: 2\n  norm_eps: .nan"),
        "model.norm_eps",
        4,
        "found the number nan",
    ),
    case(
        "pe_base-minus-inf",
        BASE.replace("n_heads: 2", "n_heads: 2\n  pe_base: -.inf"),
        "model.pe_base",
        4,
        "found the number -inf",
    ),
]

UNKNOWN_KEYS = [
    case(
        "top",
        BASE + "sorce: [a]\n",
        "sorce",
        6,
        "unknown key 'sorce' (did you mean 'source'?)",
        "expected one of: title,",
    ),
    case(
        "model",
        BASE.replace("n_heads", "n_head"),
        "model.n_head",
        3,
        "did you mean 'n_heads'?",
    ),
    case("tokens", BASE + "tokens: {bso: a}\n", "tokens.bso", 6, "did you mean 'bos'?"),
    case(
        "weights",
        BASE + "weights: {encoders: []}\n",
        "weights.encoders",
        6,
        "did you mean 'encoder'?",
    ),
    case(
        "layer",
        SIZES + "weights:\n  encoder:\n    - self_atn: {}\n",
        "weights.encoder.0.self_atn",
        11,
        "did you mean 'self_attn'?",
        "expected one of: self_attn, ffn",
    ),
    case(
        "decoder-layer",
        attn("{}", ENC_DEC, "cross_atn", "decoder"),
        "weights.decoder.0.cross_atn",
        "cross_atn",
        "did you mean 'cross_attn'?",
        "expected one of: self_attn, cross_attn, ffn",
    ),
    case(
        "block",
        attn("Wo: [[1]]"),
        "weights.encoder.0.self_attn.Wo",
        "Wo",
        "did you mean 'W_o'?",
    ),
    case(
        "head",
        attn("heads:\n  - {Wq: [[1]]}"),
        "weights.encoder.0.self_attn.heads.0.Wq",
        "Wq",
        "did you mean 'W_q'?",
    ),
    case("ffn", ffn("W1: [[1]]"), "weights.encoder.0.ffn.W1", "W1", "did you mean 'W_1'?"),
    case(
        "norm",
        ffn("norm: {gama: [1, 1, 1, 1]}"),
        "weights.encoder.0.ffn.norm.gama",
        "gama",
        "did you mean 'gamma'?",
    ),
    case(
        "final-norm",
        PRE + "weights:\n  encoder_final_norm: {betta: [0, 0, 0, 0]}\n",
        "weights.encoder_final_norm.betta",
        "betta",
        "did you mean 'beta'?",
    ),
    case(
        "output",
        BASE + "weights:\n  output: {w: [[1]]}\n",
        "weights.output.w",
        7,
        "did you mean 'W'?",
    ),
    case(
        "expect-entry",
        BASE + "expect:\n  - {step: encoder.output, value: 1, atoll: 1}\n",
        "expect.0.atoll",
        7,
        "did you mean 'atol'?",
        args=("check", "{file}"),
    ),
    case(
        "attention-op",
        "attention: {Q: [[1]], K: [[1]], V: [[1]], scal: 1}\n",
        "attention.scal",
        1,
        "did you mean 'scale'?",
        args=("step", "{file}", "--stage", "softmax"),
    ),
    case(
        "norm-op",
        "norm: {x: [[1, 2]], kindd: layer}\n",
        "norm.kindd",
        1,
        "did you mean 'kind'?",
        args=("step", "{file}", "--stage", "out"),
    ),
    case(
        "pe-op",
        "pe: {length: 2, d_model: 2, bse: 3}\n",
        "pe.bse",
        1,
        "did you mean 'base'?",
        args=("step", "{file}", "--stage", "pe"),
    ),
    case(
        "choice",
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: sinusodal"),
        "model.positional",
        4,
        "not a valid choice (did you mean 'sinusoidal'?)",
        "expected one of: sinusoidal, learned, relative, alibi, rope, none, found the string 'sinusodal'",
    ),
    case(
        "activation-choice",
        BASE.replace("n_heads: 2", "n_heads: 2\n  activation: swiglue"),
        "model.activation",
        4,
        "not a valid choice (did you mean 'swiglu'?)",
        "expected one of: relu, gelu, gelu_tanh, silu, swiglu, geglu, geglu_tanh, swiglu_oss, found the string 'swiglue'",
    ),
    case(
        "rope-pairs-misspelt",
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: rope\n  rope_pairs: halfs"),
        "model.rope_pairs",
        "rope_pairs",
        "not a valid choice (did you mean 'halves'?)",
        "expected one of: adjacent, halves, found the string 'halfs'",
    ),
    case(
        "rope-pairs-not-text",
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: rope\n  rope_pairs: 2"),
        "model.rope_pairs",
        "rope_pairs",
        "expected one of: adjacent, halves, found the number 2",
    ),
    case(
        "choice-abbreviated",  # by spelling alone 'Sine' is nearer 'none'
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: Sine"),
        "model.positional",
        4,
        "not a valid choice (did you mean 'sinusoidal'?)",
    ),
]

D_MODEL = [
    case(
        "embeddings-narrower-than-d_model",
        BASE + "embeddings:\n  a: [1, 2, 3]\n  b: [1, 2, 3]\n",
        "embeddings.a",
        7,
        "expected shape 4 (d_model), found shape 3",
    ),
    case(
        "weights-wider-than-d_model",
        attn("heads:\n  - {W_q: [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]]}"),
        "weights.encoder.0.self_attn.heads.0.W_q",
        "W_q",
        "expected shape 4 x 3 (d_model x d_k), found shape 5 x 3",
    ),
    case(
        "set-d_model-against-the-embeddings",
        BASE + "embeddings:\n  a: [1, 2, 3, 4]\n",
        "embeddings.a",
        7,
        "expected shape 2 (d_model), found shape 4",
        args=("encode", "{file}", "--set", "model.d_model=2"),
    ),
]

TOKENS = [
    case(
        "source",
        BASE.replace("[a, b]", "[a, d]"),
        "source.1",
        5,
        "unknown token 'd'",
        "expected a token of vocab (a, b, c)",
    ),
    case(
        "source-string",
        BASE.replace("[a, b]", "'a  bb'"),
        "source.1",
        5,
        "unknown token 'bb' (did you mean 'b'?)",
    ),
    case(
        "target",
        ENC_DEC.replace("target: [S, a]", "target: [S, x]"),
        "target.1",
        8,
        "unknown token 'x'",
        args=("decode", "{file}"),
    ),
    *(
        case(
            f"tokens-{k}",
            BASE + f"tokens: {{{k}: Z}}\n",
            f"tokens.{k}",
            6,
            "token 'Z' is not in the vocabulary",
            "expected a token of vocab",
        )
        for k in ("bos", "eos", "pad")
    ),
    case(
        "embeddings-key",
        BASE + "embeddings:\n  z: [1, 2, 3, 4]\n",
        "embeddings.z",
        7,
        "token 'z' is not in the vocabulary",
    ),
    case(
        "mapping-as-token",
        BASE.replace("[a, b]", "[a, {x: 1}]"),
        "source.1",
        5,
        "not a token",
        "found a mapping",
    ),
    case(
        "vocab-duplicate",
        BASE.replace("[a, b, c]", "[a, b, a]"),
        "vocab.2",
        4,
        "duplicate token 'a' (first at vocab.0)",
    ),
    case("empty-source-list", BASE.replace("[a, b]", "[]"), "source", 5, "empty sequence"),
    case("empty-source-string", BASE.replace("[a, b]", "''"), "source", 5, "empty sequence"),
    case(
        "no-source",
        "model: {d_model: 4}\nvocab: [a]\n",
        "source",
        None,
        "missing source",
    ),
]

SIZES_ = [
    case(  # few numbers, tens of millions of arrays and steps: ran out of memory before
        "a-million-tiny-layers",
        "model: {d_model: 2, n_heads: 1, encoder_layers: 1000000}\nvocab: [a]\nsource: [a]\n",
        "model",
        1,
        "too large: the model's arrays would be over the limit",
    ),
    case(
        "n_heads-0",
        BASE.replace("n_heads: 2", "n_heads: 0"),
        "model.n_heads",
        3,
        "expected a whole number >= 1, found the number 0",
    ),
    case(
        "n_heads-not-dividing",
        BASE.replace("n_heads: 2", "n_heads: 3"),
        "model.n_heads",
        3,
        "d_model 4 is not divisible by n_heads 3",
        "expected n_heads dividing d_model, or an explicit model.d_k",
    ),
    case(
        "n_heads-negative",
        BASE.replace("n_heads: 2", "n_heads: -2"),
        "model.n_heads",
        3,
        "found the number -2",
    ),
    case(
        "d_model-negative",
        "model: {d_model: -1}\n",
        "model.d_model",
        1,
        "expected a whole number >= 1, found the number -1",
    ),
    case("d_model-0", "model: {d_model: 0}\n", "model.d_model", 1, "found the number 0"),
    case("d_k-0", "model: {d_model: 4, d_k: 0}\n", "model.d_k", 1, "found the number 0"),
    case(
        "decoder_layers-negative",
        "model: {d_model: 4, decoder_layers: -1}\n",
        "model.decoder_layers",
        1,
        "expected a whole number >= 0",
    ),
    case(
        "no-layers",
        "model: {d_model: 4, encoder_layers: 0}\n",
        "model.encoder_layers",
        1,
        "the model has no layers",
    ),
    *(
        case(
            f"absurd-{name}",
            f"model: {{{key}: {value}}}\nsource: [[1, 2, 3, 4]]\n",
            "model",
            1,
            "too large",
            "the model's arrays would be over the limit (raise it with --max-elements)",
            "expected at most 268,435,456 numbers, found up to about ",
        )
        for name, key, value in (
            ("d_model", "d_model", "1000000000000"),
            ("encoder_layers", "d_model: 4, encoder_layers", "1000000000"),
            ("d_ff", "d_model: 4, d_ff", "1000000000000"),
            ("n_heads", "d_model: 4, n_heads: 1000000000, d_k", "1"),
        )
    ),
    case(
        "absurd-learned-max_len",
        "model: {d_model: 4, positional: learned, max_len: 1000000000000}\nsource: [[1, 2, 3, 4]]\n",
        "model",
        1,
        "too large",
        "expected at most 268,435,456 numbers, found up to about 4,000,0",  # + objects
    ),
    case(
        "below-a-lowered-limit",
        BASE,
        "model",
        1,
        "arrays would be over the limit",
        "expected at most 100 numbers, found up to about ",
        args=("encode", "{file}", "--max-elements", "100"),
    ),
    case(
        "too-long-a-sequence-names-the-sizes",
        BASE,
        "model",
        1,
        "(an upper bound) for d_model 4, 2 head(s) of d_k 2 / d_v 2, d_ff 16, 1 + 0 layer(s), "
        "3 token(s) of vocab and sequences of up to 8000 tokens",
        args=("encode", "{file}", "--set", "source=[" + ", ".join(["a"] * 8000) + "]"),
    ),
    *(  # the size at fault is among the sizes named
        case(
            f"too-large-names-{name}",
            BASE.replace("n_heads: 2", f"n_heads: 2\n  {setting}"),
            "model",
            1,
            f"(an upper bound) for d_model 4, 2 head(s) of {named}, 1 + 0 layer(s)",
        )
        for name, setting, named in (
            ("d_k", "d_k: 100000000", "d_k 100000000 / d_v 100000000, d_ff 16"),
            ("d_v", "d_v: 100000000", "d_k 2 / d_v 100000000, d_ff 16"),
            (
                "d_a",
                "score: additive\n  d_a: 100000000",
                "d_k 2 / d_v 2, d_ff 16, d_a 100000000",
            ),
            (
                "max_len",
                "positional: learned\n  max_len: 100000000",
                "d_k 2 / d_v 2, d_ff 16, max_len 100000000 (learned positions)",
            ),
        )
    ),
    case(  # 20000 x 20000 scores, four times over: 12.8 GB, allocated until memory ran out
        "attend-too-large",
        None,
        None,
        None,
        "attention: too large: 3000 queries x 2000 keys are over the limit (raise it with "
        "--max-elements); expected at most 1,000,000 numbers, found about 30,006,000 in its steps",
        args=(
            "attend",
            "--q",
            ";".join(["1 2"] * 3000),
            "--k",
            ";".join(["1 2"] * 2000),
            "--v",
            ";".join(["1 2"] * 2000),
            "--max-elements",
            "1000000",
        ),
        names="command line",
    ),
    case(  # refused before the 10^9 tokens are listed (they filled the memory)
        "cost-vary-absurd-length",
        BASE,
        "model",
        1,
        "too large",
        "for d_model 4, 2 head(s) of d_k 2 / d_v 2, d_ff 16, 1 + 0 layer(s), 3 token(s) of "
        "vocab and sequences of up to 1000000000 tokens",
        args=("cost", "{file}", "--vary", "L=8,1000000000"),
    ),
    *(  # a given number that float32 cannot hold: it would become an infinity
        case(
            f"beyond-float32-{name}",
            text,
            path,
            line,
            "beyond the range of float32, the model's dtype",
            f"expected a number of magnitude at most 3.4028234663852886e+38, or float64, found {found}",
            args=args,
        )
        for name, text, path, line, found, args in (
            (
                "embedding",
                BASE.replace("n_heads: 2", "n_heads: 2\n  dtype: float32")
                + "embeddings:\n  a: [1, 2, 1e39, 4]\n",
                "embeddings.a.2",
                8,
                "the number 1e+39",
                ("encode", "{file}"),
            ),
            (
                "weight-by-option",
                attn("W_o: [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, -4e38, 0], [0, 0, 0, 1]]", BASE),
                "weights.encoder.0.self_attn.W_o.2.2",
                9,
                "the number -4e+38",
                ("encode", "{file}", "--dtype", "float32"),
            ),
        )
    ),
    case(
        "scale-zero",
        BASE.replace("n_heads: 2", "n_heads: 2\n  scale: 0"),
        "model.scale",
        4,
        "must be positive",
        "expected a number > 0, found the number 0",
    ),
    case(
        "temperature-negative",
        BASE.replace("n_heads: 2", "n_heads: 2\n  temperature: -1"),
        "model.temperature",
        4,
        "must be positive",
    ),
    case(
        "seed-negative",
        BASE.replace("n_heads: 2", "n_heads: 2\n  seed: -3"),
        "model.seed",
        4,
        "expected a whole number >= 0",
    ),
]

STRUCTURE = [
    case(
        "more-layers-than-the-model",
        SIZES + "weights:\n  encoder:\n    - {}\n    - {}\n",
        "weights.encoder.1",
        12,
        "more encoder layers than model.encoder_layers (1)",
        "expected at most 1 layer, found 2 layers",  # (not "1 layers")
    ),
    case(
        "more-heads-than-one",
        attn("heads: [{}, {}]", base=SIZES.replace("n_heads: 2", "n_heads: 1")),
        "weights.encoder.0.self_attn.heads.1",
        "heads: [",
        "more heads than model.n_heads (1)",
        "expected at most 1 head, found 2 heads",  # (not "1 heads")
    ),
    case(
        "more-heads-than-the-model",
        attn("heads: [{}, {}, {}]"),
        "weights.encoder.0.self_attn.heads.2",
        "heads: [",
        "more heads than model.n_heads (2)",
        "found 3 heads",
    ),
    case(
        "both-weight-forms",
        attn("heads:\n  - {W_k: [[1]]}\n  - {}\nW_q: [[1]]"),
        "weights.encoder.0.self_attn.heads.0.W_k",
        "W_k",
        "one form per block",
    ),
    case(
        "layers-as-mapping",
        SIZES + "weights:\n  encoder: {self_attn: {}}\n",
        "weights.encoder",
        10,
        "expected a list of 1 (one entry per layer), found a mapping",
    ),
    case(
        "cross_attn-in-decoder-only",
        attn("{}", DEC_ONLY, "cross_attn", "decoder"),
        "weights.decoder.0.cross_attn",
        "cross_attn",
        "a decoder-only model (encoder_layers: 0) has no cross-attention",
        args=("decode", "{file}"),
    ),
    case(
        "final-norm-when-off",
        BASE + "weights:\n  encoder_final_norm: {gamma: [1, 1, 1, 1]}\n",
        "weights.encoder_final_norm",
        7,
        "a final norm is given but model.final_norm is off",
        "found model.final_norm: false",
    ),
    case(
        "final-norm-of-a-missing-stack",
        PRE + "weights:\n  decoder_final_norm: {gamma: [1, 1, 1, 1]}\n",
        "weights.decoder_final_norm",
        "decoder_final_norm",
        "the model has no such stack",
        "found model.decoder_layers: 0",
    ),
    case(
        "embed-norm-when-off",
        BASE + "weights:\n  encoder_embed_norm: {gamma: [1, 1, 1, 1]}\n",
        "weights.encoder_embed_norm",
        7,
        "an embedding norm is given but model.embed_norm is off",
        "expected no encoder_embed_norm",
        "found model.embed_norm: false",
    ),
    case(
        "embed-norm-of-a-missing-stack",
        BASE.replace("n_heads: 2", "n_heads: 2\n  embed_norm: true")
        + "weights:\n  decoder_embed_norm: {beta: [0, 0, 0, 0]}\n",
        "weights.decoder_embed_norm",
        "decoder_embed_norm",
        "an embedding norm is given but the model has no such stack",
        "found model.decoder_layers: 0",
    ),
    case(
        "embed-norm-not-a-boolean",
        BASE.replace("n_heads: 2", "n_heads: 2\n  embed_norm: 'yes please'"),
        "model.embed_norm",
        4,
        "embed_norm",
    ),
    case(
        "output-W-with-tied-embeddings",
        BASE.replace("n_heads: 2", "n_heads: 2\n  tie_embeddings: true")
        + "weights:\n  output: {W: [[1]]}\n",
        "weights.output.W",
        "output",
        "model.tie_embeddings is on",
    ),
    *(
        case(
            f"ffn-{k}-not-gated",
            ffn(f"{k}: {value}", SIZES.replace("d_ff: 6", f"d_ff: 6\n  activation: {act}")),
            f"weights.encoder.0.ffn.{k}",
            k,
            f"{k} is the up projection of a gated FFN, but model.activation is {act}",
            f"expected model.activation: swiglu, geglu, geglu_tanh or swiglu_oss, or no {k}",
            f"found model.activation: {act}",
        )
        for k, value, act in (("W_3", M22, "relu"), ("b_3", V2, "silu"))
    ),
    case(
        "ffn-W_3-with-relu-by-set",
        ffn(f"W_3: {M22}", GATED),
        "weights.encoder.0.ffn.W_3",
        "W_3",
        "but model.activation is relu (model.activation set by --set)",
        args=("encode", "{file}", "--set", "model.activation=relu"),
    ),
    case(
        "positional-when-not-learned",
        BASE + "weights:\n  positional: [[1, 2, 3, 4]]\n",
        "weights.positional",
        7,
        "learned positions given, but model.positional is sinusoidal",
    ),
    case(
        "source-longer-than-max_len",
        BASE.replace("n_heads: 2", "n_heads: 2\n  positional: learned\n  max_len: 1"),
        "source",
        "source",
        "expected at most 1 token, found 2 tokens",
    ),
    case(
        "source-in-decoder-only",
        DEC_ONLY + "source: [a]\n",
        "source",
        4,
        "reads target, not source",
        args=("decode", "{file}"),
    ),
    case(
        "target-in-encoder-only",
        BASE + "target: [a]\n",
        "target",
        6,
        "an encoder-only model (decoder_layers: 0) has no target",
    ),
    case(
        "decode-on-encoder-only",
        BASE,
        "model.decoder_layers",
        None,
        "decode needs a decoder",
        "expected decoder_layers >= 1, found decoder_layers: 0",
        args=("decode", "{file}"),
    ),
    case(
        "generate-on-encoder-only",
        BASE.replace("[a, b, c]", "[a, b, c, S, E]") + "tokens: {bos: S, eos: E}\n",
        "model.decoder_layers",
        None,
        "generate needs a decoder",
        args=("generate", "{file}"),
    ),
    case(
        "step-on-a-decoder-without-a-vocab-names-no-other-command",
        DEC_ONLY.replace("vocab: [a, b]", "vocab: []").replace(
            "target: [a]", "target: [[1, 2, 3, 4]]"
        ),
        "vocab",
        None,
        "vocab: a decoder needs a vocab: its logits are one score per vocabulary token",
        "found no tokens",
        args=("step", "{file}", "--stage", "softmax"),
    ),
    case(
        "generate-over-the-limit",
        ENC_DEC.replace("tokens: {bos: S}", "tokens: {bos: S, eos: a}"),
        None,
        None,
        "over the limit of 100,000",
        args=("generate", "{file}", "--trace", "--max-tokens", "50", "--max-elements", "100000"),
    ),
    case(
        "encode-on-decoder-only",
        DEC_ONLY,
        "model.encoder_layers",
        None,
        "this model is decoder-only",
        "expected encoder_layers >= 1, found encoder_layers: 0",
    ),
    case(
        "decode-without-target-or-bos",
        ENC_DEC.replace("tokens: {bos: S}\n", "").replace("target: [S, a]\n", ""),
        "target",
        None,
        "no target and no tokens.bos",
        args=("decode", "{file}"),
    ),
    case(
        "encode-on-an-operation-file",
        "pe: {length: 2, d_model: 2}\n",
        None,
        None,
        "needs a model config",
        "found 'pe:'",
    ),
    case(
        "operation-and-model",
        BASE + "pe: {length: 2, d_model: 2}\n",
        "pe",
        6,
        "cannot also hold a single operation",
        "found 'model:' and 'pe:'",
    ),
    case(
        "attention-K-columns",
        "attention: {Q: [[1, 2]], K: [[1, 2, 3]], V: [[1]]}\n",
        "attention.K",
        1,
        "expected a non-empty matrix with as many columns as Q (d_k) (2 columns)",
        "found shape 1 x 3",
        args=("step", "{file}", "--stage", "softmax"),
    ),
    case(  # the file's K is right for its own Q: the --q that made Q wider is named
        "attention-K-columns-of-a-q-option",
        "attention: {Q: [[1, 2]], K: [[1, 2]], V: [[1]]}\n",
        "attention.K",
        1,
        "wrong shape (attention.Q set by --q)",
        "as many columns as Q (d_k) (3 columns), found shape 1 x 2",
        args=("attend", "{file}", "--q", "1 2 3"),
    ),
    case(
        "attention-mask-plus-inf",
        "attention: {Q: [[1]], K: [[1], [2]], V: [[1], [2]], mask: [[0, .inf]]}\n",
        "attention.mask.0.1",
        1,
        "expected 0, -inf or a finite number, found the number inf",
        args=("step", "{file}", "--stage", "softmax"),
    ),
    case(
        "norm-op-vector",
        "norm: {kind: layer, x: [1, 2, 3]}\n",
        "norm.x",
        1,
        "expected a non-empty matrix, found shape 3",
        args=("step", "{file}", "--stage", "out"),
    ),
    case(
        "pe-op-absurd",
        "pe: {length: 1000000000, d_model: 1000000000}\n",
        "pe",
        1,
        "too large: 1000000000 x 1000000000 numbers are over the limit",
        "expected at most 268,435,456 numbers, found 1,000,000,000,000,000,000",
        args=("step", "{file}", "--stage", "pe"),
    ),
    case(
        "unknown-variant",
        BASE,
        "variants",
        None,
        "unknown variant 'doc'",
        "found 'doc'",
        args=("encode", "{file}", "--variant", "doc"),
    ),
    *(
        case(
            f"variant-suggested-{given}",
            BASE + "variants: {document: {model.scale: 2}, plain: {model.scale: 1}}\n",
            "variants",
            None,
            f"unknown variant '{given}' (did you mean 'document'?)",
            args=("encode", "{file}", "--variant", given),
        )
        for given in ("documnt", "Document")
    ),
    case(
        "expect-unknown-variant",
        BASE
        + "variants: {v: {model.scale: 2}}\nexpect:\n  - {step: encoder.output, value: 1, variant: w}\n",
        "expect.0.variant",
        8,
        "unknown variant",
        "found the string 'w'",
        args=("check", "{file}"),
    ),
]

STRUCTURE += [
    case(
        f"expect-variant-{name}",
        BASE
        + f"variants: {{v: {{model.scale: 2}}}}\nexpect:\n  - {{step: x, value: 1, variant: {value}}}\n",
        "expect.0.variant",
        8,
        "unknown variant",
        f"expected one of: v, found {found}",
        args=("check", "{file}"),
    )
    for name, value, found in (("list", "[v]", "a list of 1"), ("mapping", "{v: 1}", "a mapping"))
]

STAGES = [
    case(
        "unknown-stage",
        BASE,
        None,
        None,
        "unknown stage 'sofmax' (did you mean 'softmax'?)",
        "found 'sofmax'",
        args=("step", "{file}", "--stage", "sofmax"),
    ),
    case(
        "no-such-layer",
        BASE,
        None,
        None,
        "no step matches --stage softmax --layer 7: the model has no layer 7",
        "expected a layer from 0 to",
        args=("step", "{file}", "--stage", "softmax", "--layer", "7"),
    ),
    case(
        "explain-config-first",
        BASE,
        None,
        None,
        "is a config file, and explain takes the step first: trace-tf explain encoder.pe",
        args=("explain", "{file}", "encoder.pe"),
    ),
    case(
        "group-this-model-lacks",
        BASE,  # encoder-only: no cross-attention
        None,
        None,
        "no step matches --stage cross",
        "expected a group or pattern that matches a step this model computes",
        args=("step", "{file}", "--stage", "cross"),
    ),
]

SETS = [
    case(
        "set-without-equals",
        BASE,
        None,
        None,
        "malformed --set",
        "expected KEY=VALUE",
        "found 'model.scale'",
        args=("encode", "{file}", "--set", "model.scale"),
        names="--set",
    ),
    case(
        "set-empty-key",
        BASE,
        None,
        None,
        "malformed --set",
        "found '=3'",
        args=("encode", "{file}", "--set", "=3"),
        names="--set",
    ),
    case(
        "set-empty-key-part",
        BASE,
        None,
        None,
        "malformed --set",
        args=("encode", "{file}", "--set", "model..scale=3"),
        names="--set",
    ),
    case(
        "set-bad-yaml",
        BASE,
        None,
        1,
        "malformed YAML",
        args=("encode", "{file}", "--set", "model.scale=[1,"),
        names="--set model.scale",
    ),
    case(
        "set-duplicate-key",
        BASE,
        "a",
        1,
        "duplicate key 'a'",
        args=("encode", "{file}", "--set", "model.scale={a: 1, a: 2}"),
        names="--set model.scale",
    ),
    case(
        "set-through-a-scalar",
        BASE,
        "model.d_model.x",
        None,
        "model.d_model is not a mapping or list (line 2 of {file})",
        "found the number 4",
        args=("encode", "{file}", "--set", "model.d_model.x=3"),
        names="--set",
    ),
    case(
        "set-word-index-into-a-list",
        BASE,
        "vocab.x",
        None,
        "vocab is a list",
        "expected a list index, found 'x'",
        args=("encode", "{file}", "--set", "vocab.x=3"),
        names="--set",
    ),
    case(
        "set-unknown-key",
        BASE,
        "model.n_head",
        None,
        "did you mean 'n_heads'?",
        "set by --set model.n_head",
        args=("encode", "{file}", "--set", "model.n_head=2"),
    ),
    *(  # not Python's repr of the value: "token \"['a']\" is not in the vocabulary"
        case(
            f"special-token-{name}",
            BASE + f"tokens: {{bos: {value}}}\n",
            "tokens.bos",
            6,
            f"not a token; expected a token of vocab (a, b, c), found {found}",
        )
        for name, value, found in (
            ("list", "[a]", "a list of 1"),
            ("mapping", "{a: 1}", "a mapping"),
            ("boolean", "true", "a boolean (true)"),
        )
    ),
    case(  # a null key is named as YAML writes it, not as Python's None
        "null-key",
        BASE + "embeddings:\n  ~: [1, 2, 3, 4]\n",
        "embeddings.null",
        7,
        "token 'null' is not in the vocabulary",
    ),
    case(  # a key with a newline and an escape: one line, the escape not sent raw
        "key-with-control-characters",
        BASE + 'embeddings: {"x\\e[31m\\ny": [1, 2, 3, 4]}\n',
        "embeddings.x\\x1b[31m\\ny",
        6,
        "token 'x\\x1b[31m\\ny' is not in the vocabulary",
    ),
    case(  # a token with a newline in the list of the vocabulary: one line
        "vocab-with-control-characters",
        BASE.replace("[a, b, c]", '[a, "b\\nc"]').replace("[a, b]", "[a, z]"),
        "source.1",
        5,
        "expected a token of vocab (a, b\\nc)",
    ),
    case(  # the unknown key is one the --set made on its way: not line 1 of the file
        "set-unknown-key-made-by-a-deeper-set",
        BASE,
        "model.new",
        None,
        "{file}: model.new: unknown key 'new' (set by --set model.new.deep.key);",
        args=("encode", "{file}", "--set", "model.new.deep.key=1"),
    ),
    case(  # two --sets made it: no line of the file (it was line 1, `model:`)
        "set-unknown-key-made-by-two-deeper-sets",
        BASE,
        "model.new",
        None,
        "{file}: model.new: unknown key 'new';",
        args=("encode", "{file}", "--set", "model.new.a=1", "--set", "model.new.b=2"),
    ),
    case(  # one key set twice made it: that key is still named
        "set-unknown-key-made-by-one-key-set-twice",
        BASE,
        "model.new",
        None,
        "{file}: model.new: unknown key 'new' (set by --set model.new.a);",
        args=("encode", "{file}", "--set", "model.new.a=1", "--set", "model.new.a=2"),
    ),
    case(
        "variant-unknown-key-made-by-a-deeper-key",
        BASE + "variants:\n  v:\n    model.nw.x: 1\n",
        "model.nw",
        "model.nw.x",
        "unknown key 'nw' (set by variant 'v', at model.nw.x)",
        args=("encode", "{file}", "--variant", "v"),
    ),
    case(
        "set-bad-value",
        BASE,
        "model.scale",
        None,
        "must be positive",
        "set by --set model.scale",
        args=("encode", "{file}", "--set", "model.scale=-1"),
    ),
    # a size the expected shape comes from, set by --set or a variant, named as the cause
    *(
        case(
            f"wrong-shape-after-{key}-set",
            attn(f"W_k: {M4x12}", SIZES.replace("n_heads: 2", "n_heads: 4")),
            "weights.encoder.0.self_attn.W_k",
            "W_k",
            f"wrong shape (model.{key} set by --set)",
            f"expected shape 4 x {n} (d_model x {dims}), found shape 4 x 12",
            args=("encode", "{file}", "--set", f"model.{key}={value}"),
        )
        for key, value, n, dims in (
            ("n_kv_heads", 2, 6, "n_kv_heads·d_k"),
            ("d_k", 2, 8, "n_heads·d_k"),
        )
    ),
    case(
        "variant-that-changes-expect",
        BASE + "variants:\n  v: {expect: []}\n",
        "variants.v.expect",
        7,
        "a variant cannot change variants or expect; expected keys of the config other than "
        "variants and expect, found a list of 0",
        args=("encode", "{file}", "--variant", "v"),
    ),
    case(  # the same words whether the variant is applied or only read
        "variant-not-a-mapping",
        BASE + "variants:\n  v: 3\n",
        "variants.v",
        7,
        "a variant maps dotted keys to values; expected a mapping, found the number 3",
        args=("encode", "{file}", "--variant", "v"),
    ),
    case(
        "variant-bad-value-names-the-variant-and-its-line",
        BASE + "variants:\n  ok: {model.scale: 2}\n  neg:\n    model.scale: -1\n",
        "model.scale",
        "model.scale: -1",
        "must be positive",
        "set by variant 'neg')",
        args=("encode", "{file}", "--variant", "neg"),
    ),
    case(
        "variant-bad-value-inside-a-mapping-it-sets",
        BASE + "variants:\n  wide:\n    model:\n      d_model: 4\n      n_heads: x\n",
        "model.n_heads",
        "n_heads: x",
        "set by variant 'wide', at model)",
        args=("encode", "{file}", "--variant", "wide"),
    ),
    case(
        "set-past-the-end-of-a-list-names-the-set",
        BASE,
        "source.2",
        None,
        "not a token (set by --set source.5, which added source.2 empty before it)",
        "found nothing: an entry left empty",  # (not 'a mapping', which the user never wrote)
        args=("encode", "{file}", "--set", "source.5=a"),
    ),
    case(
        "set-past-a-row-s-end",
        "attention: {Q: [[1, 0]], K: [[1, 0]], V: [[1]]}\n",
        "attention.Q.0.2",
        None,
        "not a number (set by --set attention.Q.0.3, which added attention.Q.0.2 empty",
        "expected a number, found nothing: an entry left empty",
        args=("attend", "{file}", "--set", "attention.Q.0.3=1"),
    ),
    case(
        "variant-past-the-end-of-a-list-names-the-variant",
        BASE + "variants:\n  v: {source.4: a}\n",
        "source.2",
        "v: {source.4",
        "(set by variant 'v', at source.4, which added source.2 empty before it)",
        args=("encode", "{file}", "--variant", "v"),
    ),
    case(
        "set-of-a-model-key-on-a-single-operation-names-the-set",
        "attention: {Q: [[1]], K: [[1]], V: [[1]]}\n",
        "model.scale",
        None,
        "a model config cannot also hold a single operation (set by --set model.scale)",
        args=("check", "{file}", "--set", "model.scale=30"),
    ),
    case(
        "a-file-with-a-model-and-an-operation-is-blamed-not-a-set-beside-it",
        BASE + "attention: {Q: [[1]], K: [[1]], V: [[1]]}\n",
        "attention",
        "attention:",
        "a model config cannot also hold a single operation;",
        args=("encode", "{file}", "--set", "model.scale=30"),
    ),
    case(
        "set-after-variant-names-the-set",
        BASE + "variants:\n  neg: {model.scale: -1}\n",
        "model.scale",
        None,
        "set by --set model.scale)",
        args=("encode", "{file}", "--variant", "neg", "--set", "model.scale=-2"),
    ),
    case(
        "set-python-tag",
        BASE,
        None,
        1,
        "YAML tag tag:yaml.org,2002:python/object/apply:os.getcwd is not allowed",
        args=("encode", "{file}", "--set", "model.scale=!!python/object/apply:os.getcwd []"),
        names="--set model.scale",
    ),
]

FILES = [
    case(
        "missing-file",
        None,
        None,
        None,
        "no such file",
        args=("encode", "{dir}/nope.yaml"),
        names="{dir}/nope.yaml",
    ),
    case(
        "missing-example",
        None,
        None,
        None,
        "no such file or packaged example",
        "found 'nope'",
        args=("encode", "nope"),
        names="nope",
    ),
    case(
        "misspelt-example",
        None,
        None,
        None,
        "no such file or packaged example (did you mean 'hello'?)",
        args=("encode", "helo"),
        names="helo",
    ),
    case("directory", None, None, None, "is a directory", args=("encode", "{dir}"), names="{dir}"),
    *(  # a name longer than a file's may be (ENAMETOOLONG) was an internal error
        case(
            f"name-too-long-{'-'.join(args[:1])}-{n}",
            None,
            None,
            None,
            "File name too long",
            args=(*args, "{dir}/" + "x" * n + ".yaml"),
            names="{dir}/xxxxxxxxxx",  # (the start: a long name is clipped)
        )
        for n in (300, 5000)
        for args in (("encode",), ("check",), ("diff", "hello"))
    ),
    case("empty-file", "", None, None, "the config is empty", "expected a YAML mapping"),
    case("only-comments", "# a title\n# nothing else\n", None, None, "the config is empty"),
    case("only-document-marker", "---\n", None, None, "the config is empty"),
    case("a-list", "- model\n- d_model\n", None, None, "must be a mapping", "found a list of 2"),
    case("a-scalar", "hello\n", None, None, "must be a mapping", "found the string 'hello'"),
    case("binary-garbage", bytes(range(256)) * 4, None, None, "not a text file (binary data)"),
    case("gzip", b"\x1f\x8b\x08\x00" + bytes(60), None, None, "binary data"),
    case(
        "latin-1",
        "model: {d_model: 4}\ntitle: café\n".encode("latin-1"),
        None,
        None,
        "not UTF-8 text",
    ),
    *(
        case(
            f"{codec}-text",
            "model: {d_model: 4}\n".encode(codec),
            None,
            None,
            "expected UTF-8 text, found a UTF-16/32 BOM",
        )
        for codec in ("utf-16", "utf-32")
    ),
    case("utf-16-without-bom", "model: 4\n".encode("utf-16-le"), None, None, "binary data"),
    case("invalid-utf-8-start", b"\x80\x81garbage", None, None, "not UTF-8 text (byte 0)"),
    case(  # the line of the byte, and the byte
        "invalid-utf-8-line",
        BASE.encode() + b"title: caf\xe9\n",
        None,
        6,
        "not UTF-8 text (byte 75); expected UTF-8 text, found the byte 0xe9",
    ),
    *(  # characters YAML does not allow: one line, with the line and the character
        case(
            f"character-{name}",
            BASE + f"title: a{char}b\n",
            None,
            6,
            f"a character YAML does not allow (column 9); expected printable text (a tab, "
            f"line breaks, and printable Unicode), found {found}",
        )
        for name, char, found in (
            ("control", "\x01", "U+0001 (a control character)"),
            ("escape", "\x1b", "U+001B (a control character)"),
            ("delete", "\x7f", "U+007F (a control character)"),
            ("c1-control", "\x9b", "U+009B (a control character)"),
            ("non-character", "\ufffe", "U+FFFE"),
        )
    ),
    # A byte of an argument that is not UTF-8 (`--set $'title=\xff'`): Python keeps it as
    # the lone surrogate U+DCFF, which libyaml cannot even encode.
    case(
        "set-not-utf-8",
        BASE,
        None,
        1,
        "not UTF-8 text; expected UTF-8 text, found the byte 0xff",
        args=("encode", "{file}", "--set", "title=\udcff"),
        names="--set title",
    ),
    case(
        "set-not-utf-8-second-line",
        BASE,
        None,
        2,
        "not UTF-8 text; expected UTF-8 text, found the byte 0xe9",
        args=("encode", "{file}", "--set", "vocab=[a,\n caf\udce9]"),
        names="--set vocab",
    ),
    case(
        "inline-matrix-not-utf-8",
        None,
        None,
        1,
        "not UTF-8 text; expected UTF-8 text, found the byte 0xff",
        args=("attend", "--q", "[1, \udcff]", "--k", "1", "--v", "1"),
        names="--q",
    ),
]

# Inline matrices and the calculators: an error in an option names the option; one
# found when the options are put together names the command line and the key path.
ATT = ("attend", "--q", "1 2", "--k", "1 2; 3 4", "--v", "1; 2")
ATT_FILE = "attention: {Q: [[1, 2]], K: [[1, 2]], V: [[1]]}\n"


def att(**change: str) -> tuple[str, ...]:
    """The attend command line ATT with some options changed or added."""
    args = list(ATT)
    for key, value in change.items():
        option = f"--{key}"
        if option in args:
            args[args.index(option) + 1] = value
        else:
            args += [option, value]
    return tuple(args)


CALCULATORS = [
    # A model's sections beside a single operation were silently ignored: `--set
    # weights.x=1` (or a `source:`) on a norm file ran it unchanged.
    *(
        case(
            f"single-operation-with-{key}",
            f"norm: {{x: [[1, 2]]}}\n{key}: {value}\n",
            key,
            2,
            f"a single operation ('norm:') has no {key}; it belongs to a model config",
            "expected only title, reference, norm, expect, variants beside 'norm:'",
            args=("norm", "{file}"),
        )
        for key, value in (("source", "[a]"), ("weights", "{}"), ("vocab", "[a]"))
    ),
    case(
        "single-operation-set-weights",
        "norm: {x: [[1, 2]]}\n",
        "weights",
        None,
        "has no weights; it belongs to a model config (set by --set-b weights.x) (in run B)",
        args=("diff", "{file}", "--set-b", "weights.x=1"),
    ),
    case(
        "inline-ragged",
        None,
        None,
        None,
        "ragged matrix: row 1 has 1 number, row 0 has 2",  # (not "1 numbers")
        "expected 2 numbers in every row, found '3'",
        args=att(q="1 2; 3"),
        names="--q",
    ),
    case(
        "inline-ragged-one-column",
        None,
        None,
        None,
        "ragged matrix: row 1 has 2 numbers, row 0 has 1",
        "expected 1 number in every row, found '2 3'",
        args=att(v="1; 2 3"),
        names="--v",
    ),
    case(
        "inline-v-rows-one-key",
        None,
        None,
        None,
        "as many rows as K (one value per key) (1 row), found shape 2 x 1",  # (not "1 rows")
        args=("attend", "--q", "1", "--k", "1", "--v", "1; 2"),
        names="--v",
    ),
    case(
        "inline-word",
        None,
        None,
        None,
        "row 0: not a number",
        "expected a number, found 'x'",
        args=att(k="1 x; 3 4"),
        names="--k",
    ),
    *(
        case(
            f"inline-{lit}",
            None,
            None,
            None,
            "row 0: not a finite number",
            f"expected a finite number, found '{lit}'",
            args=att(q=f"1 {lit}"),
            names="--q",
        )
        for lit in ("nan", "inf", "-inf", "1e400")
    ),
    *(
        case(
            f"inline-{name}",
            None,
            None,
            None,
            "row 0: a comma with no number beside it",
            f"expected one number between commas, found {text!r}",
            args=att(q=text),
            names="--q",
        )
        # before, "1,,0" was silently read as the two numbers 1 and 0
        for name, text in (
            ("empty-field", "1,,0"),
            ("leading-comma", ",1"),
            ("trailing-comma", "1,"),
        )
    ),
    case("inline-given-empty", None, None, None, "row 0 is empty", args=att(q=""), names="--q"),
    *(
        case(
            f"{args[0]}-dtype",
            text,
            None,
            None,
            "--dtype float32 applies to a model config; this file holds a single operation",
            args=(*args, "--dtype", "float32"),
            names="--dtype",
        )
        # --dtype was silently ignored by the single operations, which run in float64
        for text, args in (
            (None, ATT),
            ("pe: {length: 2, d_model: 4}\n", ("pe", "{file}")),
            ("norm: {x: [[1, 2], [3, 5]]}\n", ("norm", "{file}")),
        )
    ),
    case(
        "inline-empty-row",
        None,
        None,
        None,
        "row 1 is empty",
        args=att(v="1;;2"),
        names="--v",
    ),
    case(
        "inline-3-D-ragged",
        None,
        None,
        None,
        "the matrices separated by '|' differ in shape",
        "found 1 x 2, 1 x 1",
        args=att(q="1 2 | 3"),
        names="--q",
    ),
    case(
        "inline-yaml-malformed",
        None,
        None,
        1,
        "malformed YAML",
        args=att(q="[[1, 2]"),
        names="--q",
    ),
    case(
        "inline-yaml-ragged",
        None,
        "attention.Q.1",
        None,
        "ragged matrix: a list among numbers (set by --q)",
        args=att(q="[1, [2]]"),
        names="command line",
    ),
    # A vector option given as YAML (`--beta [1, 2]`) was taken for rows of a matrix,
    # each number for a row: an internal error (len() of an int), exit 3.
    *(
        case(
            f"inline-yaml-vector-{option[2:]}",
            None,
            f"norm.{option[2:]}",
            None,
            f"wrong shape (set by {option})",
            f"expected shape 1 (one number per feature of norm.x), found shape {n}",
            args=("norm", "--x", "1", option, text),
            names="command line",
        )
        for option, text, n in (("--beta", "[1, 2]", 2), ("--gamma", "[1, 2, 3]", 3))
    ),
    case(
        "inline-yaml-vector-not-numbers",
        None,
        "norm.gamma.0",
        None,
        "not a number (set by --gamma)",
        "expected a number, found the string 'a'",
        args=("norm", "--x", "1 2", "--gamma", "[a, 2]"),
        names="command line",
    ),
    case(
        "inline-yaml-python-tag",
        None,
        None,
        1,
        "YAML tag tag:yaml.org,2002:python/object/apply:os.getcwd is not allowed",
        args=att(q="[!!python/object/apply:os.getcwd []]"),
        names="--q",
    ),
    case(
        "inline-K-columns",
        None,
        "attention.K",
        None,
        "wrong shape (set by --k)",
        "as many columns as Q (d_k) (2 columns), found shape 2 x 3",
        args=att(k="1 2 3; 4 5 6"),
        names="command line",
    ),
    case(
        "inline-V-rows",
        None,
        "attention.V",
        None,
        "(2 rows), found shape 3 x 1",
        args=att(v="1; 2; 3"),
        names="command line",
    ),
    case(
        "inline-mask-plus-inf",
        None,
        None,
        None,
        "expected a finite number or -inf, found 'inf'",
        args=att(mask="0 inf"),
        names="--mask",
    ),
    case(
        "inline-mask-shape",
        None,
        "attention.mask",
        None,
        "expected shape 1 x 2, found shape 1 x 3",
        args=att(mask="0 0 0"),
        names="command line",
    ),
    case(
        "attend-scale-zero",
        None,
        "attention.scale",
        None,
        "must be positive (set by --scale)",
        args=att(scale="0"),
        names="command line",
    ),
    case(  # 1e-400 is no positive number: float64 reads it as 0
        "attend-scale-underflow",
        None,
        None,
        None,
        "--scale: number too small; expected 0, or a number of magnitude above 2.47033e-324 "
        "(float64 rounds less to 0), found 1e-400",
        args=att(scale="1e-400"),
        names="--scale",
    ),
    case(
        "inline-underflow",
        None,
        None,
        None,
        "--q: row 0: number too small",
        "found '1e-400'",
        args=att(q="1 1e-400"),
        names="--q",
    ),
    case(  # -1e400 is no -inf, which the matrix writes as such (as the file refuses it)
        "inline-mask-overflow",
        None,
        None,
        None,
        "--mask: row 0: number too large; expected a number of magnitude at most "
        "1.79769e+308 (float64), found '-1e400'",
        args=att(mask="0 -1e400; 0 0"),
        names="--mask",
    ),
    case(
        "attend-unknown-score",
        None,
        "attention.score",
        None,
        "did you mean 'dot'?",
        args=att(score="dott"),
        names="command line",
    ),
    case(
        "attend-missing-matrices",
        None,
        None,
        None,
        "attend needs --q, --k and --v",
        args=("attend", "--k", "1", "--v", "1"),
        names="attend",
    ),
    case(
        "attend-file-and-option-disagree",
        ATT_FILE,
        "attention.K",
        1,
        "as many columns as Q (d_k) (3 columns), found shape 1 x 2",
        args=("attend", "{file}", "--q", "1 2 3"),
    ),
    case(
        "attend-on-a-model-config",
        BASE,
        None,
        None,
        "attend needs a single attention operation",
        "found 'model:'",
        args=("attend", "{file}"),
    ),
    case(
        "norm-ragged",
        None,
        None,
        None,
        "ragged matrix",
        args=("norm", "--x", "1 2; 3"),
        names="--x",
    ),
    case(
        "norm-unknown-kind",
        None,
        "norm.kind",
        None,
        "did you mean 'layer'?",
        args=("norm", "--x", "1 2", "--kind", "lay"),
        names="command line",
    ),
    case(
        "norm-negative-eps",
        None,
        "norm.eps",
        None,
        "expected a number >= 0, found the number -1\n",  # as typed, and as the file says
        args=("norm", "--x", "1 2", "--eps", "-1"),
        names="command line",
    ),
    # A number option is shown as typed: float64 reads 1e-400 as 0 and 1e400 as inf,
    # and each is refused as the file refuses it, not as a 0 or inf the user never wrote.
    *(
        case(
            f"option-{option[2:]}-{text}",
            None,
            None,
            None,
            f"{option}: number {size}",
            f"found {text}",
            args=(*args, option, text),
            names=option,
        )
        for args, option in (
            (("generate", "--sample"), "--temperature"),
            (("generate", "--sample"), "--top-p"),
            (("generate", "--beam", "2"), "--length-penalty"),
            (("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0"), "--temperature"),
            (("norm", "--x", "1 2"), "--eps"),
            (("pe", "--length", "2", "--d-model", "2"), "--base"),
            (("diff", "hello", "hello"), "--atol"),
        )
        for text, size in (("1e-400", "too small"), ("1e400", "too large"))
    ),
    case(
        "option-top-p-as-typed",
        None,
        None,
        None,
        "--top-p must lie in (0, 1]; expected 0 < p <= 1, found 1.50",
        args=("generate", "--sample", "--top-p", "1.50"),
        names="--top-p",
    ),
    case(
        "option-temperature-as-typed",
        None,
        None,
        None,
        "--temperature must be positive; expected a finite number > 0, found -0.0",
        args=("generate", "--sample", "--temperature", "-0.0"),
        names="--temperature",
    ),
    case(
        "option-length-penalty-as-typed",
        None,
        None,
        None,
        "--length-penalty 1e300 overflows",
        "found 1e300\n",
        args=("generate", "--beam", "2", "--length-penalty", "1e300"),
        names="--length-penalty",
    ),
    case(  # --scale is read as the file reads it: its 0 an int, as `scale: 0` is
        "attend-zero-scale-as-typed",
        None,
        "attention.scale",
        None,
        "expected a number > 0, found the number 0\n",  # not 0.0
        args=("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0", "--scale", "0"),
        names="command line",
    ),
    *(
        case(
            f"attend-scale-{text}",
            None,
            None,
            None,
            f"--scale: number too large; expected {FLOAT64_MOST}, found {text}\n",
            args=("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0", "--scale", text),
            names="--scale",
        )
        for text in ("1e400", "-1e400")
    ),
    case(
        "attend-zero-temperature-as-typed",
        None,
        "attention.temperature",
        None,
        "expected a number > 0, found the number 0\n",  # not 0.0
        args=("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0", "--temperature", "0"),
        names="command line",
    ),
    # Not only a whole number: a calculator's option is shown as typed in the file's
    # message too (the README's `found 1.50`), not as the float it became (-1.5, -1e-05).
    *(
        case(
            f"calculator-{option[2:]}-{text}-as-typed",
            None,
            key,
            None,
            f"found the number {text}\n",
            args=(*args, option, text),
            names="command line",
        )
        for args, option, key in (
            (("norm", "--x", "1 2"), "--eps", "norm.eps"),
            (("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0"), "--scale", "attention.scale"),
            (
                ("attend", "--q", "1 0", "--k", "1 0", "--v", "1 0"),
                "--temperature",
                "attention.temperature",
            ),
            (("pe", "--length", "2", "--d-model", "2"), "--base", "pe.base"),
        )
        for text in ("-1.50", "-1e-5")
    ),
    case(
        "norm-instance-of-a-matrix",
        None,
        None,
        None,
        "instance norm takes a B x C x n array",
        args=("norm", "--x", "1 2", "--kind", "instance"),
        names="--x",
    ),
    case(
        "pe-absurd",
        None,
        "pe",
        None,
        "too large: 100000 x 100000 numbers are over the limit",
        "found 10,000,000,000",
        args=("pe", "--length", "100000", "--d-model", "100000"),
        names="command line",
    ),
    case(
        "pe-unknown-kind",
        None,
        "pe.kind",
        None,
        "expected one of: sinusoidal, rope, found the string 'sin'",
        args=("pe", "--length", "2", "--d-model", "2", "--kind", "sin"),
        names="command line",
    ),
    case(
        "explain-unknown-step",
        BASE,
        None,
        None,
        "no step 'encoder.0.self_attn.h0.sofmax' in this run",
        "did you mean 'encoder.0.self_attn.h0.softmax'?",
        args=("explain", "encoder.0.self_attn.h0.sofmax", "{file}"),
    ),
    case(  # (it said "see `trace-tf encode` or `decode`", which refuse this file)
        "explain-unknown-step-of-an-operation",
        "norm:\n  x: [[1, 2]]\n",
        None,
        None,
        "no step 'norm.x' in this run",
        "expected one of its steps: norm.mean, norm.var, norm.centered, norm.out",
        "found 'norm.x'",
        args=("explain", "norm.x", "{file}"),
    ),
    case(
        "explain-cell-outside",
        BASE,
        None,
        None,
        "--cell 9,9 is outside encoder.pe",
        "found '9,9'",
        args=("explain", "encoder.pe", "{file}", "--cell", "9,9"),
    ),
    case(
        "diff-second-file-missing",
        BASE,
        None,
        None,
        "no such file",
        args=("diff", "{file}", "{dir}/nope.yaml"),
        names="{dir}/nope.yaml",
    ),
    case(
        "diff-set-b-unknown-key",
        BASE,
        "model.n_head",
        None,
        "did you mean 'n_heads'?",
        args=("diff", "{file}", "--set-b", "model.n_head=1"),
    ),
]

PERFORMANCE = [
    case(
        "cost-malformed-vary",
        BASE,
        None,
        None,
        "expected L=N,N,... (sequence length) or D=N,N,... (d_model)",
        "found 'L=x'",
        args=("cost", "{file}", "--vary", "L=x"),
        names="--vary",
    ),
    case(
        "cost-absurd-length",
        BASE,
        "model",
        1,
        "too large",
        args=("cost", "{file}", "--vary", "L=100000000"),
    ),
    case(
        "unknown-dtype",
        BASE,
        None,
        None,
        "--dtype must be float64 or float32, not 'float16'",
        args=("encode", "{file}", "--dtype", "float16"),
        names="--dtype",
    ),
    case(  # a misspelt choice of an option is suggested, as a choice in the file is
        "misspelt-dtype",
        BASE,
        None,
        None,
        "--dtype must be float64 or float32, not 'float23' (did you mean 'float32'?)",
        args=("encode", "{file}", "--dtype", "float23"),
        names="--dtype",
    ),
    case(
        "misspelt-format",
        BASE,
        None,
        None,
        "--format must be one of table, json, npz, csv, not 'jsn' (did you mean 'json'?)",
        args=("encode", "{file}", "--format", "jsn"),
        names="--format",
    ),
    case(
        "format-in-capitals",
        BASE,
        None,
        None,
        "--format must be one of table, json, not 'JSON' (did you mean 'json'?)",
        args=("check", "{file}", "--format", "JSON"),
        names="--format",
    ),
    case(
        "csv-of-many-steps",
        BASE,
        None,
        None,
        "--format csv writes one step, and 33 are selected; choose one with `trace-tf step "
        "--stage PATH`",
        args=("encode", "{file}", "--format", "csv"),
        names="--format csv",
    ),
    case(  # generate chooses with its own --stage, not with `trace-tf step`
        "csv-of-many-generated-steps",
        ENC_DEC.replace("{bos: S}", "{bos: S, eos: c}"),
        None,
        None,
        "are selected; choose one with --stage PATH (a whole path, e.g. t0.probs)",
        args=("generate", "{file}", "--trace", "--max-tokens", "1", "--format", "csv"),
        names="--format csv",
    ),
]

# Text the user gave, echoed in a message, is shortened in its middle: a token, key or
# stage of a million characters made a message of a million (or three million).
HUGE = "x" * 1_000_000
SHORT_HUGE = "'" + "x" * 40 + "…" + "x" * 10 + "' (1,000,000 characters)"
LONG_TEXT = [
    case(
        f"long-{name}",
        text,
        path,
        line,
        says,
        args=args,
        names=names,
    )
    for name, text, path, line, says, args, names in (
        (
            "token",
            BASE.replace("[a, b]\n", f"[a, {HUGE}]\n"),
            "source.1",
            5,
            f"unknown token {SHORT_HUGE}; expected",
            ("encode", "{file}"),
            "{file}",
        ),
        (
            "special-token",
            BASE + f"tokens: {{bos: {HUGE}}}\n",
            "tokens.bos",
            6,
            f"token {SHORT_HUGE} is not in the vocabulary",
            ("encode", "{file}"),
            "{file}",
        ),
        (
            "key-by-set",
            BASE,
            "x" * 180 + "…" + "x" * 10,  # (a key path is clipped too)
            None,
            f"unknown key {SHORT_HUGE} (set by --set",
            ("encode", "{file}", "--set", f"{HUGE}=1"),
            "{file}",
        ),
        (
            "stage",
            BASE,
            None,
            None,
            f"unknown stage {SHORT_HUGE}; expected a stage name",
            ("step", "{file}", "--stage", HUGE),
            "{file}",
        ),
        (
            "variant",
            BASE,
            "variants",
            None,
            f"unknown variant {SHORT_HUGE}; expected",
            ("encode", "{file}", "--variant", HUGE),
            "{file}",
        ),
        (
            "explain-step",
            BASE,
            None,
            None,
            f"no step {SHORT_HUGE} in this run",
            ("explain", HUGE, "{file}"),
            "{file}",
        ),
        (
            "set-without-equals",
            BASE,
            None,
            None,
            f"found {SHORT_HUGE}",
            ("encode", "{file}", "--set", HUGE),
            "--set",
        ),
        (
            "inline-matrix",
            None,
            None,
            None,
            f"--q: row 0: not a number; expected a number, found {SHORT_HUGE}",
            ("attend", "--q", HUGE, "--k", "1", "--v", "1"),
            "--q",
        ),
        (
            "vary",
            BASE,
            None,
            None,
            f"found {SHORT_HUGE}",
            ("cost", "{file}", "--vary", HUGE),
            "--vary",
        ),
    )
]


def test_a_message_never_echoes_a_huge_text_whole(tmp_path: Path) -> None:
    for param in LONG_TEXT:
        bad = param.values[0]
        result = runner.invoke(
            app, [a.replace("{file}", str(tmp_path / "f.yaml")) for a in bad.args]
        )
        assert len(result.stderr) < 2000, (param.id, len(result.stderr))


# Partial rotary (model.rope_dims) and parallel layers (model.parallel): each refusal.
NEOX_DEC = (
    "model:\n  d_model: 8\n  n_heads: 2\n  encoder_layers: 0\n  decoder_layers: 1\n"
    "  norm_position: pre\n  positional: rope\nvocab: [a, b]\ntarget: [a]\n"
)
NEOX = [
    case(
        "rope-dims-odd",
        NEOX_DEC.replace("rope\n", "rope\n  rope_dims: 3\n"),
        "model.rope_dims",
        "rope_dims",
        "expected an even whole number from 2 to d_k 4, found 3",
        args=("decode", "{file}"),
    ),
    case(
        "rope-dims-over-d_k",
        NEOX_DEC.replace("rope\n", "rope\n  rope_dims: 6\n"),
        "model.rope_dims",
        "rope_dims",
        "among the first rope_dims of d_k 4",
        "found 6",
        args=("decode", "{file}"),
    ),
    case(
        "rope-dims-without-rope",
        NEOX_DEC.replace("rope\n", "sinusoidal\n  rope_dims: 2\n"),
        "model.rope_dims",
        "rope_dims",
        "rope_dims counts the columns RoPE turns, and positional is sinusoidal",
        "found positional sinusoidal",
        args=("decode", "{file}"),
    ),
    case(
        "partial-rotary-factor-hf-name",
        NEOX_DEC.replace("rope\n", "rope\n  rope_scaling: {type: linear, factor: 2, "
                         "partial_rotary_factor: 0.25}\n"),
        "model.rope_scaling.partial_rotary_factor",
        "partial_rotary_factor",
        "trace-tf's is model.rope_dims",
        args=("decode", "{file}"),
    ),
    case(
        "parallel-misspelt",
        NEOX_DEC.replace("rope\n", "rope\n  parallel: seperate\n"),
        "model.parallel",
        "parallel",
        "did you mean 'separate'?",
        args=("decode", "{file}"),
    ),
    case(
        "parallel-post-norm",
        NEOX_DEC.replace("pre\n", "post\n  parallel: separate\n"),
        "model.parallel",
        "parallel",
        "a pre-norm layer, and norm_position is post",
        "found norm_position post",
        args=("decode", "{file}"),
    ),
    case(
        "parallel-cross-attention",
        ENC_DEC.replace("decoder_layers: 1", "decoder_layers: 1\n  norm_position: pre\n"
                        "  parallel: shared"),
        "model.parallel",
        "parallel",
        "no settled place beside them",
        "found encoder_layers 1, decoder_layers 1",
        args=("decode", "{file}"),
    ),
    case(
        "parallel-shared-ffn-norm",
        NEOX_DEC.replace("rope\n", "rope\n  parallel: shared\n")
        + "weights:\n  decoder:\n    - ffn:\n        norm: {gamma: [1, 1, 1, 1, 1, 1, 1, 1]}\n",
        "weights.decoder.0.ffn.norm",
        "norm:",
        "the FFN reads the attention's, self_attn.norm",
        "expected no ffn.norm (the norm's weights under weights.decoder.0.self_attn.norm)",
        "found model.parallel: shared",
        args=("decode", "{file}"),
    ),
    case(
        "pe-rope-dims-odd",
        "pe: {length: 3, d_model: 8, kind: rope, rope_dims: 5}\n",
        "pe.rope_dims",
        1,
        "expected an even whole number from 2 to d_model 8, found 5",
        args=("pe", "{file}"),
    ),
]  # fmt: skip


# Gemma 2's soft caps and windows by layer (model.attn_softcap, logit_softcap; window a list)
GEMMA2 = [
    case(
        "attn-softcap-zero",
        NEOX_DEC.replace("rope\n", "rope\n  attn_softcap: 0\n"),
        "model.attn_softcap",
        "attn_softcap",
        "must be positive",
        "expected a number > 0, found the number 0",
        args=("decode", "{file}"),
    ),
    case(
        "attn-softcap-additive",
        NEOX_DEC.replace("rope\n", "rope\n  score: additive\n  attn_softcap: 50\n"),
        "model.attn_softcap",
        "attn_softcap",
        "a soft cap bounds a dot-product score, and model.score is additive",
        args=("decode", "{file}"),
    ),
    case(
        "logit-softcap-text",
        NEOX_DEC.replace("rope\n", "rope\n  logit_softcap: thirty\n"),
        "model.logit_softcap",
        "logit_softcap",
        "not a number",
        args=("decode", "{file}"),
    ),
    case(
        "window-list-length",
        NEOX_DEC.replace("rope\n", "rope\n  window: [4, null]\n"),
        "model.window",
        "window",
        "one entry per decoder layer, and decoder_layers is 1",
        "expected 1 window (each a whole number >= 1",
        "found 2 windows",
        args=("decode", "{file}"),
    ),
    case(
        "window-list-entry",
        NEOX_DEC.replace("rope\n", "rope\n  window: [-4]\n"),
        "model.window.0",
        "window",
        "must be at least 1",
        args=("decode", "{file}"),
    ),
]  # fmt: skip


# Gemma 3's RoPE by layer (model.pe_base, model.rope_scaling as lists): a list only in a
# decoder-only RoPE model, one entry per decoder layer, each checked as the single value
SCALED = "{type: linear, factor: 8}"
GEMMA3 = [
    case(
        "pe-base-list-length",
        NEOX_DEC.replace("rope\n", "rope\n  pe_base: [10000, 1000000]\n"),
        "model.pe_base",
        "pe_base",
        "a list of bases has one entry per decoder layer, and decoder_layers is 1",
        "expected 1 base, or one value for every layer, found 2 bases",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-list-entry",
        NEOX_DEC.replace("rope\n", "rope\n  pe_base: [-10000]\n"),
        "model.pe_base.0",
        "pe_base",
        "must be positive",
        "expected a number > 0, found the number -10000",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-list-text",
        NEOX_DEC.replace("decoder_layers: 1", "decoder_layers: 2").replace(
            "rope\n", "rope\n  pe_base: [10000, big]\n"
        ),
        "model.pe_base.1",
        "pe_base",
        "not a number",
        "found the string 'big'",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-list-sinusoidal",
        NEOX_DEC.replace("rope\n", "sinusoidal\n  pe_base: [10000]\n"),
        "model.pe_base",
        "pe_base",
        "a list of bases gives each decoder layer its own RoPE, and model.positional is "
        "sinusoidal",
        "expected model.positional: rope beside a list, or one value for model.pe_base",
        "found a list of 1 base",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-list-encoder",
        NEOX_DEC.replace("encoder_layers: 0", "encoder_layers: 1").replace(
            "rope\n", "rope\n  pe_base: [10000]\n"
        ).replace("target: [a]", "source: [a]\ntarget: [a]"),
        "model.pe_base",
        "pe_base",
        "a list of bases is for a decoder-only model (one entry per decoder layer), and "
        "encoder_layers is 1",
        "expected model.encoder_layers: 0 beside a list",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-length",
        NEOX_DEC.replace("rope\n", f"rope\n  rope_scaling: [null, {SCALED}]\n"),
        "model.rope_scaling",
        "rope_scaling",
        "a list of RoPE scalings has one entry per decoder layer, and decoder_layers is 1",
        "expected 1 scaling, or one value for every layer, found 2 scalings",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-alibi",
        NEOX_DEC.replace("rope\n", "alibi\n  rope_scaling: [null]\n"),
        "model.rope_scaling",
        "rope_scaling",
        "a list of RoPE scalings gives each decoder layer its own RoPE, and "
        "model.positional is alibi",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-factor",
        NEOX_DEC.replace("rope\n", "rope\n  rope_scaling: [{type: linear, factor: 0}]\n"),
        "model.rope_scaling.0.factor",
        "rope_scaling",
        "must be positive",
        "expected a number > 0, found the number 0",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-type",
        NEOX_DEC.replace("rope\n", "rope\n  rope_scaling: [{type: dynamic, factor: 2}]\n"),
        "model.rope_scaling.0.type",
        "rope_scaling",
        "RoPE scaling dynamic (dynamic NTK) recomputes the frequencies",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-not-mapping",
        NEOX_DEC.replace("rope\n", "rope\n  rope_scaling: [8]\n"),
        "model.rope_scaling.0",
        "rope_scaling",
        "not a mapping",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-list-yarn-base-1",
        NEOX_DEC.replace(
            "rope\n",
            "rope\n  pe_base: [1]\n  rope_scaling: [{type: yarn, factor: 2, original_max_len: 8}]\n",
        ),
        "model.rope_scaling.0",
        "rope_scaling",
        "yarn finds its band of pairs by dividing by ln(model.pe_base.0), and model.pe_base.0 "
        "is 1",
        args=("decode", "{file}"),
    ),
]  # fmt: skip


# Cohere's logit_scale (a number > 0) and Cohere 2's layers without RoPE (a null entry of
# model.pe_base's list: none for every layer, nor a scaling for such a layer)
COHERE = [
    case(
        "logit-scale-zero",
        NEOX_DEC.replace("rope\n", "rope\n  logit_scale: 0\n"),
        "model.logit_scale",
        "logit_scale",
        "must be positive",
        "expected a number > 0, found the number 0",
        args=("decode", "{file}"),
    ),
    case(
        "logit-scale-text",
        NEOX_DEC.replace("rope\n", "rope\n  logit_scale: small\n"),
        "model.logit_scale",
        "logit_scale",
        "not a number",
        "found the string 'small'",
        args=("decode", "{file}"),
    ),
    case(
        "logit-scale-float32-zero",
        NEOX_DEC.replace("rope\n", "rope\n  dtype: float32\n  logit_scale: 1.0e-50\n"),
        "model.logit_scale",
        "logit_scale",
        "below the range of float32",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-list-all-null",
        NEOX_DEC.replace("decoder_layers: 1", "decoder_layers: 2").replace(
            "rope\n", "rope\n  pe_base: [null, null]\n"
        ),
        "model.pe_base",
        "pe_base",
        "a null base leaves its layer without RoPE, and every entry is null",
        "expected a base (a number > 0) for at least one layer, or model.positional: none",
        "found a list of 2 nulls",
        args=("decode", "{file}"),
    ),
    case(
        "rope-scaling-at-null-base",
        NEOX_DEC.replace("decoder_layers: 1", "decoder_layers: 2").replace(
            "rope\n", f"rope\n  pe_base: [10000, null]\n  rope_scaling: [null, {SCALED}]\n"
        ),
        "model.rope_scaling.1",
        "rope_scaling",
        "a RoPE scaling rescales a layer's RoPE frequencies, and model.pe_base.1 is null",
        "expected null for model.rope_scaling.1, or a base for model.pe_base.1",
        args=("decode", "{file}"),
    ),
    case(
        "pe-base-null-single",
        NEOX_DEC.replace("rope\n", "rope\n  pe_base: null\n"),
        "model.pe_base",
        "pe_base",
        "not a number",
        args=("decode", "{file}"),
    ),
]  # fmt: skip


# GPT-OSS's attention sinks (model.attn_sinks; a head's sink, a block's fused sinks)
SINK_DEC = NEOX_DEC.replace("rope\n", "rope\n  attn_sinks: true\n")
SINKS = [
    case(
        "attn-sinks-not-bool",
        NEOX_DEC.replace("rope\n", "rope\n  attn_sinks: 1\n"),
        "model.attn_sinks",
        "attn_sinks",
        "found the number 1",
        args=("decode", "{file}"),
    ),
    case(
        "attn-sinks-gaussian",
        NEOX_DEC.replace("rope\n", "rope\n  score: gaussian\n  attn_sinks: true\n"),
        "model.attn_sinks",
        "attn_sinks",
        "an attention sink is a logit beside the scaled dot products",
        "model.score is gaussian",
        "expected model.score scaled_dot, dot or bilinear beside model.attn_sinks: true",
        "found model.score: gaussian",
        args=("decode", "{file}"),
    ),
    case(
        "sink-with-sinks-off",
        NEOX_DEC + "weights:\n  decoder:\n    - self_attn:\n        heads: [{sink: 0.5}]\n",
        "weights.decoder.0.self_attn.heads.0.sink",
        "sink:",
        "an attention sink is given, but model.attn_sinks is false",
        "expected model.attn_sinks: true, or no sink, found model.attn_sinks: false",
        args=("decode", "{file}"),
    ),
    case(
        "fused-sinks-with-sinks-off",
        NEOX_DEC + "weights:\n  decoder:\n    - self_attn:\n        sinks: [0.5, 1]\n",
        "weights.decoder.0.self_attn.sinks",
        "sinks: [",
        "model.attn_sinks is false",
        args=("decode", "{file}"),
    ),
    case(
        "sinks-in-cross-attention",
        ENC_DEC.replace("decoder_layers: 1", "decoder_layers: 1\n  attn_sinks: true")
        + "weights:\n  decoder:\n    - cross_attn:\n        sinks: [0.5, 1]\n",
        "weights.decoder.0.cross_attn.sinks",
        "sinks: [",
        "none is settled for cross-attention",
        "expected a sink only in self_attn blocks, found a sink in cross_attn",
        args=("decode", "{file}"),
    ),
    case(
        "sink-in-cross-attention-head",
        ENC_DEC.replace("decoder_layers: 1", "decoder_layers: 1\n  attn_sinks: true")
        + "weights:\n  decoder:\n    - cross_attn:\n        heads: [{}, {sink: 1}]\n",
        "weights.decoder.0.cross_attn.heads.1.sink",
        "sink:",
        "found a sink in cross_attn",
        args=("decode", "{file}"),
    ),
    case(
        "fused-sinks-shape",
        SINK_DEC + "weights:\n  decoder:\n    - self_attn:\n        sinks: [0.5, 1, 2]\n",
        "weights.decoder.0.self_attn.sinks",
        "sinks: [",
        "n_heads",
        args=("decode", "{file}"),
    ),
    case(
        "sink-a-list",
        SINK_DEC + "weights:\n  decoder:\n    - self_attn:\n        heads: [{sink: [1]}]\n",
        "weights.decoder.0.self_attn.heads.0.sink",
        "sink:",
        "a number",
        args=("decode", "{file}"),
    ),
    case(
        "sink-not-finite",
        SINK_DEC + "weights:\n  decoder:\n    - self_attn:\n        heads: [{sink: .inf}]\n",
        "weights.decoder.0.self_attn.heads.0.sink",
        "sink:",
        "finite",
        args=("decode", "{file}"),
    ),
    case(
        "sink-and-fused-sinks",
        SINK_DEC + "weights:\n  decoder:\n    - self_attn:\n        sinks: [0.5, 1]\n"
        "        heads: [{sink: 1}]\n",
        "weights.decoder.0.self_attn.heads.0.sink",
        "sink:",
        "one form per block",
        args=("decode", "{file}"),
    ),
]  # fmt: skip


# A mixture of experts (model.experts, experts_top_k, experts_normalize; ffn.router, experts)
MOE_DEC = NEOX_DEC.replace("rope\n", "rope\n  experts: 2\n  experts_top_k: 1\n")
# two decoder layers, a mixture of 2 experts then a dense FFN
MOE_L2 = NEOX_DEC.replace("decoder_layers: 1", "decoder_layers: 2").replace(
    "rope\n", "rope\n  experts: [2, null]\n  experts_top_k: 1\n"
)
MOE = [
    case(
        "experts-top-k-missing",
        NEOX_DEC.replace("rope\n", "rope\n  experts: 4\n"),
        "model.experts_top_k",
        "model:",
        "missing required key experts_top_k",
        "expected a whole number from 1 to model.experts (4)",
        args=("decode", "{file}"),
    ),
    case(
        "experts-top-k-above-experts",
        NEOX_DEC.replace("rope\n", "rope\n  experts: 4\n  experts_top_k: 5\n"),
        "model.experts_top_k",
        "experts_top_k",
        "more experts per token than model.experts (4)",
        "expected a whole number from 1 to 4, found 5",
        args=("decode", "{file}"),
    ),
    case(
        "experts-top-k-without-experts",
        NEOX_DEC.replace("rope\n", "rope\n  experts_top_k: 2\n"),
        "model.experts_top_k",
        "experts_top_k",
        "a setting of a mixture of experts, and model.experts is not given",
        args=("decode", "{file}"),
    ),
    case(
        "experts-normalize-text",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  experts_normalize: yes please\n"),
        "model.experts_normalize",
        "experts_normalize",
        "not a boolean",
        "expected true or false",
        args=("decode", "{file}"),
    ),
    case(
        "experts-zero",
        MOE_DEC.replace("experts: 2", "experts: 0"),
        "model.experts",
        "experts: 0",
        "must be at least 1",
        args=("decode", "{file}"),
    ),
    case(
        "experts-dense-W-1",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        W_1: [[1]]\n",
        "weights.decoder.0.ffn.W_1",
        "W_1",
        "with model.experts (2) each expert has its own W_1",
        "expected weights.decoder.0.ffn.experts.<e>.W_1 (e from 0 to 1)",
        args=("decode", "{file}"),
    ),
    case(
        "experts-router-in-a-dense-ffn",
        NEOX_DEC + "weights:\n  decoder:\n    - ffn:\n        router: [[1]]\n",
        "weights.decoder.0.ffn.router",
        "router",
        "router belongs to a mixture of experts, and model.experts is not given",
        args=("decode", "{file}"),
    ),
    case(
        "experts-too-many",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        experts: [{}, {}, {}]\n",
        "weights.decoder.0.ffn.experts.2",
        "experts: [",
        "more experts than model.experts (2)",
        "found 3 experts",
        args=("decode", "{file}"),
    ),
    case(
        "experts-unknown-key",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        experts: [{W_q: [[1]]}]\n",
        "weights.decoder.0.ffn.experts.0.W_q",
        "W_q",
        "unknown key 'W_q'",
        "expected one of: W_1, b_1, W_3, b_3, W_2, b_2",
        args=("decode", "{file}"),
    ),
    case(
        "experts-router-shape",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        router: [[1, 2]]\n",
        "weights.decoder.0.ffn.router",
        "router",
        "expected shape 8 x 2 (d_model x experts), found shape 1 x 2",
        args=("decode", "{file}"),
    ),
    case(
        "experts-W-3-ungated",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        experts: [{}, {W_3: [[1]]}]\n",
        "weights.decoder.0.ffn.experts.1.W_3",
        "W_3",
        "W_3 is the up projection of a gated FFN, but model.activation is relu",
        args=("decode", "{file}"),
    ),
    case(
        "experts-W-1-shape",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        experts: [{}, {W_1: [[1]]}]\n",
        "weights.decoder.0.ffn.experts.1.W_1",
        "W_1",
        "expected shape 8 x 32 (d_model x d_ff), found shape 1 x 1",
        args=("decode", "{file}"),
    ),
    case(
        "experts-not-a-list",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        experts: {W_1: 3}\n",
        "weights.decoder.0.ffn.experts",
        "experts: {",
        "not a list",
        "expected a list of 2 (one entry per expert), found a mapping",
        args=("decode", "{file}"),
    ),
    case(
        "experts-set-off-leaves-top-k",
        MOE_DEC,
        "model.experts_top_k",
        "experts_top_k",
        "model.experts is not given (a dense FFN) (model.experts set by --set)",
        args=("decode", "{file}", "--set", "model.experts=null"),
    ),
    # model.experts as a list: each decoder layer's (null: a dense FFN), as model.window's
    case(
        "experts-list-length",
        NEOX_DEC.replace("rope\n", "rope\n  experts: [2, null]\n  experts_top_k: 1\n"),
        "model.experts",
        "experts: [",
        "a list of experts has one entry per decoder layer, and decoder_layers is 1",
        "expected 1 expert count (each a whole number >= 1 of experts, or null: a dense FFN)",
        "found 2 expert counts",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-entry",
        MOE_L2.replace("[2, null]", "[2, 0]"),
        "model.experts.1",
        "experts: [",
        "must be at least 1",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-entry-text",
        MOE_L2.replace("[2, null]", "[two, null]"),
        "model.experts.0",
        "experts: [",
        "not a whole number",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-beside-an-encoder",
        ENC_DEC.replace("decoder_layers: 1\n", "decoder_layers: 1\n  experts: [2]\n  experts_top_k: 1\n"),
        "model.experts",
        "experts: [",
        "a list of experts is for a decoder-only model (one entry per decoder layer), and "
        "encoder_layers is 1",
        "expected model.encoder_layers: 0 beside a list, or one value for model.experts",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-top-k-above-the-fewest",
        MOE_L2.replace("[2, null]", "[4, 2]").replace("top_k: 1", "top_k: 3"),
        "model.experts_top_k",
        "experts_top_k",
        "more experts per token than model.experts.1 (2)",
        "expected a whole number from 1 to 2, found 3",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-all-dense-top-k",
        MOE_L2.replace("[2, null]", "[null, null]"),
        "model.experts_top_k",
        "experts_top_k",
        "a setting of a mixture of experts, and model.experts gives no layer experts",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-router-in-the-dense-layer",
        MOE_L2 + "weights:\n  decoder:\n    - {}\n    - ffn:\n        router: [[1]]\n",
        "weights.decoder.1.ffn.router",
        "router",
        "router belongs to a mixture of experts, and model.experts.1 is null (a dense FFN)",
        "expected model.experts.1 and model.experts_top_k beside router",
        args=("decode", "{file}"),
    ),
    case(
        "experts-list-W-1-in-the-sparse-layer",
        MOE_L2 + "weights:\n  decoder:\n    - ffn:\n        W_1: [[1]]\n",
        "weights.decoder.0.ffn.W_1",
        "W_1",
        "with model.experts.0 (2) each expert has its own W_1",
        "or no model.experts.0 (a dense FFN)",
        args=("decode", "{file}"),
    ),
    # a shared expert (model.shared_expert gated or plain, shared_expert_d_ff; ffn.shared,
    # ffn.shared_gate)
    case(
        "shared-expert-unknown",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert: always\n"),
        "model.shared_expert",
        "shared_expert",
        "expected one of: none, gated, plain",
        args=("decode", "{file}"),
    ),
    case(
        "shared-expert-without-experts",
        NEOX_DEC.replace("rope\n", "rope\n  shared_expert: gated\n"),
        "model.shared_expert",
        "shared_expert",
        "a shared expert is beside a mixture's routed experts, and model.experts is not given",
        "expected model.experts beside model.shared_expert, or shared_expert: none",
        args=("decode", "{file}"),
    ),
    case(
        "shared-expert-d-ff-without-one",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert_d_ff: 16\n"),
        "model.shared_expert_d_ff",
        "shared_expert_d_ff",
        "shared_expert_d_ff is the width of a shared expert, and model.shared_expert is none",
        args=("decode", "{file}"),
    ),
    case(
        "shared-expert-d-ff-zero",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert: plain\n  shared_expert_d_ff: 0\n"),
        "model.shared_expert_d_ff",
        "shared_expert_d_ff",
        "must be at least 1",
        args=("decode", "{file}"),
    ),
    case(
        "shared-without-a-shared-expert",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        shared: {W_1: [[1]]}\n",
        "weights.decoder.0.ffn.shared",
        "shared:",
        "shared belongs to a gated or plain shared expert, and model.shared_expert is none",
        args=("decode", "{file}"),
    ),
    case(
        "shared-gate-of-a-plain-one",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert: plain\n")
        + "weights:\n  decoder:\n    - ffn:\n        shared_gate: [[1]]\n",
        "weights.decoder.0.ffn.shared_gate",
        "shared_gate",
        "shared_gate belongs to a gated shared expert, and model.shared_expert is plain",
        args=("decode", "{file}"),
    ),
    case(
        "shared-gate-shape",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert: gated\n")
        + "weights:\n  decoder:\n    - ffn:\n        shared_gate: [[1, 2]]\n",
        "weights.decoder.0.ffn.shared_gate",
        "shared_gate",
        "expected shape 8 x 1 (d_model x 1), found shape 1 x 2",
        args=("decode", "{file}"),
    ),
    case(
        "shared-W-1-width",
        MOE_DEC.replace("top_k: 1\n", "top_k: 1\n  shared_expert: gated\n  shared_expert_d_ff: 3\n")
        + "weights:\n  decoder:\n    - ffn:\n        shared: {W_1: [[1]]}\n",
        "weights.decoder.0.ffn.shared.W_1",
        "W_1",
        "expected shape 8 x 3 (d_model x shared_expert_d_ff), found shape 1 x 1",
        args=("decode", "{file}"),
    ),
    case(
        "shared-in-a-dense-ffn",
        NEOX_DEC + "weights:\n  decoder:\n    - ffn:\n        shared_gate: [[1]]\n",
        "weights.decoder.0.ffn.shared_gate",
        "shared_gate",
        "shared_gate belongs to a mixture of experts, and model.experts is not given",
        args=("decode", "{file}"),
    ),
    # GPT-OSS's router bias and clamped SwiGLU (model.activation swiglu_oss)
    case(
        "experts-router-bias-length",
        MOE_DEC + "weights:\n  decoder:\n    - ffn:\n        router_bias: [1, 2, 3]\n",
        "weights.decoder.0.ffn.router_bias",
        "router_bias",
        "expected shape 2 (experts), found shape 3",
        args=("decode", "{file}"),
    ),
    case(
        "experts-router-bias-in-a-dense-ffn",
        NEOX_DEC + "weights:\n  decoder:\n    - ffn:\n        router_bias: [1]\n",
        "weights.decoder.0.ffn.router_bias",
        "router_bias",
        "router_bias belongs to a mixture of experts, and model.experts is not given",
        args=("decode", "{file}"),
    ),
    case(
        "swiglu-limit-without-swiglu-oss",
        NEOX_DEC.replace("rope\n", "rope\n  activation: swiglu\n  swiglu_limit: 7\n"),
        "model.swiglu_limit",
        "swiglu_limit",
        "swiglu_limit is a setting of GPT-OSS's clamped SwiGLU, and model.activation is swiglu",
        "expected model.activation: swiglu_oss beside model.swiglu_limit, or no swiglu_limit",
        args=("decode", "{file}"),
    ),
    case(
        "swiglu-alpha-set-off",
        NEOX_DEC.replace("rope\n", "rope\n  activation: swiglu_oss\n  swiglu_alpha: 1\n"),
        "model.swiglu_alpha",
        "swiglu_alpha",
        "and model.activation is relu (model.activation set by --set)",
        args=("decode", "{file}", "--set", "model.activation=relu"),
    ),
    case(
        "swiglu-limit-zero",
        NEOX_DEC.replace("rope\n", "rope\n  activation: swiglu_oss\n  swiglu_limit: 0\n"),
        "model.swiglu_limit",
        "swiglu_limit: 0",
        "must be positive",
        args=("decode", "{file}"),
    ),
    case(
        "swiglu-alpha-text",
        NEOX_DEC.replace("rope\n", "rope\n  activation: swiglu_oss\n  swiglu_alpha: big\n"),
        "model.swiglu_alpha",
        "swiglu_alpha",
        "not a number",
        args=("decode", "{file}"),
    ),
]  # fmt: skip


CORPUS = [
    *LONG_TEXT,
    *SHAPES,
    *MALFORMED,
    *DUPLICATES,
    *RAGGED,
    *NOT_NUMBERS,
    *NON_FINITE,
    *UNKNOWN_KEYS,
    *D_MODEL,
    *TOKENS,
    *SIZES_,
    *STRUCTURE,
    *STAGES,
    *SETS,
    *FILES,
    *CALCULATORS,
    *PERFORMANCE,
    *NEOX,
    *GEMMA2,
    *GEMMA3,
    *SINKS,
    *MOE,
    *COHERE,
]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_bad(bad: Bad, tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    if bad.text is not None:
        if isinstance(bad.text, bytes):
            file.write_bytes(bad.text)
        else:
            file.write_text(bad.text, encoding="utf-8")
    before = {p: _digest(p) for p in tmp_path.iterdir() if p.is_file()}

    def fill(s: str) -> str:
        return s.replace("{file}", str(file)).replace("{dir}", str(tmp_path))

    result = runner.invoke(app, [fill(a) for a in bad.args])
    err = result.stderr
    assert result.exit_code == 2, (result.exit_code, err, result.exception)
    assert "Traceback" not in err + result.stdout
    assert result.stdout == ""
    assert err.startswith("trace-tf: error: ") and err.count("\n") == 1, err  # one line
    source = fill(bad.names)
    assert source in err
    if bad.line is not None:
        assert f"{source}:{bad.line}: " in err
    if bad.path is not None:
        assert f": {bad.path}: " in err
    for part in bad.says:
        assert fill(part) in err
    # Nothing the user gave is modified, and nothing is written.
    assert {p: _digest(p) for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("bad", CORPUS)
def test_bad_input_exits_2_with_one_clear_line(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)


def test_the_corpus_is_large() -> None:
    assert len(CORPUS) >= 150


# Every command that reads a config gives the same clear error for a bad file.
COMMAND_LINES = [
    ("encode", "{file}"),
    ("decode", "{file}"),
    ("step", "{file}", "--stage", "q"),
    ("generate", "{file}"),
    ("explain", "encoder.pe", "{file}"),
    ("cost", "{file}"),
    ("diff", "{file}", "{dir}/good.yaml"),
    ("diff", "{dir}/good.yaml", "{file}"),
    ("check", "{file}"),
    ("check", "{dir}/good.yaml", "{file}"),  # the bad file second: still named
]
FILE_ERRORS = [
    ("malformed", "model: {d_model: 4\n", None, 2, "malformed YAML"),
    ("unknown-key", ENC_DEC + "sorce: [a]\n", "sorce", 9, "did you mean 'source'?"),
    (
        "wrong-shape",
        ENC_DEC + "embeddings:\n  a: [1]\n",
        "embeddings.a",
        10,
        "expected shape 4 (d_model), found shape 1",
    ),
    (
        "non-finite",
        ENC_DEC.replace("n_heads: 2", "n_heads: 2\n  scale: .nan"),
        "model.scale",
        4,
        "nan",
    ),
    ("binary", b"\x00\x01\x02", None, None, "binary data"),
]


@pytest.mark.parametrize("args", COMMAND_LINES, ids=lambda a: "-".join(a[:2]))
@pytest.mark.parametrize("error", FILE_ERRORS, ids=lambda e: e[0])
def test_every_command_reports_a_bad_file(
    args: tuple[str, ...],
    error: tuple[str, str | bytes, str | None, int | None, str],
    tmp_path: Path,
) -> None:
    (tmp_path / "good.yaml").write_text(ENC_DEC, encoding="utf-8")
    _, text, path, line, says = error
    _run_bad(Bad(text, path, line, (says,), args), tmp_path)


# ---------------------------------------------------------------------------
# Beyond the corpus: mangled copies of real configs never crash the loader or the engine
# ---------------------------------------------------------------------------

FIXTURE_TEXTS = sorted(p.read_text(encoding="utf-8") for p in FIXTURES.glob("*.yaml"))
PIECES = [*"[]{}:,-#&*!|>'\"% \n\t0.9eE+_x", "null", "true", ".nan", "-.inf", "1e400", "~"]
PIECES += ["[]", "{}", "!!str", "!!int", "&a", "*a", "<<: ", "---", "[1, 2]", "[[1], [2, 3]]"]
edits = st.lists(
    st.tuples(
        st.sampled_from(["delete", "insert", "cut", "repeat"]),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.sampled_from(PIECES),
    ),
    min_size=1,
    max_size=4,
)


def mangle(text: str, changes: list[tuple[str, int, int, str]]) -> str:
    lines = text.splitlines(keepends=True)
    for op, a, b, piece in changes:
        i = a % len(lines)
        j = b % (len(lines[i]) + 1)
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "insert":
            lines[i] = lines[i][:j] + piece + lines[i][j:]
        elif op == "cut":
            lines[i] = lines[i][: min(j, b % 7 + j)] + lines[i][j + b % 7 :]
        else:
            lines.insert(j % (len(lines) + 1), lines[i])
    return "".join(lines)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.sampled_from(FIXTURE_TEXTS), changes=edits)
def test_mangled_configs_are_run_or_refused_never_a_crash(
    text: str, changes: list[tuple[str, int, int, str]], tmp_path: Path
) -> None:
    path = tmp_path / "mangled.yaml"
    path.write_text(mangle(text, changes), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning escapes either
        try:
            run(load(str(path)), "full")
        except InputError as err:
            assert err.file == str(path) or (err.file or "").startswith(str(path))


@pytest.mark.parametrize(
    "text, says",
    [
        (
            BASE + "vocab: [a]\n",
            "6: vocab: duplicate key 'vocab' (first given on line 4); expected each key once",
        ),
        (
            "- a\n- b\n",
            ": the config must be a mapping of keys; expected a mapping (model:, vocab:, source:, ... or one operation), found a list of 2",
        ),
        (
            "? [a]\n: 1\n",
            "1: a mapping key must be a plain scalar; expected a name or number, found a list",
        ),
        (
            "a: &x [1, *x]\n",
            "1: a.1: recursive YAML alias; expected an alias of a value it is not inside, found an alias inside the list or mapping it names",
        ),
        (
            b"model:\n  d_model: 4\n\x00\n",
            "3: not a text file (binary data); expected YAML text (UTF-8), found a NUL byte (byte 20)",
        ),
    ],
    ids=["duplicate", "a-list", "complex-key", "recursive-alias", "nul"],
)
def test_what_the_loader_refuses_says_what_was_expected(
    text: str | bytes, says: str, tmp_path: Path
) -> None:
    file = tmp_path / "c.yaml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = runner.invoke(app, ["encode", str(file)])
    assert result.exit_code == 2
    assert result.stderr == f"trace-tf: error: {file}:{says}\n".replace(f"{file}::", f"{file}:")
