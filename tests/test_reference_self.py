"""Checks of the torch reference (tests/reference_torch.py) itself, against numbers
that do not come from it: the worked example printed in seeds/001 section 4, the
mask printed in seeds/004, positional-encoding and norm values written out by
hand, and numpy re-derivations of each wiring rule of SPEC sections 1-3."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from random_configs import random_config, to_per_head
from reference_torch import check_against_sdpa, hyper, normalise, reference_forward

INF = math.inf

# ---------------------------------------------------------------- seeds/001, section 4

# "Hello World" embeddings plus positions as printed in 2./3. (the document's own,
# non-standard PE row), used as a numeric source with positional: none.
E = [[1.0, 3.0, 3.0, 5.0], [2.84, 3.99, 4.0, 6.0]]
HEADS_001 = [
    {  # WQ1, WK1, WV1
        "W_q": [[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]],
        "W_k": [[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]],
        "W_v": [[0, 1, 1], [1, 0, 0], [1, 0, 1], [0, 1, 0]],
    },
    {  # WQ2, WK2, WV2
        "W_q": [[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 1, 1]],
        "W_k": [[0, 1, 1], [1, 0, 1], [1, 1, 0], [0, 1, 0]],
        "W_v": [[1, 0, 0], [0, 1, 1], [0, 0, 1], [1, 0, 0]],
    },
]
W_O_001 = [  # section 4.3.5, "Just some random values"
    [0.79445237, 0.1081456, 0.27411536, 0.78394531],
    [0.29081936, -0.36187258, -0.32312791, -0.48530339],
    [-0.36702934, -0.76471963, -0.88058366, -1.73713022],
    [-0.02305587, -0.64315981, -0.68306653, -1.25393866],
    [0.29077448, -0.04121674, 0.01509932, 0.13149906],
    [0.57451867, -0.08895355, 0.02190485, 0.24535932],
]


def config_001(scale: float | None = None) -> dict[str, Any]:
    """One post-norm encoder layer with the document's weights (gamma 1, beta 0 by default).
    The FFN is not printed with fixed numbers in section 4, so any explicit one will do."""
    model: dict[str, Any] = {"d_model": 4, "n_heads": 2, "d_k": 3, "d_ff": 8, "positional": "none"}
    if scale is not None:
        model["scale"] = scale
    ffn_rng = np.random.default_rng(1)
    ffn = {
        "W_1": ffn_rng.standard_normal((4, 8)).tolist(),
        "W_2": ffn_rng.standard_normal((8, 4)).tolist(),
    }
    layer = {"self_attn": {"heads": HEADS_001, "W_o": W_O_001}, "ffn": ffn}
    return {"model": model, "source": E, "weights": {"encoder": [layer]}}


def test_001_inputs_and_projections() -> None:
    out = reference_forward(config_001())
    np.testing.assert_allclose(out["encoder.embed"], E, atol=0)
    np.testing.assert_allclose(out["encoder.input"], E, atol=0)
    assert "encoder.pe" not in out and "encoder.mask" not in out
    # 4.2: K1, V1, Q1
    np.testing.assert_allclose(
        out["encoder.0.self_attn.h0.k"], [[4.0, 8.0, 4.0], [6.84, 9.99, 6.84]], atol=1e-12
    )
    np.testing.assert_allclose(
        out["encoder.0.self_attn.h0.v"], [[6.0, 6.0, 4.0], [7.99, 8.84, 6.84]], atol=1e-12
    )
    np.testing.assert_allclose(
        out["encoder.0.self_attn.h0.q"], [[8.0, 3.0, 3.0], [9.99, 3.99, 4.0]], atol=1e-12
    )


def test_001_attention_scaled_by_sqrt3() -> None:
    out = reference_forward(config_001())  # default scale: sqrt(d_k) = sqrt(3)
    h0, h1 = "encoder.0.self_attn.h0", "encoder.0.self_attn.h1"
    scores = [[68.0, 105.21], [87.88, 135.5517]]  # 4.3.1
    np.testing.assert_allclose(out[f"{h0}.scores"], scores, atol=1e-10)
    np.testing.assert_allclose(  # 4.3.2
        out[f"{h0}.scaled"], [[39.2598183, 60.74302182], [50.73754166, 78.26081048]], atol=1e-7
    )
    # 4.3.3: tiny weights, so compare relatively (9 significant digits printed)
    np.testing.assert_allclose(
        out[f"{h0}.softmax"], [[4.67695573e-10, 1.0], [1.11377182e-12, 1.0]], rtol=1e-8
    )
    np.testing.assert_allclose(
        out[f"{h1}.softmax"], [[1.10613872e-14, 1.0], [4.95934510e-20, 1.0]], rtol=1e-8
    )
    # 4.3.4: attention1 and attention2 (all weight on "World")
    np.testing.assert_allclose(out[f"{h0}.context"], [[7.99, 8.84, 6.84]] * 2, atol=1e-8)
    np.testing.assert_allclose(out[f"{h1}.context"], [[8.84, 3.99, 7.99]] * 2, atol=1e-8)


# 4.3.4-4.3.5 with the blog's "/ 30" in place of sqrt(3)
ATTENTION1_30 = [[7.54348784, 8.20276657, 6.20276657], [7.65266185, 8.35857269, 6.35857269]]
ATTENTION2_30 = [[8.45589591, 3.85610456, 7.72085664], [8.63740591, 3.91937741, 7.84804146]]
Z_30 = [
    [11.46394285, -13.18016471, -11.59340253, -17.04387829],
    [11.62608573, -13.47454936, -11.87126395, -17.4926367],
]


def test_001_heads_concat_and_w_o_with_scale_30() -> None:
    out = reference_forward(config_001(scale=30))
    block = "encoder.0.self_attn"
    np.testing.assert_allclose(out[f"{block}.h0.context"], ATTENTION1_30, atol=1e-8)
    np.testing.assert_allclose(out[f"{block}.h1.context"], ATTENTION2_30, atol=1e-8)
    np.testing.assert_allclose(
        out[f"{block}.concat"], np.hstack([ATTENTION1_30, ATTENTION2_30]), atol=1e-8
    )
    np.testing.assert_allclose(out[f"{block}.wo"], Z_30, atol=1e-7)  # Z = attentions @ W


def test_001_layer_norm_of_z_plus_e() -> None:
    """5.3: layer_norm(Z + embedding), gamma 1, beta 0.

    The document computes (x - mean) / (std + 1e-6), whereas SPEC (and torch)
    use (x - mean) / sqrt(var + 1e-5). With std ~ 10 the denominators differ by
    about 1e-6 - 1e-5/(2*std) ~ 5e-7, i.e. ~5e-8 relative, so the two agree to
    ~1e-7 on values of order 1: atol 1e-6 accepts exactly that difference and
    nothing bigger. The reference's own formula is checked tightly below.
    """
    out = reference_forward(config_001(scale=30))
    residual = out["encoder.0.self_attn.residual"]
    np.testing.assert_allclose(residual, np.add(Z_30, E), atol=1e-7)
    # 5.3.1: mean and (biased) standard deviation of each row
    np.testing.assert_allclose(residual.mean(axis=-1), [-4.58837567, -3.59559107], atol=1e-7)
    np.testing.assert_allclose(residual.std(axis=-1), [9.92061529, 10.50653019], atol=1e-7)
    printed = [
        [1.71887693, -0.56365339, -0.40370747, -0.75151608],
        [1.71909039, -0.56050453, -0.40695381, -0.75163205],
    ]
    norm = out["encoder.0.self_attn.norm"]
    np.testing.assert_allclose(norm, printed, atol=1e-6)
    mean, var = residual.mean(axis=-1, keepdims=True), residual.var(axis=-1, keepdims=True)
    np.testing.assert_allclose(norm, (residual - mean) / np.sqrt(var + 1e-5), atol=1e-13)


# ---------------------------------------------------------------- positional encoding


def test_sinusoidal_pe_by_hand() -> None:
    """SPEC 1: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)."""
    rng = np.random.default_rng(0)
    pe = reference_forward(random_config(rng, d_model=4, n_heads=2, src_len=3))["encoder.pe"]
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1], atol=0)  # 001 prints this row for "Hello"
    # pos 1, d 4: sin(1), cos(1), sin(1/100), cos(1/100)
    row1 = [0.8414709848078965, 0.5403023058681398, 0.009999833334166664, 0.9999500004166653]
    np.testing.assert_allclose(pe[1], row1, atol=1e-15)
    # 001 prints [0.84, 0.99, 0, 1] for "World": its column 1 uses cos(1/100) (see seeds/README.md)
    assert abs(pe[1, 1] - 0.99) > 0.4
    # odd d = 5, pos 2: the last column (index 4, i = 2) is a sine
    pe5 = reference_forward(random_config(rng, d_model=5, n_heads=1, src_len=3))["encoder.pe"]
    row2 = [
        math.sin(2 / 10000 ** (0 / 5)),
        math.cos(2 / 10000 ** (0 / 5)),
        math.sin(2 / 10000 ** (2 / 5)),
        math.cos(2 / 10000 ** (2 / 5)),
        math.sin(2 / 10000 ** (4 / 5)),
    ]
    np.testing.assert_allclose(pe5[2], row2, atol=1e-15)


def test_pe_base_and_learned_positions() -> None:
    rng = np.random.default_rng(1)
    cfg = random_config(rng, d_model=4, n_heads=1, src_len=2)
    cfg["model"]["pe_base"] = 100
    pe = reference_forward(cfg)["encoder.pe"]
    np.testing.assert_allclose(
        pe[1], [math.sin(1), math.cos(1), math.sin(0.1), math.cos(0.1)], atol=1e-15
    )
    cfg = random_config(rng, d_model=4, n_heads=1, src_len=3, positional="learned")
    out = reference_forward(cfg)
    np.testing.assert_array_equal(out["encoder.pe"], np.array(cfg["weights"]["positional"])[:3])
    np.testing.assert_allclose(
        out["encoder.input"], out["encoder.embed"] + out["encoder.pe"], atol=0
    )


def test_embed_scale() -> None:
    cfg = random_config(np.random.default_rng(2), d_model=9, n_heads=3, embed_scale="sqrt_d_model")
    out = reference_forward(cfg)
    np.testing.assert_allclose(
        out["encoder.embed"], [cfg["embeddings"][t] for t in cfg["source"]], atol=0
    )
    np.testing.assert_allclose(
        out["encoder.input"], out["encoder.embed"] * 3 + out["encoder.pe"], atol=1e-15
    )


# ---------------------------------------------------------------- masks


def test_causal_mask_by_hand() -> None:
    cfg = random_config(
        np.random.default_rng(3), d_model=4, n_heads=2, encoder_layers=0, decoder_layers=1
    )
    cfg["target"] = ["t0", "t2", "t3"]
    out = reference_forward(cfg)
    np.testing.assert_array_equal(
        out["decoder.mask"], [[0.0, -INF, -INF], [0.0, 0.0, -INF], [0.0, 0.0, 0.0]]
    )
    head = "decoder.0.self_attn.h1"
    np.testing.assert_array_equal(
        out[f"{head}.masked"], out[f"{head}.scaled"] + out["decoder.mask"]
    )
    softmax = out[f"{head}.softmax"]
    assert softmax[0, 0] == 1 and np.all(np.triu(softmax, 1) == 0)
    np.testing.assert_allclose(softmax.sum(axis=-1), 1, atol=1e-15)
    # the causal mask applies to one token too (SPEC 1)
    cfg["target"] = ["t0"]
    np.testing.assert_array_equal(reference_forward(cfg)["decoder.mask"], [[0]])


def test_causal_and_padding_mask_of_004() -> None:
    """seeds/004 prints the mask of a 3-token target padded to 5 (1 = may attend)."""
    cfg = random_config(
        np.random.default_rng(4), d_model=4, n_heads=2, encoder_layers=0, decoder_layers=1, pad=True
    )
    cfg["target"] = ["t0", "t2", "t3", "PAD", "PAD"]
    printed = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    )
    out = reference_forward(cfg)
    np.testing.assert_array_equal(out["decoder.mask"], np.where(printed == 1, 0.0, -INF))
    np.testing.assert_array_equal(out["decoder.0.self_attn.h0.softmax"] == 0, printed == 0)


def test_source_pads_mask_encoder_and_cross_attention() -> None:
    cfg = random_config(
        np.random.default_rng(5), d_model=4, n_heads=2, decoder_layers=1, src_len=3, pad=True
    )
    cfg["source"], cfg["target"] = ["t3", "t4", "PAD"], ["t0", "t5"]
    out = reference_forward(cfg)
    # pad columns masked; query rows never masked
    np.testing.assert_array_equal(out["encoder.mask"], [[0.0, 0.0, -INF]] * 3)
    np.testing.assert_array_equal(out["decoder.cross_mask"], [[0.0, 0.0, -INF]] * 2)
    # no target pads: causal only
    np.testing.assert_array_equal(out["decoder.mask"], [[0.0, -INF], [0.0, 0.0]])
    assert np.all(out["decoder.0.cross_attn.h1.softmax"][:, 2] == 0)
    # without pads there is no encoder mask, no cross mask and no `masked` step
    cfg["source"] = ["t3", "t4", "t2"]
    out = reference_forward(cfg)
    assert not {"encoder.mask", "decoder.cross_mask", "encoder.0.self_attn.h0.masked"} & out.keys()
    assert "decoder.0.cross_attn.h0.masked" not in out and "decoder.0.self_attn.h0.masked" in out


def test_fully_masked_row_is_nan_not_an_error() -> None:
    """SPEC 1: a row with no visible key comes out as NaN (the SDPA cross-check skips it)."""
    cfg = random_config(np.random.default_rng(6), d_model=4, n_heads=1, src_len=2, pad=True)
    cfg["source"] = ["PAD", "PAD"]
    out = reference_forward(cfg)
    assert np.all(np.isnan(out["encoder.0.self_attn.h0.softmax"]))


# ---------------------------------------------------------------- norms and activations


def test_rms_norm_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    plain = normalise(x, {}, hyper({"d_model": 4, "norm": "rms", "norm_eps": 0}))
    # mean(x^2) = 30/4 = 7.5, 1/sqrt(7.5) = 0.36514837167011072
    np.testing.assert_allclose(
        plain.numpy(),
        [[0.3651483716701107, 0.7302967433402214, 1.0954451150103321, 1.4605934866804429]],
        atol=1e-15,
    )
    affine = normalise(
        x, {"gamma": [1, 2, 3, 4], "beta": [0.5, 0, 0, -1]}, hyper({"d_model": 4, "norm": "rms"})
    )
    scale = 1 / math.sqrt(7.5 + 1e-5)
    np.testing.assert_allclose(
        affine.numpy(), [[scale + 0.5, 4 * scale, 9 * scale, 16 * scale - 1]], atol=1e-15
    )
    # inside the model: norm = residual / sqrt(mean(residual^2) + eps) * gamma + beta
    cfg = random_config(np.random.default_rng(7), d_model=6, n_heads=2, norm="rms")
    out = reference_forward(cfg)
    r = out["encoder.0.ffn.residual"]
    p = cfg["weights"]["encoder"][0]["ffn"]["norm"]
    expected = r / np.sqrt((r**2).mean(axis=-1, keepdims=True) + 1e-5) * p["gamma"] + p["beta"]
    np.testing.assert_allclose(out["encoder.0.ffn.norm"], expected, atol=1e-13)


def test_layer_norm_as_seeds_004_computes_it() -> None:
    """seeds/004's hand loop: E = sum/len, Var = sum((x - E)^2)/len, (x - E)/sqrt(Var + 1e-5)."""
    matrix = [[3.2897, 0.7432, -1.1652], [0.7432, 1.3647, -1.1707], [-1.1652, -1.1707, 5.6380]]
    ours = []
    for row in matrix:
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 / len(row) for v in row)
        ours.append([(v - mean) / math.sqrt(var + 1e-5) for v in row])
    got = normalise(torch.tensor(matrix, dtype=torch.float64), {}, hyper({"d_model": 3}))
    np.testing.assert_allclose(got.numpy(), ours, atol=1e-14)


