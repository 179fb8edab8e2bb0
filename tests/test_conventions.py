"""The conventions header says what was computed: for each option that changes a
convention, set with --set, the header row (table and JSON alike) and the step
formulas are pinned to the numbers, recomputed here with numpy from the JSON's own
inputs and from weights drawn by SPEC section 2's recipe (never by trace-tf code)."""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from trace_tf.cli import app

runner = CliRunner()

CONFIG = """\
model: {d_model: 4, n_heads: 2, d_k: 3, d_ff: 5, encoder_layers: 1, decoder_layers: 1}
vocab: [a, b, c, SOS, EOS, PAD]
tokens: {bos: SOS, eos: EOS}
embeddings:
  a: [1, -2, 0.5, 3]
source: [a, b, c]
target: [SOS, a, b]
"""


def drawn(path: str, shape: tuple[int, ...], seed: int = 0, std: float = 1.0) -> np.ndarray:
    """A weight the file does not give, drawn as SPEC section 2 says."""
    rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
    return rng.standard_normal(shape) * std


def traced(tmp_yaml: Any, *args: str, command: str = "decode") -> dict[str, Any]:
    result = runner.invoke(app, [command, tmp_yaml(CONFIG), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def value(data: dict[str, Any], path: str) -> np.ndarray:
    [step] = [s for s in data["steps"] if s["path"] == path]
    return np.array(step["value"], dtype=object).astype(float)  # "-inf" strings too


def formula(data: dict[str, Any], path: str) -> str:
    [step] = [s for s in data["steps"] if s["path"] == path]
    return str(step["formula"])


def table_header(tmp_yaml: Any, *args: str, command: str = "decode") -> str:
    """The header panel as printed, wide enough for every row on one line."""
    result = runner.invoke(
        app, [command, tmp_yaml(CONFIG), *args], env={"COLUMNS": "400"}, terminal_width=400
    )
    assert result.exit_code == 0, result.output
    return result.stdout.split("╰")[0]


def assert_same_header(tmp_yaml: Any, data: dict[str, Any], *args: str) -> None:
    """JSON's conventions are the table header's rows, word for word (SPEC section 5)."""
    head = table_header(tmp_yaml, *args)
    for key, text in data["conventions"].items():
        assert f"│ {key}" in head and text in head, (key, text)


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).sum(axis=1, keepdims=True) / x.shape[1]  # biased: ÷ d
    return (x - mean) / np.sqrt(var + eps)


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + eps)


