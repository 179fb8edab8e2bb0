"""The engine against PyTorch's own Transformer modules (torch.nn, float64, eval, no dropout).

tests/reference_torch.py is our PyTorch implementation of SPEC; here the engine meets
the library modules engineers compare with: nn.TransformerEncoderLayer,
TransformerDecoderLayer, TransformerEncoder and TransformerDecoder (their final
`norm`), MultiheadAttention's per-head weights and an nn.Linear for the logits.
Each random config's weights are copied into the modules by the mapping README
"From PyTorch weights" states (written here independently; the README's own recipe,
the other direction, is run as printed by `test_the_readme_recipe_*`).

The conventions mapped, beside what README lists:
- torch needs d_k·n_heads = d_model and d_v = d_k, and always divides by √d_k; it
  has LayerNorm only, and always has biases (a config without them gets zeros).
- A layer's output is the step `<l>.ffn.norm` post-norm, `<l>.ffn.residual` pre-norm.
- trace-tf's decoder-only layer (no cross-attention) is a TransformerEncoderLayer
  run with a causal mask: torch's decoder layer always has cross-attention.
- TransformerEncoder's fast path (eval, no grad, post-norm, an even number of heads,
  pads at the end, enable_nested_tensor left on) runs on a nested tensor and
  returns 0 in the pad rows; trace-tf computes those rows (only keys are masked).
- A fully masked query row: NaN in trace-tf (SPEC), finite in torch's layers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import config_from, readme_python, shape_id
from random_configs import PAD, random_config
from torch import nn

from trace_tf.config import Config, load
from trace_tf.runner import run
from trace_tf.trace import Trace

RTOL = ATOL = 1e-12
F64 = torch.float64
# torch's notes on its nested-tensor fast path, which these tests take on purpose
pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning"),
]


def tensor(value: Any) -> torch.Tensor:
    return torch.tensor(np.asarray(value, dtype=np.float64), dtype=F64)


def close(actual: torch.Tensor, expected: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(actual.numpy(), expected, rtol=RTOL, atol=ATOL, err_msg=what)


# ------------------------------------------------------------ trace-tf → torch


def fused(block: dict[str, Any], p: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """W_p (d_model × H·width) and b_p of an attention block, per-head form joined side by side."""
    if "heads" in block:
        heads = block["heads"]
        W = np.concatenate([np.asarray(h[f"W_{p}"]) for h in heads], axis=1)
        b = [np.asarray(h.get(f"b_{p}", np.zeros(width))) for h in heads]
        return W, np.concatenate(b)
    W = np.asarray(block[f"W_{p}"])
    return W, np.asarray(block.get(f"b_{p}", np.zeros(W.shape[1])))


@torch.no_grad()
def load_linear(linear: nn.Linear, W: Any, b: Any) -> None:
    linear.weight.copy_(tensor(W).T)  # torch: out × in, y = x Wᵀ + b
    linear.bias.copy_(tensor(b) if b is not None else torch.zeros_like(linear.bias))


@torch.no_grad()
def load_attention(mha: nn.MultiheadAttention, block: dict[str, Any], d_k: int) -> None:
    """in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ] (3·d_model × d_model), head h rows h·d_k.. of each third."""
    parts = [fused(block, p, d_k) for p in "qkv"]
    mha.in_proj_weight.copy_(torch.cat([tensor(W).T for W, _ in parts]))
    mha.in_proj_bias.copy_(torch.cat([tensor(b) for _, b in parts]))
    load_linear(mha.out_proj, block["W_o"], block.get("b_o"))


@torch.no_grad()
def load_norm(norm: nn.LayerNorm, weights: dict[str, Any]) -> None:
    norm.weight.copy_(tensor(weights["gamma"]))
    norm.bias.copy_(tensor(weights["beta"]))


def load_ffn(layer: nn.Module, ffn: dict[str, Any]) -> None:
    assert isinstance(layer.linear1, nn.Linear) and isinstance(layer.linear2, nn.Linear)
    load_linear(layer.linear1, ffn["W_1"], ffn.get("b_1"))
    load_linear(layer.linear2, ffn["W_2"], ffn.get("b_2"))


def layer_options(model: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of torch's layers for trace-tf's `model` section."""
    activation: Any = {
        "relu": "relu",
        "gelu": "gelu",  # torch's "gelu" is the exact erf form
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    }[model.get("activation", "relu")]
    d_model = model["d_model"]
    return dict(
        d_model=d_model,
        nhead=model["n_heads"],
        dim_feedforward=model.get("d_ff", 4 * d_model),
        dropout=0.0,
        activation=activation,
        layer_norm_eps=model.get("norm_eps", 1e-5),
        batch_first=True,
        norm_first=model.get("norm_position") == "pre",
        dtype=F64,
    )


