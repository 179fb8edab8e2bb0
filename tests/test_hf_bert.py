"""The engine against Hugging Face's BERT (transformers' BertModel, float64, eval).

Small random BERTs, every parameter drawn anew (HF's own init leaves biases at 0 and
γ at 1, where a misplaced norm or bias would not show), are converted here by the
mapping README "From Hugging Face BERT" states (written here independently, as
nested YAML data in the fused form; the README's own recipe, which writes an .npz,
is run as printed by `test_the_readme_recipe_*`).

BERT is an encoder-only, post-norm Transformer whose embeddings are normalised before
the first layer: `LayerNorm(word + position + token_type)` (BertEmbeddings), trace-tf's
`model.embed_norm`. Unlike LLaMA it computes nothing in float32 when made `.double()`
(nn.LayerNorm, exact GELU and the eager softmax all run in float64), so every value
must match to 1e-12 as shipped.

The conventions mapped:
- token types natively: `token_type_embeddings.weight` is `weights.token_types` with
  `model.token_types: type_vocab_size`, `token_type_ids` is `source_types`; so
  `encoder.token_type` is what the token-type embedding module outputs and `encoder.pe`
  what the position embedding module does (both caught by hooks), `encoder.input` is
  BERT's embedding sum, what its LayerNorm reads, and `hidden_states[0]` is
  `encoder.embed_norm`.
- or folded (the recipe before model.token_types, `fold=True`): position and token-type
  embeddings in one learned positional table, positional[i] = position_embeddings[i] +
  token_type_embeddings[type_i] (type 0 past the sentence); one layout of types per table.
- `hidden_states[l + 1]` is layer l's output, post-norm `encoder.<l>.ffn.norm`; the
  last is also `encoder.output`. `attentions[l][0, h]` is `encoder.<l>.self_attn.h<h>.softmax`.
- nn.Linear keeps its weight out × in and computes `x Wᵀ + b`: every weight is
  transposed.
- BertModel has no output head; `tie_embeddings: true` gives trace-tf's logits (not
  compared) without drawing an output matrix.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import shape_id
from hf_common import assert_matches, decode_json, listed, run_readme, traced
from transformers import BertConfig, BertModel

# BertConfig's sizes and options, each model's own
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=8, intermediate_size=32),
    dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=16, intermediate_size=48),
    dict(num_hidden_layers=2, num_attention_heads=3, hidden_size=24, intermediate_size=48),
    dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=32, intermediate_size=64),
]
VOCAB_SIZE, MAX_POSITIONS = 20, 16


def bert(shape: dict[str, Any], seed: int) -> BertModel:
    """A BertModel of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        hidden_act="gelu",  # exact (erf): trace-tf's gelu
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        attn_implementation="eager",
        **shape,
    )
    model = BertModel(config, add_pooling_layer=False).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("LayerNorm.weight"):
                p.copy_(1 + 0.3 * noise)  # γ near 1
            elif p.dim() == 1:
                p.copy_(0.3 * noise)  # biases, β
            elif "embeddings" in name:
                p.copy_(0.5 * noise)  # word, position and token-type tables
            else:
                p.copy_(noise / p.shape[1] ** 0.5)  # nn.Linear, out x in: unit-size outputs
    return model


def vocab_of(model: BertModel) -> list[str]:
    return ["PAD"] + [f"t{i}" for i in range(1, model.config.vocab_size)]


def sentence(seed: int, length: int = 6) -> list[int]:
    """Token ids, none of them the pad id 0."""
    return np.random.default_rng(seed).integers(1, VOCAB_SIZE, size=length).tolist()


