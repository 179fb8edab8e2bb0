"""Loading: defaults, drawing, overrides, and clear errors with key paths and lines."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import config_from

from trace_tf.config import Config, load, parse_set
from trace_tf.errors import InputError

BASE = """\
model:
  d_model: 4
  n_heads: 2
vocab: [a, b, c]
source: [a, b]
"""


def test_defaults_follow_the_spec() -> None:
    cfg = config_from({"model": {"d_model": 8, "n_heads": 2}, "vocab": ["a"], "source": ["a"]})
    assert isinstance(cfg, Config)
    m = cfg.model
    assert (m.d_k, m.d_v, m.d_ff, m.encoder_layers, m.decoder_layers) == (4, 4, 32, 1, 0)
    assert (m.positional, m.norm_position, m.final_norm, m.norm, m.norm_eps) == (
        "sinusoidal",
        "post",
        False,
        "layer",
        1e-5,
    )
    assert m.scale == pytest.approx(2.0) and m.activation == "relu" and m.seed == 0
    assert config_from(
        {"model": {"d_model": 4, "norm_position": "pre"}, "source": [[1, 2, 3, 4]]}
    ).model.final_norm  # type: ignore[union-attr]


def test_drawn_weights_follow_the_spec_formula() -> None:
    cfg = config_from(
        {
            "model": {"d_model": 4, "n_heads": 2, "seed": 5, "init_std": 0.5},
            "vocab": ["a"],
            "source": ["a"],
        }
    )
    assert isinstance(cfg, Config)
    path = "encoder.0.self_attn.heads.1.W_k"
    rng = np.random.default_rng([5, zlib.crc32(path.encode())])
    np.testing.assert_array_equal(
        cfg.encoder[0].self_attn.heads[1].W_k, rng.standard_normal((4, 2)) * 0.5
    )
    rng = np.random.default_rng([5, zlib.crc32(b"embeddings.a")])
    np.testing.assert_array_equal(cfg.embeddings["a"], rng.standard_normal(4) * 0.5)
    assert path in cfg.drawn and "encoder.0.ffn.W_2" in cfg.drawn


def test_every_kind_of_drawn_array_follows_the_spec_formula_at_its_spec_shape() -> None:
    # SPEC section 2: rng = default_rng([seed, crc32(path)]); rng.standard_normal(shape)
    # * init_std, path below `weights` (per head for attention) or embeddings.<token>.
    d, H, dk, dv, dff, max_len, seed, std = 6, 2, 2, 3, 5, 7, 11, 0.25
    cfg = config_from(
        {
            "model": {
                "d_model": d, "n_heads": H, "d_k": dk, "d_v": dv, "d_ff": dff,
                "decoder_layers": 2, "positional": "learned", "max_len": max_len,
                "seed": seed, "init_std": std,
            },
            "vocab": ["a", "b", "c"],
            "source": ["a", "b"],
            "target": ["c"],
        }
    )  # fmt: skip
    assert isinstance(cfg, Config)
    shapes = {
        r"embeddings\.\w": (d,),
        r"(en|de)coder\.\d\.(self|cross)_attn\.heads\.\d\.W_[qk]": (d, dk),
        r"(en|de)coder\.\d\.(self|cross)_attn\.heads\.\d\.W_v": (d, dv),
        r"(en|de)coder\.\d\.(self|cross)_attn\.W_o": (H * dv, d),
        r"(en|de)coder\.\d\.ffn\.W_1": (d, dff),
        r"(en|de)coder\.\d\.ffn\.W_2": (dff, d),
        r"positional": (max_len, d),
        r"output\.W": (d, 3),
    }
    arrays = cfg.named_arrays()
    kinds = set()
    for path in cfg.drawn:
        kind, shape = next((k, v) for k, v in shapes.items() if re.fullmatch(k, path))
        kinds.add(kind)
        rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
        name = path if path.startswith("embeddings.") else f"weights.{path}"
        np.testing.assert_array_equal(arrays[name], rng.standard_normal(shape) * std, path)
    assert len(kinds) == len(shapes)
    # every array, once: 3 embeddings; 5 attention blocks of H heads' W_q, W_k, W_v and
    # a W_o; 3 FFNs' W_1, W_2; positional and output.W (biases and norms are not drawn)
    assert len(set(cfg.drawn)) == len(cfg.drawn) == 3 + 5 * (H * 3 + 1) + 3 * 2 + 2
    assert "decoder.1.cross_attn.heads.1.W_v" in cfg.drawn


def test_giving_one_weight_does_not_change_another_drawn_one() -> None:
    base = {"model": {"d_model": 4}, "vocab": ["a"], "source": ["a"]}
    a = config_from(base)
    b = config_from(
        {**base, "weights": {"encoder": [{"ffn": {"W_1": np.zeros((4, 16)).tolist()}}]}}
    )
    assert isinstance(a, Config) and isinstance(b, Config)
    np.testing.assert_array_equal(a.encoder[0].ffn.W_2, b.encoder[0].ffn.W_2)
    np.testing.assert_array_equal(a.encoder[0].self_attn.W_o, b.encoder[0].self_attn.W_o)


def test_fused_weights_split_by_columns() -> None:
    Wq = np.arange(16.0).reshape(4, 4)
    cfg = config_from(
        {
            "model": {"d_model": 4, "n_heads": 2},
            "source": [[1, 2, 3, 4]],
            "weights": {"encoder": [{"self_attn": {"W_q": Wq.tolist()}}]},
        }
    )
    assert isinstance(cfg, Config)
    np.testing.assert_array_equal(cfg.encoder[0].self_attn.heads[1].W_q, Wq[:, 2:4])


def test_set_overrides_read_yaml(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    cfg = load(tmp_yaml(BASE), ["model.scale=30", "model.norm_eps=1e-6", "source=[b, c]"])
    assert isinstance(cfg, Config)
    assert cfg.model.scale == 30 and cfg.model.norm_eps == 1e-6
    assert cfg.source is not None and cfg.source.tokens == ("b", "c")


def test_string_source_is_split() -> None:
    cfg = config_from({"model": {"d_model": 4}, "vocab": ["a", "b"], "source": "a b a"})
    assert isinstance(cfg, Config) and cfg.source is not None
    assert cfg.source.tokens == ("a", "b", "a")


def _error(tmp_yaml, text: str, *sets: str) -> InputError:  # type: ignore[no-untyped-def]
    path = tmp_yaml(text)
    with pytest.raises(InputError) as info:
        load(path, list(sets))
    err = info.value
    assert path in str(err)
    return err


def test_unknown_key_suggests_the_nearest(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE.replace("n_heads", "n_head"))
    assert err.path == "model.n_head" and "did you mean 'n_heads'" in str(err) and err.line == 3


def test_wrong_shape_names_path_expected_and_found(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    text = BASE + "embeddings:\n  a: [1, 2, 3]\n"
    err = _error(tmp_yaml, text)
    assert (
        err.path == "embeddings.a"
        and err.expected == "shape 4 (d_model)"
        and err.found == "shape 3"
        and err.line == 7
    )


def test_duplicate_key_is_refused(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE + "vocab: [a]\n")
    assert "duplicate key" in str(err) and err.line == 6


def test_unknown_token(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE.replace("[a, b]", "[a, d]"))
    assert err.path == "source.1" and "unknown token 'd'" in str(err)


def test_an_empty_vocab_given_is_not_called_missing(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # `vocab: []` beside embeddings: the message said the file had no vocab or embeddings.
    text = "model:\n  d_model: 2\nvocab: []\nembeddings:\n  a: [1, 2]\nsource: [a]\n"
    err = _error(tmp_yaml, text)
    assert (
        err.path == "embeddings.a" and err.expected == "a token of vocab (the vocab given is empty)"
    )
    err = _error(tmp_yaml, "model:\n  d_model: 2\nsource: [a]\n")  # neither given: as it was
    assert (
        err.path == "source.0" and err.expected == "a token (the file has no vocab or embeddings)"
    )
    err = _error(tmp_yaml, BASE.replace("vocab: [a, b, c]", "tokens: {bos: a}"), "vocab=[]")
    assert err.path == "tokens.bos" and "(the vocab given is empty)" in str(err)


def test_non_numeric_and_non_finite_numbers(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE + "embeddings:\n  a: [1, x, 3, 4]\n")
    assert err.path == "embeddings.a.1" and "not a number" in str(err)
    err = _error(tmp_yaml, BASE + "embeddings:\n  a: [1, .nan, 3, 4]\n")
    assert "finite" in str(err)
    err = _error(tmp_yaml, BASE + "embeddings:\n  a: [1, true, 3, 4]\n")
    assert "boolean" in str(err)


def test_heads_not_dividing_d_model(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE.replace("n_heads: 2", "n_heads: 3"))
    assert err.path == "model.n_heads" and "not divisible" in str(err)


def test_python_tags_are_refused_and_never_run(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, "model: !!python/object/apply:os.system ['echo pwned']\n")
    assert "tag" in str(err)


def test_alias_bomb_is_refused(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    err = _error(tmp_yaml, "\n".join(lines) + "\n")
    assert "alias" in str(err)


def test_size_limit_is_checked_before_allocating(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, "model: {d_model: 100000, encoder_layers: 50}\nsource: [[1]]\n")
    assert "limit" in str(err)


def test_malformed_set() -> None:
    with pytest.raises(InputError):
        parse_set("model.scale")


def test_error_from_set_names_the_override(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    err = _error(tmp_yaml, BASE, "model.scale=-1")
    assert err.path == "model.scale" and "--set" in str(err)


@pytest.mark.parametrize(
    "item, through, line",
    [("model.d_model.x=3", "model.d_model", 2), ("source.0.x=3", "source.0", 5)],
)
def test_set_through_a_scalar_is_refused_not_replacing_it(
    tmp_yaml, item: str, through: str, line: int
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(BASE)
    with pytest.raises(InputError) as info:
        load(path, [item])
    err = info.value
    assert err.file == "--set" and err.path == item.partition("=")[0]
    assert f"{through} is not a mapping or list (line {line} of {path})" in str(err)


def test_set_far_past_the_end_of_a_list_is_refused_without_filling_it(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="far past the end of vocab"):
        load(tmp_yaml(BASE), ["vocab.100000000000=z"])


def test_set_with_a_non_ascii_digit_index_is_an_input_error(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="is a list"):
        load(tmp_yaml(BASE), ["vocab.²=z"])


def test_set_creates_missing_layers_to_reach_an_index(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    text = BASE.replace("n_heads: 2", "n_heads: 2\n  encoder_layers: 2")
    cfg = load(tmp_yaml(text), ["weights.encoder.1.ffn.b_2=[1, 2, 3, 4]"])
    assert isinstance(cfg, Config)
    np.testing.assert_array_equal(cfg.encoder[1].ffn.b_2, [1, 2, 3, 4])
    assert cfg.encoder[0].ffn.b_2 is None


_RELATIVE = """
model: {d_model: 2, positional: relative, max_len: 2, norm_position: pre}
vocab: [a]
source: [a]
weights:
  encoder:
    - self_attn: {heads: [{rel_bias: [1, 2, 3]}]}
  encoder_final_norm: {gamma: [1, 1]}
  output: {W: [[1], [2]]}