def encoder_layer(weights: dict[str, Any], model: dict[str, Any]) -> nn.TransformerEncoderLayer:
    layer = nn.TransformerEncoderLayer(**layer_options(model))
    load_attention(layer.self_attn, weights["self_attn"], model["d_model"] // model["n_heads"])
    load_norm(layer.norm1, weights["self_attn"]["norm"])
    load_ffn(layer, weights["ffn"])
    load_norm(layer.norm2, weights["ffn"]["norm"])
    return layer.eval()


def decoder_layer(weights: dict[str, Any], model: dict[str, Any]) -> nn.TransformerDecoderLayer:
    """Sublayers in torch's order: self_attn + norm1, multihead_attn (cross) + norm2, ffn + norm3."""
    layer = nn.TransformerDecoderLayer(**layer_options(model))
    d_k = model["d_model"] // model["n_heads"]
    load_attention(layer.self_attn, weights["self_attn"], d_k)
    load_norm(layer.norm1, weights["self_attn"]["norm"])
    load_attention(layer.multihead_attn, weights["cross_attn"], d_k)
    load_norm(layer.norm2, weights["cross_attn"]["norm"])
    load_ffn(layer, weights["ffn"])
    load_norm(layer.norm3, weights["ffn"]["norm"])
    return layer.eval()


def final_norm(raw: dict[str, Any], stack: str) -> nn.LayerNorm | None:
    weights = raw["weights"].get(f"{stack}_final_norm")
    if weights is None:
        return None
    norm = nn.LayerNorm(raw["model"]["d_model"], eps=raw["model"].get("norm_eps", 1e-5), dtype=F64)
    load_norm(norm, weights)
    return norm


def masks(tokens: list[str], kind: str, causal: bool) -> tuple[torch.Tensor | None, ...]:
    """(attn_mask, key_padding_mask) for a sequence, boolean (True = may not look) or
    float (added to the scores, as trace-tf's M), batch of one."""
    L = len(tokens)
    pads = torch.tensor([[t == PAD for t in tokens]])
    causal_mask = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None
    if kind == "float":
        if causal_mask is not None:
            causal_mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64)
        pads = torch.zeros(1, L, dtype=F64).masked_fill(pads, float("-inf"))
    return causal_mask, pads


def output_of(prefix: str, model: dict[str, Any]) -> str:
    """The step that is a layer's output (SPEC section 3)."""
    return f"{prefix}.ffn.residual" if model.get("norm_position") == "pre" else f"{prefix}.ffn.norm"


def attention_input(trace: Trace, prefix: str, block: str, x: np.ndarray, pre: bool) -> np.ndarray:
    """What a block's attention reads: the sublayer's input, or its norm pre-norm."""
    return trace.value(f"{prefix}.{block}.norm") if pre else x