def to_config(
    model: BertModel,
    ids: list[int],
    types: list[int] | None = None,
    pad: bool = False,
    fold: bool = False,
) -> dict[str, Any]:
    """README's mapping, as nested config data with the weights in the YAML's fused form:
    the token types natively (`types` as source_types, default none: all 0), or with
    `fold` in the positional table."""
    c = model.config
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    e = "embeddings"
    positional = p[f"{e}.position_embeddings.weight"]
    if fold:
        every = (types or []) + [0] * (c.max_position_embeddings - len(types or []))
        positional = positional + p[f"{e}.token_type_embeddings.weight"][every]

    def norm(key: str) -> dict[str, Any]:
        return {"gamma": p[f"{key}.weight"], "beta": p[f"{key}.bias"]}

    layers = []
    for l in range(c.num_hidden_layers):
        a, b = f"encoder.layer.{l}.attention.self", f"encoder.layer.{l}"
        attn = {
            "W_q": p[f"{a}.query.weight"].T,
            "b_q": p[f"{a}.query.bias"],
            "W_k": p[f"{a}.key.weight"].T,
            "b_k": p[f"{a}.key.bias"],
            "W_v": p[f"{a}.value.weight"].T,
            "b_v": p[f"{a}.value.bias"],
            "W_o": p[f"{b}.attention.output.dense.weight"].T,
            "b_o": p[f"{b}.attention.output.dense.bias"],
            "norm": norm(f"{b}.attention.output.LayerNorm"),
        }
        ffn = {
            "W_1": p[f"{b}.intermediate.dense.weight"].T,
            "b_1": p[f"{b}.intermediate.dense.bias"],
            "W_2": p[f"{b}.output.dense.weight"].T,
            "b_2": p[f"{b}.output.dense.bias"],
            "norm": norm(f"{b}.output.LayerNorm"),
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    word = p[f"{e}.word_embeddings.weight"]
    raw = {
        "model": {
            "d_model": c.hidden_size,
            "n_heads": c.num_attention_heads,
            "d_ff": c.intermediate_size,
            "encoder_layers": c.num_hidden_layers,
            "decoder_layers": 0,
            "positional": "learned",
            "max_len": c.max_position_embeddings,
            "norm_position": "post",
            "embed_norm": True,
            "norm": "layer",
            "norm_eps": c.layer_norm_eps,
            "activation": "gelu",
            "tie_embeddings": True,
        },
        "vocab": vocab,
        "tokens": {"pad": vocab[c.pad_token_id]} if pad else {},
        "embeddings": {t: word[i] for i, t in enumerate(vocab)},
        "source": [vocab[i] for i in ids],
        "weights": {
            "encoder": layers,
            "encoder_embed_norm": norm(f"{e}.LayerNorm"),
            "positional": positional,
        },
    }
    if not fold:
        raw["model"]["token_types"] = c.type_vocab_size
        raw["weights"]["token_types"] = p[f"{e}.token_type_embeddings.weight"]
        if types is not None:
            raw["source_types"] = types
    return listed(raw)


@torch.no_grad()
def hf_outputs(
    model: BertModel,
    ids: list[int],
    types: list[int] | None = None,
    attention_mask: list[int] | None = None,
    native: bool = True,
) -> dict[str, np.ndarray]:
    """BERT's values under the trace-tf step each one is, for `ids` (batch of one): with
    `native`, also the looked-up position and token-type rows (`encoder.pe`,
    `encoder.token_type`), which a folded config has as one table."""
    seen: list[torch.Tensor] = []
    looked_up: dict[str, torch.Tensor] = {}
    m = model.embeddings
    hooks = [m.LayerNorm.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))]
    if native:
        for path, module in (
            ("encoder.pe", m.position_embeddings),
            ("encoder.token_type", m.token_type_embeddings),
        ):
            hooks.append(
                module.register_forward_hook(
                    lambda _m, _args, out, path=path: looked_up.setdefault(path, out)
                )
            )
    kwargs: dict[str, Any] = {}
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor([types])
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.tensor([attention_mask])
    try:
        out = model(
            torch.tensor([ids]), output_hidden_states=True, output_attentions=True, **kwargs
        )
    finally:
        for hook in hooks:
            hook.remove()
    n, H = model.config.num_hidden_layers, model.config.num_attention_heads
    hidden = out.hidden_states
    assert len(hidden) == n + 1 and len(out.attentions) == n and len(seen) == 1
    values = {
        "encoder.input": seen[0][0],
        "encoder.embed_norm": hidden[0][0],
        "encoder.output": out.last_hidden_state[0],
    }
    values |= {path: v[0] for path, v in looked_up.items()}
    assert len(looked_up) == (2 if native else 0)
    values |= {f"encoder.{l}.ffn.norm": hidden[l + 1][0] for l in range(n)}
    for l, a in enumerate(out.attentions):
        assert a.shape == (1, H, len(ids), len(ids))
        values |= {f"encoder.{l}.self_attn.h{h}.softmax": a[0, h] for h in range(H)}
    return {k: v.numpy() for k, v in values.items()}