@pytest.mark.parametrize("kind", ["relu", "gelu", "gelu_tanh"])
def test_ffn_activation_by_formula(kind: str) -> None:
    cfg = random_config(np.random.default_rng(8), d_model=4, n_heads=1, activation=kind)
    out = reference_forward(cfg)
    ffn = cfg["weights"]["encoder"][0]["ffn"]
    x = out["encoder.0.self_attn.norm"]
    hidden = x @ np.array(ffn["W_1"]) + ffn["b_1"]
    np.testing.assert_allclose(out["encoder.0.ffn.hidden"], hidden, atol=1e-13)
    formulas = {
        "relu": lambda h: max(h, 0.0),
        "gelu": lambda h: 0.5 * h * (1 + math.erf(h / math.sqrt(2))),
        "gelu_tanh": lambda h: (
            0.5 * h * (1 + math.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        ),
    }
    act = np.vectorize(formulas[kind])(hidden)
    np.testing.assert_allclose(out["encoder.0.ffn.act"], act, atol=1e-13)
    np.testing.assert_allclose(
        out["encoder.0.ffn.out"], act @ np.array(ffn["W_2"]) + ffn["b_2"], atol=1e-13
    )


# ---------------------------------------------------------------- wiring


def layer_norm(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """SPEC 1 LayerNorm in numpy, eps 1e-5, biased variance."""
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    normed: np.ndarray = (x - mean) / np.sqrt(var + 1e-5) * np.asarray(p["gamma"]) + np.asarray(
        p["beta"]
    )
    return normed


def test_post_norm_wiring() -> None:
    cfg = random_config(np.random.default_rng(9), d_model=4, n_heads=2, encoder_layers=2)
    out = reference_forward(cfg)
    for n, layer in enumerate(cfg["weights"]["encoder"]):
        x = out["encoder.input"] if n == 0 else out[f"encoder.{n - 1}.ffn.norm"]
        attn, ffn = layer["self_attn"], layer["ffn"]
        head = attn["heads"][1]
        np.testing.assert_allclose(
            out[f"encoder.{n}.self_attn.h1.q"], x @ np.array(head["W_q"]) + head["b_q"], atol=1e-13
        )
        wo = out[f"encoder.{n}.self_attn.concat"] @ np.array(attn["W_o"]) + attn["b_o"]
        np.testing.assert_allclose(out[f"encoder.{n}.self_attn.wo"], wo, atol=1e-13)
        np.testing.assert_allclose(out[f"encoder.{n}.self_attn.residual"], x + wo, atol=1e-13)
        y = layer_norm(x + wo, attn["norm"])
        np.testing.assert_allclose(out[f"encoder.{n}.self_attn.norm"], y, atol=1e-13)
        np.testing.assert_allclose(
            out[f"encoder.{n}.ffn.residual"], y + out[f"encoder.{n}.ffn.out"], atol=1e-13
        )
        np.testing.assert_allclose(
            out[f"encoder.{n}.ffn.norm"],
            layer_norm(y + out[f"encoder.{n}.ffn.out"], ffn["norm"]),
            atol=1e-13,
        )
    assert "encoder.final_norm" not in out  # default off for post-norm
    np.testing.assert_array_equal(out["encoder.output"], out["encoder.1.ffn.norm"])


def test_pre_norm_wiring_with_final_norm_and_cross_attention() -> None:
    cfg = random_config(
        np.random.default_rng(10), d_model=4, n_heads=2, decoder_layers=1, norm_position="pre"
    )
    out = reference_forward(cfg)
    enc, dec = cfg["weights"]["encoder"][0], cfg["weights"]["decoder"][0]
    x = out["encoder.input"]
    np.testing.assert_allclose(
        out["encoder.0.self_attn.norm"], layer_norm(x, enc["self_attn"]["norm"]), atol=1e-13
    )
    head = enc["self_attn"]["heads"][0]  # the attention reads norm(x), not x
    q = out["encoder.0.self_attn.norm"] @ np.array(head["W_q"]) + head["b_q"]
    np.testing.assert_allclose(out["encoder.0.self_attn.h0.q"], q, atol=1e-13)
    np.testing.assert_allclose(
        out["encoder.0.self_attn.residual"], x + out["encoder.0.self_attn.wo"], atol=1e-13
    )
    last = out["encoder.0.ffn.residual"]
    final = layer_norm(last, cfg["weights"]["encoder_final_norm"])  # default on for pre-norm
    np.testing.assert_allclose(out["encoder.final_norm"], final, atol=1e-13)
    np.testing.assert_array_equal(out["encoder.output"], out["encoder.final_norm"])
    # cross-attention: queries from the decoder (normed), keys and values from encoder.output
    cross = dec["cross_attn"]["heads"][1]
    np.testing.assert_allclose(
        out["decoder.0.cross_attn.h1.k"], final @ np.array(cross["W_k"]) + cross["b_k"], atol=1e-13
    )
    np.testing.assert_allclose(
        out["decoder.0.cross_attn.h1.v"], final @ np.array(cross["W_v"]) + cross["b_v"], atol=1e-13
    )
    y = out["decoder.0.cross_attn.norm"]
    np.testing.assert_allclose(
        y, layer_norm(out["decoder.0.self_attn.residual"], dec["cross_attn"]["norm"]), atol=1e-13
    )
    np.testing.assert_allclose(
        out["decoder.0.cross_attn.h1.q"], y @ np.array(cross["W_q"]) + cross["b_q"], atol=1e-13
    )
    out_w = cfg["weights"]["output"]
    logits = out["decoder.output"] @ np.array(out_w["W"]) + out_w["b"]
    np.testing.assert_allclose(out["logits"], logits, atol=1e-13)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(out["probs"], probs / probs.sum(axis=-1, keepdims=True), atol=1e-15)


def test_final_norm_can_be_switched() -> None:
    rng = np.random.default_rng(11)
    on = reference_forward(random_config(rng, d_model=4, n_heads=1, final_norm=True))
    assert "encoder.final_norm" in on
    off = reference_forward(
        random_config(rng, d_model=4, n_heads=1, norm_position="pre", final_norm=False)
    )
    assert "encoder.final_norm" not in off
    np.testing.assert_array_equal(off["encoder.output"], off["encoder.0.ffn.residual"])


def test_tied_output_uses_the_unscaled_embedding_table() -> None:
    cfg = random_config(
        np.random.default_rng(12),
        d_model=4,
        n_heads=2,
        decoder_layers=1,
        tie_embeddings=True,
        embed_scale=2.5,
    )
    out = reference_forward(cfg)
    table = np.array([cfg["embeddings"][t] for t in cfg["vocab"]])  # V x d_model
    expected = out["decoder.output"] @ table.T + cfg["weights"]["output"]["b"]
    np.testing.assert_allclose(out["logits"], expected, atol=1e-13)


def test_numeric_scale_divides_the_scores() -> None:
    cfg = random_config(np.random.default_rng(13), d_model=4, n_heads=2, scale=7)
    out = reference_forward(cfg)
    head = "encoder.0.self_attn.h0"
    np.testing.assert_allclose(out[f"{head}.scaled"], out[f"{head}.scores"] / 7, atol=0)
    np.testing.assert_allclose(
        out[f"{head}.scores"], out[f"{head}.q"] @ out[f"{head}.k"].T, atol=1e-13
    )


def test_fused_and_per_head_forms_agree() -> None:
    cfg = random_config(
        np.random.default_rng(14), d_model=6, n_heads=3, d_k=2, d_v=4, decoder_layers=1, fused=True
    )
    per_head = to_per_head(cfg)
    assert "heads" not in cfg["weights"]["encoder"][0]["self_attn"]  # the input is not modified
    fused_wv = np.array(cfg["weights"]["decoder"][0]["cross_attn"]["W_v"])
    np.testing.assert_array_equal(
        per_head["weights"]["decoder"][0]["cross_attn"]["heads"][2]["W_v"], fused_wv[:, 8:12]
    )
    fused_bq = cfg["weights"]["encoder"][0]["self_attn"]["b_q"]
    assert per_head["weights"]["encoder"][0]["self_attn"]["heads"][1]["b_q"] == fused_bq[2:4]
    a, b = reference_forward(cfg), reference_forward(per_head)
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)


def test_sdpa_cross_check_is_not_vacuous() -> None:
    rng = np.random.default_rng(15)
    q, k, v = (torch.tensor(rng.standard_normal(shape)) for shape in ((2, 3), (4, 3), (4, 5)))
    mask = torch.tensor([[0, 0, -INF, 0]] * 2, dtype=torch.float64)
    context = torch.softmax(q @ k.T / 2 + mask, dim=-1) @ v
    check_against_sdpa(q, k, v, mask, 2.0, context)
    with pytest.raises(AssertionError):
        check_against_sdpa(q, k, v, None, 2.0, context)  # the mask matters


# ---------------------------------------------------------------- every shape SPEC allows


def expected_paths(cfg: dict[str, Any]) -> set[str]:
    """The SPEC section 3 paths a config must produce (without masks, which are tested above)."""
    model = cfg["model"]
    stacks = [("encoder", model["encoder_layers"]), ("decoder", model["decoder_layers"])]
    paths = {"logits", "probs"}
    for stack, n_layers in stacks:
        if not n_layers:
            continue
        paths |= {f"{stack}.{p}" for p in ("embed", "input", "output")}
        if model.get("positional", "sinusoidal") != "none":
            paths.add(f"{stack}.pe")
        if f"{stack}_final_norm" in cfg["weights"]:
            paths.add(f"{stack}.final_norm")
        for n in range(n_layers):
            blocks = ["self_attn"] + (
                ["cross_attn"] if stack == "decoder" and model["encoder_layers"] else []
            )
            for block in blocks:
                for h in range(model["n_heads"]):
                    paths |= {
                        f"{stack}.{n}.{block}.h{h}.{s}"
                        for s in ("q", "k", "v", "scores", "scaled", "softmax", "context")
                    }
                paths |= {f"{stack}.{n}.{block}.{s}" for s in ("concat", "wo", "residual", "norm")}
            paths |= {f"{stack}.{n}.ffn.{s}" for s in ("hidden", "act", "out", "residual", "norm")}
    return paths


SHAPES = [
    {"d_model": 4, "n_heads": 2},
    {
        "d_model": 6,
        "n_heads": 3,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "pad": True,
        "src_len": 5,
        "tgt_len": 4,
    },
    {
        "d_model": 5,
        "n_heads": 1,
        "encoder_layers": 0,
        "decoder_layers": 2,
        "norm_position": "pre",
        "norm": "rms",
    },
    {
        "d_model": 4,
        "n_heads": 2,
        "d_k": 3,
        "d_v": 5,
        "d_ff": 7,
        "decoder_layers": 1,
        "fused": True,
        "biases": False,
    },
    {
        "d_model": 8,
        "n_heads": 4,
        "decoder_layers": 1,
        "positional": "learned",
        "activation": "gelu",
        "tie_embeddings": True,
        "embed_scale": "sqrt_d_model",
        "scale": 2.5,
    },
    {
        "d_model": 4,
        "n_heads": 2,
        "positional": "none",
        "activation": "gelu_tanh",
        "norm_position": "pre",
        "final_norm": False,
        "pad": True,
    },
]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_step_is_present_finite_and_serialisable(shape: dict[str, Any]) -> None:
    cfg = random_config(np.random.default_rng(16), **shape)
    out = reference_forward(cfg)
    missing = expected_paths(cfg) - out.keys()
    assert not missing, sorted(missing)
    for path, value in out.items():
        if not path.endswith("mask") and not path.endswith("masked"):
            assert np.all(np.isfinite(value)), path
    np.testing.assert_allclose(out["probs"].sum(axis=-1), 1, atol=1e-14)
    last_row = out[[p for p in out if p.endswith(".softmax")][-1]][-1]  # sees every unpadded key
    assert last_row.max() < 0.99  # not saturated
    for dumped in (json.loads(json.dumps(cfg)), yaml.safe_load(yaml.safe_dump(cfg))):
        again = reference_forward(dumped)
        for path in out:
            np.testing.assert_array_equal(again[path], out[path], err_msg=path)