def check_heads(
    mha: nn.MultiheadAttention,
    trace: Trace,
    prefix: str,
    query: np.ndarray,
    memory: np.ndarray,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
) -> None:
    """MultiheadAttention's per-head weights against each head's softmax, and its output
    against `wo`: this pins the per-head split of the fused in_proj."""
    out, weights = mha(
        tensor(query)[None],
        tensor(memory)[None],
        tensor(memory)[None],
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    assert weights is not None and weights.shape == (1, mha.num_heads, len(query), len(memory))
    for h in range(mha.num_heads):
        close(weights[0, h], trace.value(f"{prefix}.h{h}.softmax"), f"{prefix}.h{h}.softmax")
    close(out[0], trace.value(f"{prefix}.wo"), f"{prefix}.wo")


SHAPES: list[dict[str, Any]] = [
    dict(d_model=4, n_heads=2, encoder_layers=2),  # encoder-only, post-norm, relu
    dict(d_model=6, n_heads=3, encoder_layers=3, norm_position="pre", activation="gelu", eps=1e-3),
    dict(d_model=8, n_heads=2, encoder_layers=2, pad=True, src_len=5, eps=1e-6),
    dict(d_model=6, n_heads=2, encoder_layers=2, decoder_layers=2, eps=1e-6),
    dict(
        d_model=8,
        n_heads=4,
        encoder_layers=2,
        decoder_layers=1,
        norm_position="pre",
        activation="gelu",
        fused=True,
        pad=True,
        src_len=5,
        tgt_len=4,
        eps=0.1,
    ),
    dict(d_model=6, n_heads=2, decoder_layers=2, norm_position="pre", final_norm=False),
    dict(d_model=4, n_heads=1, decoder_layers=1, activation="gelu_tanh", biases=False),
    dict(d_model=8, n_heads=2, decoder_layers=2, pad=True, src_len=4, tgt_len=5, eps=1e-4),
    # decoder-only: TransformerEncoderLayer with a causal mask, post- and pre-norm
    dict(d_model=6, n_heads=2, encoder_layers=0, decoder_layers=2, pad=True, tgt_len=5),
    dict(d_model=4, n_heads=2, encoder_layers=0, decoder_layers=2, norm_position="pre", eps=1e-2),
]


def traced(shape: dict[str, Any], seed: int) -> tuple[dict[str, Any], Trace]:
    """A random config of `shape` (`eps`: its norm_eps), every array given, and its trace."""
    options = dict(shape)
    eps = options.pop("eps", None)
    raw = random_config(np.random.default_rng(seed), **options)
    if eps is not None:
        raw["model"]["norm_eps"] = eps
    raw["model"].setdefault("d_ff", 4 * raw["model"]["d_model"])
    cfg = config_from(raw)
    assert isinstance(cfg, Config) and cfg.drawn == ()
    return raw, run(cfg, "full")


@pytest.fixture(params=[True, False], ids=["fastpath", "no-fastpath"])
def fastpath(request: pytest.FixtureRequest) -> Iterator[bool]:
    """torch's fused inference path of TransformerEncoderLayer and MultiheadAttention, on and off."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(request.param)
    yield request.param
    torch.backends.mha.set_fastpath_enabled(before)


def check_self_stack(raw: dict[str, Any], trace: Trace, mask_kind: str, stack: str) -> torch.Tensor:
    """Each layer of a stack without cross-attention as a TransformerEncoderLayer, then
    the TransformerEncoder stack: the encoder, or a decoder-only model's decoder (with
    the causal mask). -> its output"""
    model, pre = raw["model"], raw["model"].get("norm_position") == "pre"
    decoder = stack == "decoder"
    seq = raw["target" if decoder else "source"]
    causal, pads = masks(seq, mask_kind, causal=decoder)
    # (the decoder always has a mask, the causal one: its pads are seen in the target)
    pads = pads if (PAD in seq if decoder else "encoder.mask" in trace) else None
    is_causal = {"is_causal": True} if decoder else {}
    layers = [encoder_layer(w, model) for w in raw["weights"][stack]]
    x = trace.value(f"{stack}.input")
    for l, layer in enumerate(layers):
        prefix = f"{stack}.{l}"
        query = attention_input(trace, prefix, "self_attn", x, pre)
        check_heads(layer.self_attn, trace, f"{prefix}.self_attn", query, query, causal, pads)
        y = layer(tensor(x)[None], src_mask=causal, src_key_padding_mask=pads, **is_causal)[0]
        close(y, trace.value(output_of(prefix, model)), prefix)
        x = y.numpy()  # the next layer reads torch's output
    whole = nn.TransformerEncoder(
        layers[0], len(layers), norm=final_norm(raw, stack), enable_nested_tensor=False
    )
    whole.layers = nn.ModuleList(layers)  # the stack deep-copies its layer: give it ours
    x0 = tensor(trace.value(f"{stack}.input"))[None]
    out = whole(x0, mask=causal, src_key_padding_mask=pads, **is_causal)[0]
    close(out, trace.value(f"{stack}.output"), f"{stack}.output")
    return out


def check_decoder(
    raw: dict[str, Any], trace: Trace, mask_kind: str, memory: torch.Tensor
) -> torch.Tensor:
    """Each TransformerDecoderLayer (self → cross → ffn), then the TransformerDecoder stack."""
    model, pre = raw["model"], raw["model"].get("norm_position") == "pre"
    causal, pads = masks(raw["target"], mask_kind, causal=True)
    pads = pads if PAD in raw["target"] else None
    _, memory_pads = masks(raw["source"], mask_kind, causal=False)
    memory_pads = memory_pads if "decoder.cross_mask" in trace else None
    layers = [decoder_layer(w, model) for w in raw["weights"]["decoder"]]
    given = dict(  # the masks, to each layer and to the stack
        tgt_mask=causal,
        tgt_key_padding_mask=pads,
        memory_key_padding_mask=memory_pads,
        tgt_is_causal=True,
    )
    x = trace.value("decoder.input")
    for l, layer in enumerate(layers):
        prefix = f"decoder.{l}"
        query = attention_input(trace, prefix, "self_attn", x, pre)
        check_heads(layer.self_attn, trace, f"{prefix}.self_attn", query, query, causal, pads)
        after_self = trace.value(f"{prefix}.self_attn.{'residual' if pre else 'norm'}")
        query = attention_input(trace, prefix, "cross_attn", after_self, pre)
        enc = trace.value("encoder.output")
        check_heads(
            layer.multihead_attn, trace, f"{prefix}.cross_attn", query, enc, None, memory_pads
        )
        y = layer(tensor(x)[None], memory[None], **given)[0]
        close(y, trace.value(output_of(prefix, model)), prefix)
        x = y.numpy()
    stack = nn.TransformerDecoder(layers[0], len(layers), norm=final_norm(raw, "decoder"))
    stack.layers = nn.ModuleList(layers)
    out = stack(tensor(trace.value("decoder.input"))[None], memory[None], **given)[0]
    close(out, trace.value("decoder.output"), "decoder.output")
    return out


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@torch.no_grad()
def test_every_layer_matches_torch_nn(
    shape: dict[str, Any], mask_kind: str, fastpath: bool
) -> None:
    """Every layer's output, MultiheadAttention's per-head weights, each stack's output
    and the logits, with boolean or float masks, torch's fast path on or off."""
    raw, trace = traced(shape, seed=5)
    model = raw["model"]
    last = memory = None
    if model["encoder_layers"]:
        last = memory = check_self_stack(raw, trace, mask_kind, "encoder")
    if model["decoder_layers"]:
        if memory is None:
            last = check_self_stack(raw, trace, mask_kind, "decoder")
        else:
            last = check_decoder(raw, trace, mask_kind, memory)
    assert last is not None
    head = nn.Linear(model["d_model"], len(raw["vocab"]), dtype=F64)
    load_linear(head, raw["weights"]["output"]["W"], raw["weights"]["output"].get("b"))
    close(head(last), trace.value("logits"), "logits")


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@torch.no_grad()
def test_nn_transformer_is_a_model_with_both_final_norms(
    norm_position: str, fastpath: bool
) -> None:
    """nn.Transformer builds `encoder.norm` and `decoder.norm` whatever `norm_first` is:
    trace-tf's `final_norm: true`, with pads in source and target."""
    shape = dict(
        d_model=8,
        n_heads=2,
        encoder_layers=2,
        decoder_layers=2,
        norm_position=norm_position,
        final_norm=True,
        pad=True,
        src_len=5,
        tgt_len=4,
        eps=1e-3,
    )
    raw, trace = traced(shape, seed=13)
    model, weights = raw["model"], raw["weights"]
    options = layer_options(model)
    options["num_encoder_layers"] = options["num_decoder_layers"] = 2
    transformer = nn.Transformer(**options).eval()
    transformer.encoder.layers = nn.ModuleList(encoder_layer(w, model) for w in weights["encoder"])
    transformer.decoder.layers = nn.ModuleList(decoder_layer(w, model) for w in weights["decoder"])
    for stack in (transformer.encoder, transformer.decoder):
        assert isinstance(stack.norm, nn.LayerNorm), "nn.Transformer always has final norms"
    load_norm(transformer.encoder.norm, weights["encoder_final_norm"])
    load_norm(transformer.decoder.norm, weights["decoder_final_norm"])
    _, src_pads = masks(raw["source"], "bool", causal=False)
    causal, tgt_pads = masks(raw["target"], "bool", causal=True)
    out = transformer(
        tensor(trace.value("encoder.input"))[None],
        tensor(trace.value("decoder.input"))[None],
        tgt_mask=causal,
        src_key_padding_mask=src_pads,
        tgt_key_padding_mask=tgt_pads,
        memory_key_padding_mask=src_pads,
        tgt_is_causal=True,
    )[0]
    close(out, trace.value("decoder.output"), "decoder.output")