@pytest.mark.parametrize("position", ["post", "pre"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_the_norm_row_says_where_the_norm_is_and_what_it_computes(
    tmp_yaml: Any, position: str, kind: str
) -> None:
    sets = ["--set", f"model.norm_position={position}", "--set", f"model.norm={kind}"]
    sets += ["--set", "model.norm_eps=0.5"]  # large: ε inside the root shows
    data = traced(tmp_yaml, *sets, command="encode")
    norm = data["conventions"]["norm"]
    assert norm.startswith(f"{position}-norm, ") and "ε = 0.5" in norm
    assert ("biased var" in norm) == (kind == "layer")
    assert ("final norm on" in norm) == (position == "pre")
    assert "ε = 0.5" in formula(data, "encoder.0.self_attn.norm")
    f = layer_norm if kind == "layer" else rms_norm
    # post: norm(x + sublayer(x)); pre: the attention reads norm(x), x the layer's input
    x = value(data, "encoder.0.self_attn.residual" if position == "post" else "encoder.input")
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.norm"), f(x, 0.5), atol=1e-12)
    if position == "pre":
        np.testing.assert_allclose(
            value(data, "encoder.0.self_attn.residual"),
            value(data, "encoder.input") + value(data, "encoder.0.self_attn.wo"),
            atol=1e-12,
        )
        last = f(value(data, "encoder.0.ffn.residual"), 0.5)
        np.testing.assert_allclose(value(data, "encoder.final_norm"), last, atol=1e-12)
        np.testing.assert_allclose(value(data, "encoder.output"), last, atol=1e-12)
    assert_same_header(tmp_yaml, data, *sets, "--format", "table")


@pytest.mark.parametrize("position, on", [("pre", False), ("post", True)])
def test_the_norm_row_says_whether_a_final_norm_runs(
    tmp_yaml: Any, position: str, on: bool
) -> None:
    data = traced(
        tmp_yaml, "--set", f"model.norm_position={position}", "--set", f"model.final_norm={on}"
    )
    assert ("final norm on" in data["conventions"]["norm"]) == on
    paths = {s["path"] for s in data["steps"]}
    assert ("encoder.final_norm" in paths) == on and ("decoder.final_norm" in paths) == on
    if on:
        expected = layer_norm(value(data, "decoder.0.ffn.norm"), 1e-5)
        np.testing.assert_allclose(value(data, "decoder.output"), expected, atol=1e-12)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("on", [False, True])
def test_the_norm_row_says_whether_the_embeddings_are_normalised(
    tmp_yaml: Any, kind: str, on: bool
) -> None:
    sets = ["--set", f"model.embed_norm={on}", "--set", f"model.norm={kind}"]
    sets += ["--set", "model.norm_eps=0.5", "--set", "weights.decoder_embed_norm.beta=[1, 0, 0, 2]"]
    data = traced(tmp_yaml, *(sets if on else sets[:4]))
    assert ("embedding norm on" in data["conventions"]["norm"]) == on
    paths = [s["path"] for s in data["steps"]]
    for stack in ("encoder", "decoder"):
        assert (f"{stack}.embed_norm" in paths) == on
        # layer 0 reads the normalised embeddings: X = E + PE, then Norm(X) (BERT)
        x = value(data, f"{stack}.embed") + value(data, f"{stack}.pe")
        np.testing.assert_allclose(value(data, f"{stack}.input"), x, atol=1e-12)
        assert ("normalised next (embed_norm)" in formula(data, f"{stack}.input")) == on
        if not on:
            continue
        f = layer_norm if kind == "layer" else rms_norm
        beta = np.array([1, 0, 0, 2]) if stack == "decoder" else 0  # gamma ones by default
        expected = f(x, 0.5) + beta
        np.testing.assert_allclose(value(data, f"{stack}.embed_norm"), expected, atol=1e-12)
        assert paths.index(f"{stack}.input") < paths.index(f"{stack}.embed_norm")
        assert paths.index(f"{stack}.embed_norm") < paths.index(f"{stack}.0.self_attn.h0.q")
        assert "what layer 0 reads" in formula(data, f"{stack}.embed_norm")
        assert "ε = 0.5" in formula(data, f"{stack}.embed_norm")
        # the first projection reads it: post-norm's residual is Norm(X) + attention
        np.testing.assert_allclose(
            value(data, f"{stack}.0.self_attn.residual"),
            expected + value(data, f"{stack}.0.self_attn.wo"),
            atol=1e-12,
        )
    assert_same_header(tmp_yaml, data, *(sets if on else sets[:4]), "--format", "table")


def test_sinusoidal_positions_use_the_stated_base(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.pe_base=100")
    assert "base 100" in data["conventions"]["positions"]
    assert "100^(2i/d)" in formula(data, "encoder.pe")
    pos, i = np.arange(3)[:, None], np.arange(2)[None, :]
    angle = pos / 100 ** (2 * i / 4)
    pe = np.stack([np.sin(angle), np.cos(angle)], axis=2).reshape(3, 4)
    np.testing.assert_allclose(value(data, "encoder.pe"), pe, atol=1e-15)
    np.testing.assert_allclose(value(data, "decoder.pe"), pe, atol=1e-15)


def test_learned_positions_are_the_drawn_table_shared_by_both_stacks(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.positional=learned", "--set", "model.max_len=6")
    assert data["conventions"]["positions"] == "learned table weights.positional (6 rows), added"
    table = drawn("positional", (6, 4))
    np.testing.assert_allclose(value(data, "encoder.pe"), table[:3], atol=0)
    np.testing.assert_allclose(value(data, "decoder.pe"), table[:3], atol=0)


def test_rope_turns_each_pair_by_the_stated_angle(tmp_yaml: Any) -> None:
    # d_k 3 (odd, and not d_model 4): the angle's d is d_k, the last column is not turned
    data = traced(tmp_yaml, "--set", "model.positional=rope", "--set", "model.pe_base=50")
    positions = data["conventions"]["positions"]
    assert "base 50" in positions and "pos · 50^(−2i/d_k)" in positions
    assert "pair (2i, 2i+1) turned by" in positions
    assert positions.endswith("; odd d_k: the last column is not turned")
    assert "encoder.pe" not in {s["path"] for s in data["steps"]}
    raw = value(data, "encoder.0.self_attn.h1.k_raw")
    theta = np.arange(3) * 50.0 ** (-0 / 3)  # the one pair (0, 1): i = 0
    turned = raw.copy()
    turned[:, 0] = raw[:, 0] * np.cos(theta) - raw[:, 1] * np.sin(theta)
    turned[:, 1] = raw[:, 0] * np.sin(theta) + raw[:, 1] * np.cos(theta)
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h1.k"), turned, atol=1e-12)
    # self-attention only: cross-attention's keys are the encoder output's, unturned
    assert "decoder.0.cross_attn.h0.k_raw" not in {s["path"] for s in data["steps"]}
    assert formula(data, "encoder.0.self_attn.h1.k") == "K = RoPE(K_raw, pos), pairs (2i, 2i+1)"


def test_rope_halves_turns_column_i_with_column_i_plus_half(tmp_yaml: Any) -> None:
    # d_k 4 (halves: pairs (0, 2) and (1, 3), Hugging Face's rotate_half)
    args = ("--set", "model.positional=rope", "--set", "model.rope_pairs=halves")
    data = traced(tmp_yaml, *args, "--set", "model.d_k=4")
    positions = data["conventions"]["positions"]
    assert "pair (i, i+d_k/2) turned by pos · 10000^(−2i/d_k) radians" in positions
    assert "rotate_half" in positions and "odd" not in positions
    assert "pair (i, i+d_k/2)" in table_header(tmp_yaml, *args, "--set", "model.d_k=4")
    for path in ("decoder.0.self_attn.h0.q", "encoder.0.self_attn.h1.k"):
        of = "Q_raw" if path.endswith("q") else "K_raw"
        assert formula(data, path) == f"{path[-1].upper()} = RoPE({of}, pos), pairs (i, i+d_k/2)"
        raw = value(data, path + "_raw")
        turned = raw.copy()
        for i in range(2):
            theta = np.arange(3) * 10000.0 ** (-2 * i / 4)
            a, b = raw[:, i], raw[:, i + 2]
            turned[:, i] = a * np.cos(theta) - b * np.sin(theta)
            turned[:, i + 2] = b * np.cos(theta) + a * np.sin(theta)
        np.testing.assert_allclose(value(data, path), turned, atol=1e-12)
    # odd d_k 3: pair (0, 1) turned, the last column left, as with adjacent pairs
    odd = traced(tmp_yaml, *args)
    assert odd["conventions"]["positions"].endswith("; odd d_k: the last column is not turned")
    raw = value(odd, "encoder.0.self_attn.h1.k_raw")
    k = value(odd, "encoder.0.self_attn.h1.k")
    np.testing.assert_array_equal(k[:, 2], raw[:, 2])
    theta = np.arange(3) * 1.0
    np.testing.assert_allclose(k[:, 0], raw[:, 0] * np.cos(theta) - raw[:, 1] * np.sin(theta))


def test_rope_pairs_without_rope_is_accepted_and_changes_nothing(tmp_yaml: Any) -> None:
    # as pe_base without its positional, or d_a without the additive score: read, unused
    plain = traced(tmp_yaml)
    halves = traced(tmp_yaml, "--set", "model.rope_pairs=halves")
    assert halves["conventions"].pop("overrides") == "keys set: model.rope_pairs"
    assert halves["conventions"] == plain["conventions"]
    assert [s["value"] for s in halves["steps"]] == [s["value"] for s in plain["steps"]]


def test_rope_angle_denominator_is_d_k_not_d_model(tmp_yaml: Any) -> None:
    data = traced(
        tmp_yaml,
        "--set", "model.positional=rope",
        "--set", "model.d_k=2",
        "--set", "model.pe_base=4",
        "--set", "model.d_model=4",
    )  # fmt: skip
    raw, q = value(data, "encoder.0.self_attn.h0.q_raw"), value(data, "encoder.0.self_attn.h0.q")
    theta = np.arange(3) * 4.0 ** (-0 / 2)
    np.testing.assert_allclose(q[:, 0], raw[:, 0] * np.cos(theta) - raw[:, 1] * np.sin(theta))


def test_no_positions_leave_the_embeddings_as_the_input(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.positional=none")
    assert data["conventions"]["positions"] == "none"
    np.testing.assert_array_equal(value(data, "encoder.input"), value(data, "encoder.embed"))


@pytest.mark.parametrize("raw, scale, text", [("2.5", 2.5, "2.5"), ("sqrt_d_model", 2.0, "2")])
def test_the_embedding_scale_is_the_stated_one(
    tmp_yaml: Any, raw: str, scale: float, text: str
) -> None:
    data = traced(tmp_yaml, "--set", f"model.embed_scale={raw}")
    assert data["conventions"]["embeddings"].startswith("scaled by ")
    assert data["conventions"]["embeddings"].endswith(text)
    expected = value(data, "encoder.embed") * scale + value(data, "encoder.pe")
    np.testing.assert_allclose(value(data, "encoder.input"), expected, atol=1e-15)
    # the lookup is the unscaled table row (embeddings.a as given)
    np.testing.assert_array_equal(value(data, "encoder.embed")[0], [1, -2, 0.5, 3])


@pytest.mark.parametrize(
    "sets, divisor, text",
    [
        # a rounded root is said to be one (≈), a whole one is exact (=)
        ((), math.sqrt(3), "scores / sqrt(d_k),  sqrt(d_k) ≈ 1.73205"),
        (("--set", "model.d_k=2"), math.sqrt(2), "scores / sqrt(d_k),  sqrt(d_k) ≈ 1.41421"),
        (("--set", "model.d_k=4"), 2.0, "scores / sqrt(d_k),  sqrt(d_k) = 2;"),
        (("--set", "model.scale=30"), 30.0, "scores / 30;"),
        (("--set", "model.score=dot"), 1.0, "scores / 1 (not scaled)"),
    ],
)
def test_the_scores_are_divided_by_the_stated_scale(
    tmp_yaml: Any, sets: tuple[str, ...], divisor: float, text: str
) -> None:
    data = traced(tmp_yaml, *sets)
    assert text in data["conventions"]["attention"]
    for block in ("encoder.0.self_attn", "decoder.0.cross_attn"):
        q, k = value(data, f"{block}.h1.q"), value(data, f"{block}.h1.k")
        np.testing.assert_allclose(value(data, f"{block}.h1.scores"), q @ k.T, atol=1e-12)
        scaled = value(data, f"{block}.h1.scaled")
        np.testing.assert_allclose(scaled, q @ k.T / divisor, atol=1e-12)


def test_each_score_function_computes_its_stated_formula(tmp_yaml: Any) -> None:
    head = "encoder.0.self_attn.heads.0."
    data = traced(tmp_yaml, "--set", "model.score=bilinear")
    assert "S = Q W_b Kᵀ (bilinear)" in data["conventions"]["attention"]
    q, k = value(data, "encoder.0.self_attn.h0.q"), value(data, "encoder.0.self_attn.h0.k")
    expected = q @ drawn(head + "W_b", (3, 3)) @ k.T
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.scores"), expected, atol=1e-12)

    data = traced(tmp_yaml, "--set", "model.score=additive", "--set", "model.d_a=2")
    assert "v_aᵀ tanh(q_i W_a_q + k_j W_a_k) (additive, d_a 2)" in data["conventions"]["attention"]
    q, k = value(data, "encoder.0.self_attn.h0.q"), value(data, "encoder.0.self_attn.h0.k")
    qa, ka = q @ drawn(head + "W_a_q", (3, 2)), k @ drawn(head + "W_a_k", (3, 2))
    expected = np.tanh(qa[:, None, :] + ka[None, :, :]) @ drawn(head + "v_a", (2,))
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.scores"), expected, atol=1e-12)

    data = traced(tmp_yaml, "--set", "model.score=gaussian")
    assert "−½ Σ_f ((q_if − k_jf) w_f)²" in data["conventions"]["attention"]
    q, k = value(data, "encoder.0.self_attn.h0.q"), value(data, "encoder.0.self_attn.h0.k")
    w = drawn(head + "w", ())  # one width for every feature (README)
    expected = -0.5 * (((q[:, None, :] - k[None, :, :]) * w) ** 2).sum(axis=2)
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.scores"), expected, atol=1e-12)


def test_the_temperature_divides_inside_the_softmax_only(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.temperature=0.25")
    assert "softmax temperature 0.25" in data["conventions"]["attention"]
    assert "T = 0.25" in formula(data, "encoder.0.self_attn.h0.softmax")
    scaled = value(data, "encoder.0.self_attn.h0.scaled")
    q, k = value(data, "encoder.0.self_attn.h0.q"), value(data, "encoder.0.self_attn.h0.k")
    np.testing.assert_allclose(scaled, q @ k.T / math.sqrt(3), atol=1e-12)  # not / T
    e = np.exp(scaled / 0.25 - (scaled / 0.25).max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.softmax"), expected, atol=1e-12)


def _gelu(x: float) -> float:
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(
    "name, row, f",
    [
        ("relu", "ReLU", lambda x: max(x, 0.0)),
        ("gelu", "GELU (exact, erf)", _gelu),
        ("gelu_tanh", "GELU (tanh approximation)", _gelu_tanh),
    ],
)
def test_the_activation_is_the_stated_one(tmp_yaml: Any, name: str, row: str, f: Any) -> None:
    data = traced(tmp_yaml, "--set", f"model.activation={name}")
    assert data["conventions"]["activation"] == row
    hidden = value(data, "encoder.0.ffn.hidden")
    expected = np.vectorize(f)(hidden)
    np.testing.assert_allclose(value(data, "encoder.0.ffn.act"), expected, atol=1e-15)


def test_the_model_row_states_the_sizes_used(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.d_k=2", "--set", "model.d_v=5", "--set", "model.d_ff=3")
    assert data["conventions"]["model"].startswith("d_model 4, 2 head(s) of d_k 2 / d_v 5, d_ff 3")
    shapes = {s["path"]: s["shape"] for s in data["steps"]}
    assert shapes["encoder.0.self_attn.h1.q"] == [3, 2]
    assert shapes["encoder.0.self_attn.h1.v"] == [3, 5]
    assert shapes["encoder.0.self_attn.concat"] == [3, 10]
    assert shapes["decoder.0.ffn.hidden"] == [3, 3]


def test_tied_output_weights_are_the_unscaled_embedding_table(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.tie_embeddings=true", "--set", "model.embed_scale=3")
    embeddings = data["conventions"]["embeddings"]
    assert embeddings == "scaled by 3; output tied to the embeddings (unscaled)"
    vocab = ["a", "b", "c", "SOS", "EOS", "PAD"]
    table = np.stack(
        [np.array([1, -2, 0.5, 3.0])] + [drawn(f"embeddings.{t}", (4,)) for t in vocab[1:]]
    )
    expected = value(data, "decoder.output") @ table.T
    np.testing.assert_allclose(value(data, "logits"), expected, atol=1e-12)


def test_the_masks_row_names_each_mask_its_values_and_where_it_applies(tmp_yaml: Any) -> None:
    sets = ["--set", "tokens.pad=PAD", "--set", "source=[a, PAD, b]"]
    sets += ["--set", "target=[SOS, PAD, a]"]
    data = traced(tmp_yaml, *sets)
    masks = data["conventions"]["masks"]
    assert masks.startswith("additive, 0 where attention may look, −inf where it may not:")
    assert "decoder self-attention causal" in masks
    assert "pad token 'PAD' masked as a key" in masks
    inf = -np.inf
    np.testing.assert_array_equal(value(data, "encoder.mask"), [[0, inf, 0]] * 3)
    np.testing.assert_array_equal(value(data, "decoder.cross_mask"), [[0, inf, 0]] * 3)
    causal_and_pad = [[0, inf, inf], [0, inf, inf], [0, inf, 0]]
    np.testing.assert_array_equal(value(data, "decoder.mask"), causal_and_pad)
    for block, mask in [
        ("encoder.0.self_attn", "encoder.mask"),
        ("decoder.0.self_attn", "decoder.mask"),
        ("decoder.0.cross_attn", "decoder.cross_mask"),
    ]:
        scaled, masked = value(data, f"{block}.h0.scaled"), value(data, f"{block}.h0.masked")
        np.testing.assert_array_equal(masked, scaled + value(data, mask))  # additive
        soft = value(data, f"{block}.h0.softmax")
        assert (soft[np.isneginf(masked)] == 0).all()
    assert_same_header(tmp_yaml, data, *sets, "--format", "table")


def test_an_encoder_only_masks_row_states_the_mask_values_too(tmp_yaml: Any) -> None:
    sets = ["--set", "model.decoder_layers=0", "--set", "target=null", "--set", "tokens.pad=b"]
    data = traced(tmp_yaml, *sets, command="encode")
    masks = data["conventions"]["masks"]
    assert masks == (
        "additive, 0 where attention may look, −inf where it may not: pad token 'b' masked as a key"
    )


def test_drawn_weights_come_from_the_stated_seed_and_distribution(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.seed=7", "--set", "model.init_std=0.02")
    assert data["conventions"]["weights"].startswith("drawn with seed 7, N(0, 0.02²): ")
    np.testing.assert_array_equal(
        value(data, "encoder.embed")[1], drawn("embeddings.b", (4,), 7, 0.02)
    )
    w_q = drawn("encoder.0.self_attn.heads.1.W_q", (4, 3), 7, 0.02)
    expected = value(data, "encoder.input") @ w_q
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h1.q"), expected, atol=1e-15)
    # what the file does not give and is not drawn: biases 0, γ 1, β 0
    assert "biases 0, γ 1, β 0 where not given" in data["conventions"]["weights"]
    b_1 = value(data, "encoder.0.ffn.hidden") - value(data, "encoder.0.self_attn.norm") @ drawn(
        "encoder.0.ffn.W_1", (4, 5), 7, 0.02
    )
    np.testing.assert_allclose(b_1, 0, atol=1e-15)


def test_float32_is_what_the_numbers_row_says(tmp_yaml: Any) -> None:
    data = traced(tmp_yaml, "--set", "model.dtype=float32")
    assert data["conventions"]["numbers"].startswith("float32")
    for step in data["steps"]:
        v = np.array(step["value"], dtype=object).astype(float)
        finite = v[np.isfinite(v)]
        np.testing.assert_array_equal(finite.astype(np.float32).astype(float), finite)


def _generated(tmp_yaml: Any, *args: str) -> dict[str, Any]:
    return traced(tmp_yaml, *args, "--max-tokens", "4", command="generate")


def test_a_decoder_only_generation_header_has_no_encoder_run(tmp_yaml: Any) -> None:
    # It said "encoder: run once; cross-attention reads its output at every iteration"
    # for a model with neither.
    sets = ["--set", "model.encoder_layers=0", "--set", "source=null", "--greedy"]
    data = _generated(tmp_yaml, *sets)
    assert (
        data["conventions"]["encoder"]
        == "none (decoder-only): each iteration reads only the prefix"
    )
    assert_same_header_of_generate(tmp_yaml, data, *sets)
    with_encoder = _generated(tmp_yaml, "--greedy")["conventions"]["encoder"]
    assert with_encoder == "run once; cross-attention reads its output at every iteration"


def assert_same_header_of_generate(tmp_yaml: Any, data: dict[str, Any], *args: str) -> None:
    head = table_header(tmp_yaml, *args, "--max-tokens", "4", command="generate")
    for key, text in data["conventions"].items():
        assert f"│ {key}" in head and text in head, (key, text)


def test_sampling_draws_as_the_decoding_row_says(tmp_yaml: Any) -> None:
    args = ("--sample", "--temperature", "0.5", "--top-k", "4", "--seed", "11")
    data = _generated(tmp_yaml, *args)
    rule = data["conventions"]["decoding"]
    assert rule.startswith("sample from softmax(logits / 0.5), then top-k 4, renormalised; ")
    assert "numpy.random.default_rng(11), u = rng.random() per iteration" in rule
    vocab = ["a", "b", "c", "SOS", "EOS", "PAD"]
    rng = np.random.default_rng(11)
    for it in data["iterations"]:
        p = np.array([it["probs"][t] for t in vocab])
        assert (p > 0).sum() <= 4 and math.isclose(p.sum(), 1.0, rel_tol=1e-12)
        chosen = int(
            np.argmax(np.cumsum(p) > rng.random())
        )  # the first whose cumulative p exceeds u
        assert it["next"] == vocab[chosen]
    assert_same_header_of_generate(tmp_yaml, data, *args)


def test_greedy_takes_the_most_probable_token_as_the_decoding_row_says(tmp_yaml: Any) -> None:
    data = _generated(tmp_yaml, "--greedy")
    assert data["conventions"]["decoding"].startswith("greedy: the most probable token")
    assert "after 4 produced token(s)" in data["conventions"]["stop"]
    for it in data["iterations"]:
        assert it["next"] == max(it["probs"], key=lambda t: it["probs"][t])


BIASED = """\
model: {d_model: 2, n_heads: 1, d_ff: 2, encoder_layers: 1, decoder_layers: 1}
vocab: [a, b, SOS]
tokens: {bos: SOS}
source: [a, b]
target: [SOS]
weights:
  encoder:
    - self_attn: {b_q: [1, 2], b_k: [0, 1], b_v: [1, -1], b_o: [3, 3]}
      ffn: {b_1: [1, 1], b_2: [2, -2]}
  output: {b: [1, 2, 3]}
"""


def test_a_step_adding_a_bias_names_the_bias_among_its_inputs(tmp_yaml: Any) -> None:
    # "Q = X W_q + b_q" named only X and W_q as its inputs (so `step` showed no b_q).
    result = runner.invoke(app, ["decode", tmp_yaml(BIASED), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    steps = {s["path"]: s for s in data["steps"]}
    biased = {p: s for p, s in steps.items() if " + b" in s["formula"]}
    assert len(biased) == 7
    for path, step in biased.items():
        bias = step["formula"].rsplit(" + ", 1)[1]
        assert step["inputs"][-1].endswith(f".{bias}"), (path, step["inputs"])
    W_q = drawn("encoder.0.self_attn.heads.0.W_q", (2, 2))
    expected = value(data, "encoder.input") @ W_q + [1, 2]
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.q"), expected, atol=1e-12)
    expected = value(data, "decoder.output") @ drawn("output.W", (2, 3)) + [1, 2, 3]
    np.testing.assert_allclose(value(data, "logits"), expected, atol=1e-12)
    # the cost ledger reads the same inputs: a bias is no multiply-add
    costs = []
    for config in (BIASED, BIASED.split("weights:")[0]):
        result = runner.invoke(app, ["cost", tmp_yaml(config), "--format", "json"])
        assert result.exit_code == 0, result.output
        costs.append({r["path"]: r["macs"] for r in json.loads(result.stdout)["ledger"]})
    assert costs[0] == costs[1] and costs[0]["encoder.0.self_attn.h0.q"] == 2 * 2 * 2


@pytest.mark.parametrize("mask", [None, "0 -inf 1.5"])
def test_attend_states_its_mask_and_adds_it(mask: str | None) -> None:
    # The header's operation read softmax((S / scale + M) / T) V with no mask given,
    # and nothing said what M was when one was.
    args = ["attend", "--q", "1 0", "--k", "1 2; 0 1; 3 -1", "--v", "1; 2; 4", "--format", "json"]
    result = runner.invoke(app, args + (["--mask", mask] if mask else []))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    head = data["conventions"]
    scaled = np.array([[1.0, 0.0, 3.0]]) / math.sqrt(2)
    np.testing.assert_allclose(value(data, "attn.scaled"), scaled, atol=1e-15)
    if mask is None:
        assert head["mask"] == "none" and "+ M" not in head["operation"]
        assert "attn.masked" not in {s["path"] for s in data["steps"]}
    else:
        assert "softmax((S / scale + M) / T)" in head["operation"]
        assert head["mask"].startswith("M (attention.mask), added to the scaled scores")
        scaled = scaled + np.array([[0, -np.inf, 1.5]])
        np.testing.assert_array_equal(value(data, "attn.masked"), scaled)
    e = np.exp(scaled - scaled.max())
    np.testing.assert_allclose(value(data, "attn.softmax"), e / e.sum(), atol=1e-15)


def test_the_rms_norm_calculator_claims_no_variance() -> None:
    args = ["norm", "--x", "1 2 4; 0 0 3", "--kind", "rms", "--eps", "0.5", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["conventions"]["eps"] == "0.5, inside the square root"
    x = np.array([[1.0, 2, 4], [0, 0, 3]])
    np.testing.assert_allclose(value(data, "norm.out"), rms_norm(x, 0.5), atol=1e-15)
    result = runner.invoke(app, [*args[:4], "layer", "--eps", "0.5", "--format", "json"])
    data = json.loads(result.stdout)
    assert data["conventions"]["eps"] == "0.5, inside the square root; biased variance"
    np.testing.assert_allclose(value(data, "norm.out"), layer_norm(x, 0.5), atol=1e-15)


def test_the_overrides_row_names_each_key_set_once_and_no_entry_only_padded() -> None:
    # `W_2.2.1=5` over hello's drawn W_2 listed W_2.0 and W_2.1 as keys set (the empty
    # rows the override added before its own, which keep the draw), and a key set
    # twice was listed twice.
    w = "weights.encoder.0.ffn.W_2"
    args = ["encode", "--set", f"{w}.2.1=5", "--set", "model.seed=1", "--set", "model.seed=2"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    head = json.loads(result.stdout)["conventions"]
    assert head["overrides"] == f"keys set: {w}.2.1, model.seed"


def test_the_overrides_row_names_the_variant_and_the_header_follows_it() -> None:
    # It listed the keys a variant set but not the variant: two variants setting the
    # same keys (hello's document and document_scale30 both set source) read alike.
    args = ["encode", "--variant", "document_scale30", "--set", "model.embed_scale=2"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    head = data["conventions"]
    assert head["overrides"] == (
        "variant 'document_scale30'; keys set: source, model.positional, model.scale, "
        "model.embed_scale"
    )
    assert head["positions"] == "none" and head["embeddings"] == "scaled by 2"
    assert "scores / 30;" in head["attention"]
    source = np.array([[1, 3, 3, 5], [2.84, 3.99, 4, 6]])  # the variant's, in hello.yaml
    np.testing.assert_allclose(value(data, "encoder.input"), source * 2, atol=0)
    scores = value(data, "encoder.0.self_attn.h0.scores")
    np.testing.assert_allclose(value(data, "encoder.0.self_attn.h0.scaled"), scores / 30)