def encoded(raw: dict[str, Any]) -> Callable[[str], np.ndarray]:
    return traced(raw, "encode").value


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_and_head_matches_bert(shape: dict[str, Any], seed: int) -> None:
    model = bert(shape, seed)
    ids = sentence(seed, 5 + seed)
    expected = hf_outputs(model, ids)
    c = model.config
    assert len(expected) == 5 + c.num_hidden_layers * (1 + c.num_attention_heads)
    assert_matches(expected, encoded(to_config(model, ids)))


def pair(seed: int, first: int, second: int) -> tuple[list[int], list[int]]:
    """A sentence pair's ids and token_type_ids: 0 for the first, 1 for the second."""
    return sentence(seed, first) + sentence(seed + 100, second), [0] * first + [1] * second


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_a_sentence_pair_s_token_types_natively(shape: dict[str, Any], seed: int) -> None:
    """token_type_ids as source_types, token_type_embeddings as weights.token_types: the
    rows each position looks up (encoder.token_type), the sum, every state."""
    model = bert(shape, seed)
    ids, types = pair(seed, 3 + seed, 4)
    expected = hf_outputs(model, ids, types)
    raw = to_config(model, ids, types)
    value = encoded(raw)
    assert_matches(expected, value)
    # the lookup by hand: row type_i of the table, the second sentence's rows all row 1
    table = model.embeddings.token_type_embeddings.weight.detach().numpy()
    assert np.array_equal(value("encoder.token_type"), table[types])
    # the same file holds another pair's layout: only source and source_types change
    other_ids, other_types = pair(seed + 10, 2, 5)
    raw |= {"source": [vocab_of(model)[i] for i in other_ids], "source_types": other_types}
    assert_matches(hf_outputs(model, other_ids, other_types), encoded(raw))


@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
def test_a_sentence_pair_folds_each_positions_token_type(shape: dict[str, Any]) -> None:
    """The folded recipe, positional[i] = position_embeddings[i] + token_type_embeddings
    [type_i], still computes BERT; and gives the native form's numbers (to 1e-12: BERT
    adds (word + type) + position, the native form (word + position) + type, the folded
    word + (position + type), each its own rounding)."""
    model = bert(shape, 2)
    ids, types = sentence(2, 7), [0, 0, 0, 1, 1, 1, 1]
    expected = hf_outputs(model, ids, types, native=False)
    folded = encoded(to_config(model, ids, types, fold=True))
    assert_matches(expected, folded)
    native = traced(to_config(model, ids, types), "encode")
    # (the folded pe holds the types too: every step from the sum on is compared)
    compared = [s.path for s in native if s.path not in ("encoder.pe", "encoder.token_type")]
    assert len(compared) > 20
    assert_matches({path: folded(path) for path in compared}, native.value)
    # and the types matter: folded as all 0, the embedding sum is off by their difference
    value = encoded(to_config(model, ids, fold=True))
    tt = model.embeddings.token_type_embeddings.weight.detach().numpy()
    np.testing.assert_allclose(
        expected["encoder.input"][3:] - value("encoder.input")[3:],
        np.broadcast_to(tt[1] - tt[0], (4, model.config.hidden_size)),
        rtol=0,
        atol=1e-12,
    )


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=shape_id)
def test_a_padded_sentence_pair_with_native_token_types(shape: dict[str, Any]) -> None:
    """A pair padded to a longer batch: the pads' type 0 looked up, and masked as keys."""
    model = bert(shape, 4)
    ids, types = pair(4, 3, 3)
    ids, types = [*ids, 0, 0], [*types, 0, 0]
    mask = [int(i != 0) for i in ids]
    expected = hf_outputs(model, ids, types, mask)
    assert_matches(expected, encoded(to_config(model, ids, types, pad=True)))


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=shape_id)
def test_pad_positions_masked_as_keys_as_bert_s_attention_mask_does(shape: dict[str, Any]) -> None:
    """tokens.pad masks pad keys with −inf; BERT adds the dtype's least number where
    attention_mask is 0. Both give the pad keys a weight of exactly 0, so every row
    agrees, the pad rows (queries, never masked in either) included."""
    model = bert(shape, 3)
    ids = [*sentence(3, 5), 0, 0, 0]
    mask = [int(i != 0) for i in ids]
    expected = hf_outputs(model, ids, attention_mask=mask)
    value = encoded(to_config(model, ids, pad=True))
    assert_matches(expected, value)
    for l in range(model.config.num_hidden_layers):
        a = value(f"encoder.{l}.self_attn.h0.softmax")
        assert (a[:, 5:] == 0).all() and (
            expected[f"encoder.{l}.self_attn.h0.softmax"][:, 5:] == 0
        ).all()
    # without trace-tf's pad mask, the pad keys are read and the states differ
    with pytest.raises(AssertionError):
        assert_matches(expected, encoded(to_config(model, ids)))