"""
_LEARNED = """
model: {d_model: 2, positional: learned, max_len: 2}
vocab: [a]
source: [a]
weights: {positional: [[0, 0], [0, 0]]}
variants: {off: {model.positional: none}}
"""


@pytest.mark.parametrize(
    ("text", "sets", "variant", "said"),
    [
        # the file gives rel_bias; positional is turned away from relative
        (_RELATIVE, ["model.positional=sinusoidal"], None, "(model.positional set by --set)"),
        # the file gives learned positions; a variant turns positional to none
        (_LEARNED, [], "off", "(model.positional set by variant 'off')"),
        # the file gives output.W; tying is switched on
        (_RELATIVE, ["model.tie_embeddings=true"], None, "(model.tie_embeddings set by --set)"),
        # the file gives a final norm; post-norm turns the default final norm off
        (_RELATIVE, ["model.norm_position=post"], None, "(model.norm_position set by --set)"),
        (_RELATIVE, ["model.final_norm=false"], None, "(model.final_norm set by --set)"),
    ],
)
def test_a_part_turned_off_by_an_override_names_the_override(
    tmp_path: Path, text: str, sets: list[str], variant: str | None, said: str
) -> None:
    # The weight is refused at its own key, which nothing overrode: only the value of
    # the key that made it wrong was said, not that a --set or a variant had set it.
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load(str(path), sets, variant)
    assert said in str(caught.value)
    load(str(path))  # (the file itself is sound)


TIED = """\
model: {d_model: 3, encoder_layers: 0, decoder_layers: 1, tie_embeddings: true}
vocab: [a, b, c.d]
target: [a, b]
"""


@pytest.mark.parametrize(
    ("at", "said", "instead"),
    [
        ("1.2", "its entry 1, 2 is entry 1 of the embedding of token 'c.d'", "embeddings.c.d.1"),
        ("2.0", "its entry 2, 0 is entry 2 of the embedding of token 'a'", "embeddings.a.2"),
        ("1", "its row 1 is entry 1 of every token's embedding", "embeddings.<token>.1"),
    ],
    ids=["dotted-token", "entry", "row"],
)
def test_an_entry_of_a_tied_output_w_names_the_embedding_entry_that_holds_it(
    tmp_yaml, at: str, said: str, instead: str
) -> None:  # type: ignore[no-untyped-def]
    """The message said only 'output.W is given but model.tie_embeddings is on'."""
    path = tmp_yaml(TIED)
    with pytest.raises(InputError) as info:
        load(path, [f"weights.output.W.{at}=5"])
    err = info.value
    assert err.path == f"weights.output.W.{at}", str(err)
    assert "output.W is the embeddings transposed, as model.tie_embeddings is on" in str(err)
    assert said in str(err) and f"set there: {instead}=VALUE" in str(err), str(err)
    if "<" not in instead:  # the entry named is the one the tied output reads, by numpy
        from trace_tf.model import output_weights

        cfg = load(path, [f"{instead}=5"])
        assert isinstance(cfg, Config)
        i, j = (int(n) for n in at.split("."))
        W = np.stack([cfg.embeddings[t] for t in cfg.vocab]).T
        assert W[i, j] == 5 and output_weights(cfg)[0][i, j] == 5


@pytest.mark.parametrize("at", ["3.0", "1.9", "04.0"])
def test_an_entry_set_past_a_list_s_end_is_named_by_the_error_of_the_list(
    tmp_yaml, at: str
) -> None:  # type: ignore[no-untyped-def]
    """`--set weights.output.W.3.0=5` adds W.0..W.2 empty before it: the error at
    output.W (tied) dropped '(set by --set ...)', as several keys were set below it."""
    with pytest.raises(InputError) as info:
        load(tmp_yaml(TIED), [f"weights.output.W.{at}=5"])
    written = ".".join(str(int(p)) for p in at.split("."))
    assert "output.W is given but model.tie_embeddings is on" in str(info.value)
    assert f"(set by --set weights.output.W.{written})" in str(info.value), str(info.value)