@torch.no_grad()
def test_encoder_fast_path_zeroes_pad_rows_that_trace_tf_computes() -> None:
    """A documented torch difference, not a bug: TransformerEncoder's nested-tensor fast
    path returns 0 in the pad rows; the other rows are trace-tf's."""
    raw, trace = traced(dict(d_model=8, n_heads=2, encoder_layers=2, pad=True, src_len=6), seed=9)
    layers = [encoder_layer(w, raw["model"]) for w in raw["weights"]["encoder"]]
    stack = nn.TransformerEncoder(layers[0], 2)  # enable_nested_tensor=True, the default
    stack.layers = nn.ModuleList(layers)
    _, pads = masks(raw["source"], "bool", causal=False)
    assert pads is not None and bool(pads.any())
    out = stack(tensor(trace.value("encoder.input"))[None], src_key_padding_mask=pads)[0]
    keep = ~pads[0]
    close(out[keep], trace.value("encoder.output")[keep.numpy()], "encoder.output, real rows")
    assert torch.all(out[~keep] == 0)
    assert np.all(np.abs(trace.value("encoder.output")[~keep.numpy()]) > 0)


@torch.no_grad()
def test_a_fully_masked_row_is_nan_in_trace_tf_and_zero_attention_in_torch_layers(
    fastpath: bool,
) -> None:
    """A documented difference: a query row whose every key is masked (a target that starts
    with the pad token) is NaN in trace-tf, with a warning (SPEC section 1). torch's layers
    call MultiheadAttention with need_weights=False, whose softmax gives 0 there, so the row
    comes out finite; the fast path and need_weights=True give NaN, as trace-tf does."""
    raw = random_config(
        np.random.default_rng(2), d_model=4, n_heads=2, encoder_layers=0, decoder_layers=1,
        pad=True, tgt_len=4,
    )  # fmt: skip
    raw["target"][0] = PAD
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    trace = run(cfg, "full")
    assert trace.warnings and "decoder.0.self_attn.h0" in trace.warnings[0]
    assert np.isnan(trace.value("decoder.0.self_attn.h0.softmax")[0]).all()
    layer = encoder_layer(raw["weights"]["decoder"][0], raw["model"])
    causal, pads = masks(raw["target"], "bool", causal=True)
    x = tensor(trace.value("decoder.input"))[None]
    _, weights = layer.self_attn(
        x, x, x, attn_mask=causal, key_padding_mask=pads, average_attn_weights=False
    )
    assert weights is not None and torch.isnan(weights[0, :, 0]).all()
    y = layer(x, src_mask=causal, src_key_padding_mask=pads, is_causal=True)[0]
    expected = trace.value("decoder.0.ffn.norm")
    assert np.isnan(expected[0]).all()
    assert torch.isnan(y[0]).all() if fastpath else torch.isfinite(y[0]).all()
    close(y[1:], expected[1:], "the other rows")