def no_embed_norm(raw: dict[str, Any]) -> None:
    raw["model"]["embed_norm"] = False
    del raw["weights"]["encoder_embed_norm"]


def swap_q_k(raw: dict[str, Any]) -> None:
    a = raw["weights"]["encoder"][0]["self_attn"]
    a["W_q"], a["W_k"] = a["W_k"], a["W_q"]
    a["b_q"], a["b_k"] = a["b_k"], a["b_q"]


def norms_swapped(raw: dict[str, Any]) -> None:
    """The attention output's LayerNorm given to the FFN and the other way round."""
    layer = raw["weights"]["encoder"][0]
    layer["self_attn"]["norm"], layer["ffn"]["norm"] = (
        layer["ffn"]["norm"],
        layer["self_attn"]["norm"],
    )


def gelu_tanh(raw: dict[str, Any]) -> None:
    raw["model"]["activation"] = "gelu_tanh"


def pre_norm(raw: dict[str, Any]) -> None:
    raw["model"]["norm_position"] = "pre"
    raw["model"]["final_norm"] = False


def types_swapped(raw: dict[str, Any]) -> None:
    """Sentence A read as type 1, B as type 0."""
    raw["source_types"] = [1 - t for t in raw["source_types"]]


def table_rows_swapped(raw: dict[str, Any]) -> None:
    """token_type_embeddings' rows in the wrong order (the same as the types swapped)."""
    raw["weights"]["token_types"] = raw["weights"]["token_types"][::-1]


def token_types_omitted(raw: dict[str, Any]) -> None:
    """No token-type table: the sum lacks token_type_embeddings[type_i] everywhere."""
    del raw["model"]["token_types"], raw["weights"]["token_types"], raw["source_types"]


def types_left_out(raw: dict[str, Any]) -> None:
    """The table, but token_type_ids not given: every position type 0."""
    del raw["source_types"]


@pytest.mark.parametrize(
    "mutate",
    [
        no_embed_norm,
        swap_q_k,
        norms_swapped,
        gelu_tanh,
        pre_norm,
        types_swapped,
        table_rows_swapped,
        token_types_omitted,
        types_left_out,
    ],
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Each plausible conversion mistake makes the comparison above fail."""
    model = bert(SHAPES[1], 5)
    ids, types = pair(5, 3, 3)
    raw = to_config(model, ids, types)
    mutate(raw)
    expected = hf_outputs(model, ids, types)
    if mutate is token_types_omitted:  # no such step: the rest must differ
        del expected["encoder.token_type"]
    if mutate is no_embed_norm:  # layer 0 reads the sum itself: off by far more than 1e-3
        value = encoded(raw)
        assert np.abs(value("encoder.input") - expected.pop("encoder.embed_norm")).max() > 1e-3
        first = value("encoder.0.ffn.norm")
        assert np.abs(first - expected["encoder.0.ffn.norm"]).max() > 1e-3
    with pytest.raises(AssertionError):
        assert_matches(expected, encoded(raw))


# ------------------------------------------------------- README recipe: BERT → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face BERT", seed=0)
    assert os.path.exists("bert.yaml") and os.path.exists("bert.npz")
    model, ids, types = scope["model"], scope["ids"], scope["types"]
    assert_matches(hf_outputs(model, ids, types), decode_json("bert.yaml", "encode"))


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_bert(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `bert_arrays` and `bert_config` on other models, drawn in full, with a
    sentence pair and with pads: each step as BERT computes it."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face BERT")
    model = bert(shape, 7)
    vocab = vocab_of(model)
    ids, types = sentence(7, 4) + sentence(8, 3) + [0, 0], [0] * 4 + [1] * 5
    np.savez("m.npz", **scope["bert_arrays"](model, vocab))
    config = scope["bert_config"](model, vocab, [vocab[i] for i in ids], "m.npz", types, "PAD")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    mask = [int(i != 0) for i in ids]
    assert_matches(hf_outputs(model, ids, types, mask), decode_json("m.yaml", "encode"))