@torch.no_grad()
def test_nn_embedding_and_a_tied_head() -> None:
    """nn.Embedding's row i is `embeddings.<vocab[i]>` as is; a head tied the torch way
    (`head.weight = embedding.weight`, vocab × d_model) is trace-tf's tie_embeddings."""
    raw, trace = traced(
        dict(d_model=6, n_heads=2, decoder_layers=1, tie_embeddings=True, pad=True), seed=4
    )
    vocab = raw["vocab"]
    embedding = nn.Embedding(len(vocab), raw["model"]["d_model"], dtype=F64)
    embedding.weight.copy_(tensor([raw["embeddings"][t] for t in vocab]))
    for stack in ("encoder", "decoder"):
        ids = torch.tensor(
            [vocab.index(t) for t in raw["source" if stack == "encoder" else "target"]]
        )
        close(embedding(ids), trace.value(f"{stack}.embed"), f"{stack}.embed")
    head = nn.Linear(raw["model"]["d_model"], len(vocab), dtype=F64)
    head.weight = embedding.weight
    head.bias.copy_(tensor(raw["weights"]["output"]["b"]))
    close(head(tensor(trace.value("decoder.output"))), trace.value("logits"), "logits")


# ------------------------------------------------------- README recipe: torch → trace-tf


def readme_recipe() -> str:
    """The Python block of README's "From PyTorch weights" section, as printed."""
    return readme_python("From PyTorch weights")


@torch.no_grad()
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict[str, Any] = {}
    exec(compile(readme_recipe(), "README.md", "exec"), scope)  # our own README
    assert os.path.exists("from_torch.yaml")
    cfg = load("from_torch.yaml")
    assert isinstance(cfg, Config) and cfg.drawn == ()
    layer, x = scope["layer"], scope["x"]
    expected = layer.double()(x.double()[None])[0]
    close(expected, run(cfg, "encode").value("encoder.output"), "encoder.output")
    # its .npz form: every array from the file, every step the same bit for bit
    from_npz = load("from_torch_npz.yaml")
    assert isinstance(from_npz, Config) and from_npz.drawn == ()
    assert from_npz.weights_file == "from_torch.npz" and from_npz.weights_file_arrays == 16
    a, b = run(cfg, "encode"), run(from_npz, "encode")
    assert list(a.steps) == list(b.steps)
    assert all(np.array_equal(a.value(p), b.value(p)) for p in a.steps)


@pytest.mark.parametrize(
    "options",
    [
        dict(norm_first=True, activation="gelu", layer_norm_eps=1e-3, nhead=4),
        dict(norm_first=False, activation="gelu", layer_norm_eps=0.25, nhead=1),
        dict(norm_first=True, activation="relu", layer_norm_eps=1e-6, nhead=2),
    ],
    ids=["pre-gelu", "post-gelu", "pre-relu"],
)
@torch.no_grad()
def test_the_readme_recipe_converts_any_encoder_layer(
    options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `to_config` on other layers (torch's own initialisation, biases and
    norms made non-trivial): every head's weights and the output as torch computes them."""
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(readme_recipe(), "README.md", "exec"), scope)  # our own README
    torch.manual_seed(1)
    d_model, L = 8, 5
    layer = nn.TransformerEncoderLayer(
        d_model, dim_feedforward=12, dropout=0.0, batch_first=True, dtype=F64, **options
    ).eval()
    for name, p in layer.named_parameters():
        if name.endswith("bias") or name.startswith("norm"):
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(L, d_model, dtype=F64)
    raw = scope["to_config"](layer, x)
    cfg = config_from(raw)
    assert isinstance(cfg, Config) and cfg.drawn == ()
    trace = run(cfg, "encode")
    query = trace.value("encoder.0.self_attn.norm") if options["norm_first"] else x.numpy()
    check_heads(layer.self_attn, trace, "encoder.0.self_attn", query, query, None, None)
    close(layer(x[None])[0], trace.value("encoder.output"), "encoder.output")
