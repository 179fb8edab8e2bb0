"""YAML config -> validated, frozen model description and weights (SPEC section 2).

Every check happens here, at load time, with the key path (and line) in the
message; the engine downstream never meets bad input. Weights the file does not
give are drawn, each from its own generator seeded by `model.seed` and the
array's key path, so giving one weight never changes another drawn one.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from trace_tf.errors import InputError, InputNote, quoted, suggest
from trace_tf.loader import (
    Lines,
    beyond_float64,
    example_names,
    examples_dir,
    join,
    parse_yaml,
    read_npz,
    read_number,
    read_stream,
    read_text,
)
from trace_tf.ops import RopeScaling
from trace_tf.text import Typed, counted, exact, root_text, shape_text, typed, whole_number

DEFAULT_MAX_ELEMENTS = 2**28
# The weights of a K/V head: under grouped-query attention, in `kv_heads` (or fused
# n_kv_heads heads wide), shared by the query heads of its group.
KV_KEYS = ("W_k", "W_v", "b_k", "b_v")
# A block's QK-norm weights (model.qk_norm), each {gamma, beta} of d_k, shared by its heads
QK_KEYS = ("q_norm", "k_norm")

MODEL_KEYS = [
    "d_model",
    "n_heads",
    "n_kv_heads",
    "d_k",
    "d_v",
    "d_ff",
    "encoder_layers",
    "decoder_layers",
    "positional",
    "pe_base",
    "rope_pairs",
    "rope_scaling",
    "rope_dims",
    "alibi_slopes",
    "max_len",
    "token_types",
    "embed_scale",
    "norm_position",
    "parallel",
    "final_norm",
    "embed_norm",
    "norm",
    "norm_eps",
    "qk_norm",
    "activation",
    "scale",
    "temperature",
    "score",
    "d_a",
    "seed",
    "init_std",
    "tie_embeddings",
    "dtype",
    "window",
    "attn_softcap",
    "logit_softcap",
    "logit_scale",
    "attn_sinks",
    "experts",
    "experts_top_k",
    "experts_normalize",
    "shared_expert",
    "shared_expert_d_ff",
    "swiglu_limit",
    "swiglu_alpha",
]
TOP_KEYS = [
    "title",
    "reference",
    "model",
    "vocab",
    "tokens",
    "embeddings",
    "source",
    "source_types",
    "target",
    "target_types",
    "weights",
    "weights_file",
    "expect",
    "variants",
    "attention",
    "norm",
    "pe",
]
EXPECT_KEYS = ("step", "value", "atol", "rtol", "note", "variant", "document", "document_atol")
OP_KINDS = ("attention", "norm", "pe")
# The command that runs each single operation (also step, explain, check, diff)
OP_COMMANDS = {"attention": "attend", "norm": "norm", "pe": "pe"}
POSITIONAL = ("sinusoidal", "learned", "relative", "alibi", "rope", "none")
# RoPE's pairings, each with the columns of its pair i as formulas and the header write
# them: (2i, 2i+1) (RoFormer, lecture 000) or (i, i + d_k/2) (GPT-NeoX, LLaMA, Hugging
# Face's rotate_half); pair i turns by pos · base^(−2i/d_k) in both (ops.rope_pairs)
ROPE_PAIRS = {"adjacent": "(2i, 2i+1)", "halves": "(i, i+d_k/2)"}
# model.rope_scaling (ops.RopeScaling): each type, the keys it needs, and those it may have
ROPE_SCALINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_len"), ()),
    "yarn": (
        ("factor", "original_max_len"),
        ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    ),
}
ROPE_SCALING_KEYS = ("type", *dict.fromkeys(k for a, b in ROPE_SCALINGS.values() for k in a + b))
# Hugging Face's rope types trace-tf does not compute, and why
NO_ROPE_SCALING = {
    "default": "is no scaling: leave model.rope_scaling out (or null)",
    "dynamic": "(dynamic NTK) recomputes the frequencies from the sequence length at each "
    "step, so a token's angles change as the text grows: not supported",
    "longrope": "(Phi-3) is not supported",
    "proportional": "is not supported",
}
# Hugging Face's names for keys trace-tf names otherwise, by the key path they would take
# (`*` any parent: model.rope_scaling, pe.rope_scaling), and what to say instead of a
# spelling suggestion: rope_parameters' keys, token types' (BertConfig, BertModel's forward)
HF_KEYS = {
    "*.rope_scaling.rope_type": "Hugging Face's name in rope_parameters; trace-tf's is type",
    "*.rope_scaling.original_max_position_embeddings": "Hugging Face's name in "
    "rope_parameters; trace-tf's is original_max_len (as max_len is max_position_embeddings)",
    "model.rope_scaling.rope_theta": "Hugging Face's name in rope_parameters; trace-tf's "
    "is model.pe_base",
    "pe.rope_scaling.rope_theta": "Hugging Face's name in rope_parameters; trace-tf's is pe.base",
    "model.rope_scaling.partial_rotary_factor": "Hugging Face's name in rope_parameters; "
    "trace-tf's is model.rope_dims, the columns turned per head: int(head_dim · "
    "partial_rotary_factor)",
    "pe.rope_scaling.partial_rotary_factor": "Hugging Face's name in rope_parameters; "
    "trace-tf's is pe.rope_dims, the columns turned: int(d_model · partial_rotary_factor)",
    "model.type_vocab_size": "Hugging Face's name; trace-tf's is model.token_types",
    "token_type_ids": "Hugging Face's name; trace-tf's are source_types and target_types",
    "weights.token_type_embeddings": "Hugging Face's name; trace-tf's is weights.token_types",
}
# The positionals whose table ends at max_len: learned rows, relative offsets ±(max_len − 1).
# Each says what max_len counts: positions (relative: max_len positions, 2·max_len − 1 offsets).
BOUNDED_POSITIONAL = {
    "learned": "learned positions",
    "relative": "positions the relative bias reaches",
}
NORM_KINDS = ("layer", "rms")
# model.parallel: a layer's sublayers in sequence (none, the paper's), or side by side on
# the same input, x + attn(Norm(x)) + ffn(Norm(x)): with a norm each (separate: GPT-NeoX's
# use_parallel_residual) or one both read (shared: GPT-J, Phi-1/2, Falcon)
PARALLEL = ("none", "separate", "shared")
# model.qk_norm (QK-norm: Qwen3, Gemma 3): none, or `head`, each head's Q_raw and each K/V
# head's K_raw normalised over its d_k columns (model.norm's kind, model.norm_eps) before
# RoPE, with one γ and β of d_k per attention block shared by its heads (q_norm, k_norm);
# or `projection` (OLMo 2): the whole Q_raw = X W_q over its n_heads·d_k columns and K_raw
# over its n_kv_heads·d_k, before the split into heads, γ and β of that many entries
QK_NORMS = ("none", "head", "projection")
# model.norm_position: where each sublayer's norm sits (model.add_and_norm). post, the
# paper's: Norm(x + F(x)); pre: x + F(Norm(x)); sandwich (Gemma 2, 3): x +
# Norm_post(F(Norm(x))), a second norm, post_norm, on the sublayer's output; output (OLMo 2's
# reordered norm): x + Norm(F(x)), the one norm on the output, none on the input
NORM_POSITIONS = ("post", "pre", "sandwich", "output")
# The score functions of a dot product of a query and a key, which QK-norm bounds
QK_NORM_SCORES = ("scaled_dot", "dot", "bilinear")
# ... and which model.attn_softcap caps: additive's v_aᵀ tanh(…) is bounded already and
# gaussian's −½ Σ ((q − k) w)² is never positive, and no model caps them
SOFTCAP_SCORES = QK_NORM_SCORES
SOFTCAPS = ("attn_softcap", "logit_softcap")  # model's soft caps, c · tanh(s / c)
# ... and beside which model.attn_sinks puts a learned sink logit in each softmax row: a
# logit on the scale of the scaled dot products (GPT-OSS); none is settled for the others
SINK_SCORES = QK_NORM_SCORES
# A per-head weight's fused form under another name: a head's `sink` is entry h of `sinks`
FUSED_NAMES = {"sink": "sinks"}
DTYPES = ("float64", "float32")
SHARED_EXPERTS = ("none", "gated", "plain")  # model.shared_expert
# Attention score functions (003, 004) and the per-head weights each one reads.
SCORES = ("scaled_dot", "dot", "additive", "bilinear", "gaussian")
SCORE_WEIGHTS: dict[str, tuple[str, ...]] = {
    "scaled_dot": (),
    "dot": (),
    "additive": ("W_a_q", "W_a_k", "v_a"),
    "bilinear": ("W_b",),
    "gaussian": ("w",),
}
ALL_SCORE_WEIGHTS = ("W_a_q", "W_a_k", "v_a", "W_b", "w")
ACTIVATIONS = (
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "swiglu",
    "geglu",
    "geglu_tanh",
    "swiglu_oss",
)
# The gated feed-forward networks (Shazeer 2020) and the activation of their gate:
# (act(X W_1 + b_1) ⊙ (X W_3 + b_3)) W_2 + b_2.
# geglu_tanh: GeGLU with the tanh approximation of GELU (Gemma's gelu_pytorch_tanh).
# swiglu_oss: GPT-OSS's clamped SwiGLU, ((clamp(U, ±limit) + 1) ⊙ G σ(α G)) W_2 + b_2 with
# G = min(X W_1 + b_1, limit): its gate's activation is Swish with gain α (swish_alpha).
GATES = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "swiglu_oss": "swish_alpha"}
# GPT-OSS's defaults for swiglu_oss (transformers' GptOssConfig swiglu_limit, swiglu_alpha)
SWIGLU_OSS_DEFAULTS = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}


# ---------------------------------------------------------------------------
# The validated description
# ---------------------------------------------------------------------------
# Frozen: nothing changes a config once it is validated. eq=False where a class
# holds arrays, whose == is elementwise: two such are the same only if identical.


@dataclass(frozen=True)
class ModelConfig:
    """The `model:` section with every default filled in."""

    d_model: int
    n_heads: int = 1
    # grouped-query attention: query head h reads K/V head h // (n_heads / n_kv_heads);
    # 0 (not given) is n_heads, one K/V head per query head (multi-head attention)
    n_kv_heads: int = 0
    d_k: int = 0
    d_v: int = 0
    d_ff: int = 0
    encoder_layers: int = 1
    decoder_layers: int = 0
    positional: str = "sinusoidal"
    # the base of the sinusoidal and RoPE frequencies; with lists of bases or scalings
    # (layer_pe_bases), decoder layer 0's: each layer's is layer_rope(l).pe_base
    pe_base: float = 10000.0
    rope_pairs: str = "adjacent"  # rope: which columns turn together (ROPE_PAIRS)
    rope_scaling: RopeScaling | None = None  # rope: its frequencies rescaled (None: as they are)
    # model.pe_base and model.rope_scaling as lists (Gemma 3's local and global RoPE): each
    # decoder layer's base (None: no RoPE in that layer, Cohere 2's full layers) and scaling
    # (None: unscaled), both one a layer; () when one base and one scaling serve every layer
    # (a list of equal entries too: it is that value)
    layer_pe_bases: tuple[float | None, ...] = ()
    layer_rope_scalings: tuple[RopeScaling | None, ...] = ()
    # rope: the first rope_dims columns of each head turn (partial rotary, GPT-NeoX's
    # rotary_ndims), their frequencies over rope_dims; 0 (not given) is all d_k
    rope_dims: int = 0
    # alibi: each head's slope as given (a model's own: BLOOM's float32 ones, MPT's
    # alibi_bias_max); None: the paper's rule, ops.alibi_slopes
    alibi_slopes: tuple[float, ...] | None = None
    max_len: int = 128
    # rows of the token-type table (BERT's segments, type_vocab_size); 0: no token types
    token_types: int = 0
    embed_scale: float = 1.0
    embed_scale_text: str = "1"  # as written, for the conventions header
    norm_position: str = "post"  # NORM_POSITIONS
    parallel: str = "none"  # the layer's attention and FFN in sequence or side by side (PARALLEL)
    final_norm: bool = False
    embed_norm: bool = False  # the norm of E·scale + PE before layer 0 (BERT, BLOOM)
    norm: str = "layer"
    norm_eps: float = 1e-5
    # QK_NORMS: the queries and keys normalised (per head, or whole) before RoPE
    qk_norm: str = "none"
    activation: str = "relu"
    scale: float = 1.0
    scale_text: str = "sqrt_dk"
    temperature: float = 1.0  # divides the scaled scores inside the softmax only
    score: str = "scaled_dot"  # the attention score function (SCORES)
    d_a: int = 0  # hidden size of the additive score (default d_k)
    seed: int = 0
    init_std: float = 1.0
    tie_embeddings: bool = False
    dtype: str = "float64"  # of every weight and computation; float32 halves memory, ~7 digits
    # sliding-window attention (Mistral): a decoder self-attention query at position i
    # sees only the `window` keys i − window < j <= i; 0 (not given) is unlimited; with a
    # list (layer_windows), the window every decoder layer shares, else 0
    window: int = 0
    # model.window as a list (Gemma 2's alternating layers): each decoder layer's window,
    # 0 for full attention; () when model.window is one number (or null) for every layer
    layer_windows: tuple[int, ...] = ()
    # soft caps (Gemma 2, Grok-1), s ↦ c · tanh(s / c), None off: attn_softcap of each
    # head's scaled scores, before a position bias and the mask; logit_softcap of the logits
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    # the logits multiplied by a number (Cohere's logit_scale), s · (out W + b), None off;
    # with logit_softcap too, the scaled logits are capped: c · tanh(s · logits_raw / c)
    logit_scale: float | None = None
    # attention sinks (GPT-OSS): each self-attention head's learned logit s_h joins every
    # softmax row's denominator and is dropped, A[i,j] = e^S[i,j] / (Σ_k e^S[i,k] + e^s_h)
    attn_sinks: bool = False
    # a mixture of experts (Mixtral): each FFN is `experts` expert FFNs and a router that
    # sends each token to the experts_top_k of largest probability, their probabilities
    # renormalised to sum to 1 when experts_normalize; 0 (not given): one dense FFN; with
    # a list (layer_experts), the most any decoder layer has (use experts_of for a layer's)
    experts: int = 0
    # model.experts as a list (Qwen-MoE's mlp_only_layers): each decoder layer's experts,
    # 0 for a dense FFN; () when model.experts is one number (or null, or a list of equal
    # entries) for every layer
    layer_experts: tuple[int, ...] = ()
    experts_top_k: int = 0
    experts_normalize: bool = True
    # a shared expert beside the routed ones (Qwen2-MoE, DeepSeek): an FFN of width
    # shared_expert_d_ff every token goes through, added to the routed sum, "gated" by
    # σ(X w_g) (Qwen2-MoE's shared_expert_gate) or "plain" (DeepSeek's); "none" without
    shared_expert: str = "none"
    shared_expert_d_ff: int = 0
    # activation swiglu_oss (GPT-OSS): the gate clamped above at swiglu_limit and the up
    # projection to ±swiglu_limit, the gate's Swish gain swiglu_alpha; else unused (0)
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 0.0

    def __post_init__(self) -> None:
        if not self.n_kv_heads:
            object.__setattr__(self, "n_kv_heads", self.n_heads)

    @property
    def rotary_dims(self) -> int:
        """The columns of each head RoPE turns: rope_dims, or every one of d_k."""
        return self.rope_dims or self.d_k

    @property
    def group(self) -> int:
        """Query heads per K/V head: 1 for multi-head attention, n_heads for multi-query."""
        return self.n_heads // self.n_kv_heads

    @property
    def grouped(self) -> bool:
        """Grouped-query attention: fewer K/V heads than query heads, each shared."""
        return self.n_kv_heads < self.n_heads

    @property
    def qk_norm_width(self) -> tuple[int, int]:
        """The entries q_norm's and k_norm's γ and β have: d_k each per head (qk_norm head),
        n_heads·d_k and n_kv_heads·d_k over the whole projection (projection)."""
        if self.qk_norm == "projection":
            return self.n_heads * self.d_k, self.n_kv_heads * self.d_k
        return self.d_k, self.d_k

    def kv_head(self, h: int) -> int:
        """The K/V head query head h reads (Hugging Face's repeat_kv)."""
        return h // self.group

    def window_of(self, layer: int) -> int:
        """Decoder layer `layer`'s sliding window (0: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else self.window

    @property
    def mixed_rope(self) -> bool:
        """Whether model.pe_base's or model.rope_scaling's list gives the decoder layers
        different RoPEs (each layer then turns q and k by its own)."""
        return bool(self.layer_pe_bases)

    def layer_rope(self, layer: int) -> ModelConfig:
        """The model as decoder layer `layer` computes it: its own RoPE base and scaling in
        pe_base and rope_scaling (the model itself when every layer has the same); a layer
        without RoPE (a null base) as a model of positional none, its q and k unturned."""
        if not self.mixed_rope:
            return self
        base, scaling = self.layer_pe_bases[layer], self.layer_rope_scalings[layer]
        if base is None:
            return replace(self, positional="none", rope_scaling=None)
        return replace(self, pe_base=base, rope_scaling=scaling)

    def layer_turns(self, layer: int) -> bool:
        """Whether decoder layer `layer`'s self-attention turns q and k by RoPE."""
        return self.positional == "rope" and (
            not self.mixed_rope or self.layer_pe_bases[layer] is not None
        )

    @property
    def nope_layers(self) -> tuple[int, ...]:
        """The decoder layers without RoPE in a RoPE model (model.pe_base's null entries)."""
        return tuple(l for l, base in enumerate(self.layer_pe_bases) if base is None)

    def experts_of(self, layer: int) -> int:
        """Layer `layer`'s number of experts (0: a dense FFN); an encoder layer's is
        model.experts (a list is for a decoder-only model)."""
        return self.layer_experts[layer] if self.layer_experts else self.experts

    def experts_at(self, path: str) -> int:
        """The experts of the FFN a step's `path` is under (`decoder.1.ffn.out`, and under
        generate's iteration prefix `t2.decoder.1.ffn.out`: layer 1's)."""
        layer = decoder_layer_of(path)
        return self.experts_of(layer) if layer is not None else self.experts

    @property
    def mixed_windows(self) -> bool:
        """Whether model.window's list gives the decoder layers different windows (each
        sliding layer then has a mask of its own)."""
        return len(set(self.layer_windows)) > 1

    @property
    def gated(self) -> bool:
        """Whether the FFN is gated (swiglu, geglu, geglu_tanh): it then has an up projection W_3."""
        return self.activation in GATES

    @property
    def act(self) -> str:
        """The activation applied to H = X W_1 + b_1 (a gated FFN's gate: silu, gelu or gelu_tanh)."""
        return GATES.get(self.activation, self.activation)


def decoder_layer_of(path: str) -> int | None:
    """The decoder layer a step's `path` is under (`decoder.1.ffn.out`, and under generate's
    prefixes `t2.decoder.1.ffn.out`, `t4.b2.decoder.1...`: 1), None outside the layers."""
    found = re.search(r"(?:^|\.)decoder\.(\d+)\.", path)
    return int(found.group(1)) if found else None


@dataclass(frozen=True, eq=False)
class NormWeights:
    gamma: np.ndarray  # [d_model]
    beta: np.ndarray  # [d_model]


@dataclass(frozen=True, eq=False)
class ScoreWeights:
    """The weights of a score function other than the dot product (only its own are set)."""

    W_a_q: np.ndarray | None = None  # additive: [d_k, d_a], applied as q W_a_q
    W_a_k: np.ndarray | None = None  # additive: [d_k, d_a], applied as k W_a_k
    v_a: np.ndarray | None = None  # additive: [d_a]
    W_b: np.ndarray | None = None  # bilinear: [d_k, d_k], q W_b kᵀ
    w: np.ndarray | None = None  # gaussian: a number (0-d) or one width per feature [d_k]

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights that are set, by key."""
        return {k: getattr(self, k) for k in ALL_SCORE_WEIGHTS if getattr(self, k) is not None}


@dataclass(frozen=True, eq=False)
class HeadWeights:
    W_q: np.ndarray  # [d_model, d_k]
    W_k: np.ndarray  # [d_model, d_k]
    W_v: np.ndarray  # [d_model, d_v]
    b_q: np.ndarray | None = None  # [d_k]
    b_k: np.ndarray | None = None  # [d_k]
    b_v: np.ndarray | None = None  # [d_v]
    score: ScoreWeights = field(default_factory=ScoreWeights)
    # positional relative, self-attention: the bias of each offset j − i, −(max_len − 1)..
    rel_bias: np.ndarray | None = None  # [2·max_len − 1]
    # model.attn_sinks, self-attention: the head's sink logit s_h, a number (0-d)
    sink: np.ndarray | None = None
    # model.qk_norm: the block's QK-norm weights (head: γ, β of d_k; projection: of
    # n_heads·d_k and n_kv_heads·d_k), the same objects in every head of the block (one norm
    # shared by its heads, as Qwen3's q_norm, k_norm; OLMo 2's over the whole projection)
    q_norm: NormWeights | None = None
    k_norm: NormWeights | None = None


@dataclass(frozen=True, eq=False)
class AttentionWeights:
    heads: tuple[HeadWeights, ...]
    W_o: np.ndarray  # [H * d_v, d_model]
    b_o: np.ndarray | None
    norm: NormWeights
    # model.norm_position sandwich: the norm of the sublayer's output (Gemma 2's
    # post_attention_layernorm); None in the other placements
    post_norm: NormWeights | None = None


@dataclass(frozen=True, eq=False)
class FFNWeights:
    W_1: np.ndarray  # [d_model, d_ff]; a gated FFN's gate projection
    b_1: np.ndarray | None  # [d_ff]
    W_2: np.ndarray  # [d_ff, d_model]
    b_2: np.ndarray | None  # [d_model]
    norm: NormWeights
    W_3: np.ndarray | None = None  # [d_model, d_ff]: a gated FFN's up projection only
    b_3: np.ndarray | None = None  # [d_ff]
    post_norm: NormWeights | None = None  # sandwich: Gemma 2's post_feedforward_layernorm


@dataclass(frozen=True, eq=False)
class MoEWeights:
    """A mixture-of-experts FFN (model.experts): the router and each expert's FFN, whose
    `norm` is this block's (one norm before the router, not one per expert)."""

    router: np.ndarray  # [d_model, E]: the router's logits are X W_r + b_r
    experts: tuple[FFNWeights, ...]
    norm: NormWeights
    post_norm: NormWeights | None = None
    router_bias: np.ndarray | None = None  # [E]: b_r (GPT-OSS's router has one)
    shared: FFNWeights | None = None  # model.shared_expert: the FFN every token goes through
    shared_gate: np.ndarray | None = None  # [d_model, 1]: w_g of its gate σ(X w_g) (gated)

    def arrays(self) -> dict[str, np.ndarray]:
        """The router and each expert's weights that are set, by their key below the FFN."""
        out = {"router": self.router}
        if self.router_bias is not None:
            out["router_bias"] = self.router_bias
        for e, fw in enumerate(self.experts):
            out |= {f"experts.{e}.{k}": v for k, v in ffn_arrays(fw).items()}
        if self.shared is not None:
            out |= {f"shared.{k}": v for k, v in ffn_arrays(self.shared).items()}
        if self.shared_gate is not None:
            out["shared_gate"] = self.shared_gate
        return out


def ffn_arrays(fw: FFNWeights) -> dict[str, np.ndarray]:
    """A dense FFN's weights that are set, by key (W_1, b_1, W_3, b_3, W_2, b_2)."""
    keys = ("W_1", "b_1", "W_3", "b_3", "W_2", "b_2")
    return {k: getattr(fw, k) for k in keys if getattr(fw, k) is not None}


@dataclass(frozen=True, eq=False)
class LayerWeights:
    self_attn: AttentionWeights
    ffn: FFNWeights | MoEWeights
    cross_attn: AttentionWeights | None = None  # decoder layers of an encoder-decoder only


@dataclass(frozen=True, eq=False)
class Sequence_:
    """An input sequence: tokens (looked up) or a numeric matrix used as the embeddings."""

    tokens: tuple[str, ...] | None
    matrix: np.ndarray | None = None  # [L, d_model], when given as numbers
    # each position's token type (source_types, target_types), with model.token_types
    types: tuple[int, ...] | None = None
    types_given: bool = False  # the config gave them (else every type is 0)

    @property
    def labels(self) -> tuple[str, ...]:
        if self.tokens is not None:
            return self.tokens
        assert self.matrix is not None
        return tuple(f"x{i}" for i in range(self.matrix.shape[0]))

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class Expect:
    """One `expect` entry: the step at `value` within atol + rtol * |value| per cell.
    `document` is what the tutorial prints where it is wrong by its own formula (it
    must then differ from the result by more than `document_atol` somewhere)."""

    step: str
    value: np.ndarray
    atol: float
    note: str
    variant: str | None
    line: int | None
    rtol: float = 0.0
    document: np.ndarray | None = None
    document_atol: float = 0.0


@dataclass(frozen=True)
class Tokens:
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None


TIED_OUTPUT = "embeddings (tied, transposed)"  # the output weight with tie_embeddings, as named


@dataclass(frozen=True)
class Source:
    """Where the numbers of one array handed to the engine came from, said once for
    `explain`, `step` and `weights`. `kind` is one of:

    - file: typed in the config (`file`, `line`)
    - npz: an array of the config's weights_file (`file`, `array`)
    - set: a --set or a command's option (`by`: '--set', or '--set KEY' for a key above)
    - variant: a variant of the file (`by`: "variant 'name'"; `file` and `line`)
    - drawn: SPEC section 2's rule, `default_rng([seed, crc32(draw_path)])` × init_std
    - default: γ ones, β zeros
    - fused: head h's columns (entries, row) `part` of the fused weight `fused`
    - tied: the output weight, the embeddings transposed (`file`, `line`, `by`: where
      model.tie_embeddings was set)"""

    kind: str
    text: str  # short, for a reader: "hello.yaml line 41", "drawn: seed 0, N(0, 1²)"
    file: str | None = None
    line: int | None = None
    array: str | None = None
    by: str | None = None
    seed: int | None = None
    init_std: float | None = None
    draw_path: str | None = None
    fused: str | None = None
    part: str | None = None
    # fused: where the fused weight came from, said of this part (with only the entries
    # set inside it); `text` says it after the part, explain after the head's columns
    fused_text: str | None = field(default=None, metadata={"json": False})
    # overrides that set entries inside a weight given whole elsewhere
    partly: tuple[str, ...] = ()

    def json(self) -> dict[str, Any]:
        """The fields that are set (JSON: `explain`'s and `weights`' "sources")."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("json", True)}
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in out.items() if v not in (None, ())
        }


@dataclass(frozen=True, eq=False)
class Config:
    """A whole model: its description, every weight, and the inputs to run."""

    file: str
    title: str
    reference: str
    model: ModelConfig
    vocab: tuple[str, ...]
    tokens: Tokens
    embeddings: Mapping[str, np.ndarray]  # token -> [d_model]
    source: Sequence_ | None
    target: Sequence_ | None
    encoder: tuple[LayerWeights, ...]
    decoder: tuple[LayerWeights, ...]
    encoder_final_norm: NormWeights | None
    decoder_final_norm: NormWeights | None
    encoder_embed_norm: NormWeights | None  # with model.embed_norm
    decoder_embed_norm: NormWeights | None
    positional: np.ndarray | None  # [max_len, d_model] when learned
    token_types: np.ndarray | None  # [model.token_types, d_model] with token types
    output_W: np.ndarray | None  # [d_model, vocab]
    output_b: np.ndarray | None  # [vocab]
    expect: tuple[Expect, ...] = ()
    drawn: tuple[str, ...] = ()  # key paths of the arrays drawn rather than given
    # key paths (below `weights`) of projections given fused, every head's side by side
    # (`encoder.0.self_attn.W_q`); the model reads each head's columns as its own
    given_fused: tuple[str, ...] = ()
    variant: str | None = None
    overrides: tuple[str, ...] = ()
    weights_file: str | None = None  # the .npz the weights came from, and how many
    weights_file_arrays: int = 0
    # where each array came from, by the names of `named_arrays` (the fused weights a
    # head's part was cut from, TIED_OUTPUT, and numeric source/target as well)
    sources: Mapping[str, Source] = field(default_factory=dict)
    # given numbers stored with fewer digits: their warning is shown with the run's own
    lows: tuple[Low, ...] = ()

    @property
    def notes(self) -> tuple[InputNote, ...]:
        """The warning of the given numbers stored with fewer digits (notes_of)."""
        return notes_of(self.lows)

    @property
    def embedding_matrix(self) -> np.ndarray:
        """The vocabulary's embeddings as rows, in vocabulary order. [V, d_model]"""
        return np.stack([self.embeddings[t] for t in self.vocab])

    def named_arrays(self) -> dict[str, np.ndarray]:
        """Every weight under its key path, so traced steps can name their inputs."""
        out: dict[str, np.ndarray] = {}
        for tok, vec in self.embeddings.items():
            out[f"embeddings.{tok}"] = vec
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for l, layer in enumerate(layers):
                for block in ("self_attn", "cross_attn"):
                    aw: AttentionWeights | None = getattr(layer, block)
                    if aw is None:
                        continue
                    base = f"weights.{stack}.{l}.{block}"
                    kv_keys = KV_KEYS if self.model.grouped else ()
                    for h, hw in enumerate(aw.heads):
                        for k in ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v", "rel_bias", "sink"):
                            if getattr(hw, k) is not None and k not in kv_keys:
                                out[f"{base}.heads.{h}.{k}"] = getattr(hw, k)
                        for k, arr in hw.score.arrays().items():
                            out[f"{base}.heads.{h}.{k}"] = arr
                    for j in range(self.model.n_kv_heads if kv_keys else 0):
                        hw = aw.heads[j * self.model.group]  # K/V head j's first query head
                        for k in kv_keys:
                            if getattr(hw, k) is not None:
                                out[f"{base}.kv_heads.{j}.{k}"] = getattr(hw, k)
                    for name in QK_KEYS:  # QK-norm: the block's, shared by its heads
                        qk: NormWeights | None = getattr(aw.heads[0], name)
                        if qk is not None:
                            out[f"{base}.{name}.gamma"] = qk.gamma
                            out[f"{base}.{name}.beta"] = qk.beta
                    out[f"{base}.W_o"] = aw.W_o
                    if aw.b_o is not None:
                        out[f"{base}.b_o"] = aw.b_o
                    out[f"{base}.norm.gamma"] = aw.norm.gamma
                    out[f"{base}.norm.beta"] = aw.norm.beta
                    if aw.post_norm is not None:
                        out[f"{base}.post_norm.gamma"] = aw.post_norm.gamma
                        out[f"{base}.post_norm.beta"] = aw.post_norm.beta
                base = f"weights.{stack}.{l}.ffn"
                f = layer.ffn
                own = f.arrays() if isinstance(f, MoEWeights) else ffn_arrays(f)
                out |= {f"{base}.{k}": v for k, v in own.items()}
                if self.model.parallel != "shared":  # (else it is self_attn.norm)
                    out[f"{base}.norm.gamma"] = f.norm.gamma
                    out[f"{base}.norm.beta"] = f.norm.beta
                if f.post_norm is not None:
                    out[f"{base}.post_norm.gamma"] = f.post_norm.gamma
                    out[f"{base}.post_norm.beta"] = f.post_norm.beta
        for name in (
            "encoder_final_norm",
            "decoder_final_norm",
            "encoder_embed_norm",
            "decoder_embed_norm",
        ):
            nw: NormWeights | None = getattr(self, name)
            if nw is not None:
                out[f"weights.{name}.gamma"] = nw.gamma
                out[f"weights.{name}.beta"] = nw.beta
        if self.positional is not None:
            out["weights.positional"] = self.positional
        if self.token_types is not None:
            out["weights.token_types"] = self.token_types
        if self.output_W is not None:
            out["weights.output.W"] = self.output_W
        if self.output_b is not None:
            out["weights.output.b"] = self.output_b
        return out


@dataclass(frozen=True, eq=False)
class OpConfig:
    """A single-operation file for the calculator commands (attention, norm, pe)."""

    file: str
    title: str
    reference: str
    kind: str  # attention | norm | pe
    params: Mapping[str, Any]
    expect: tuple[Expect, ...] = ()
    variant: str | None = None
    # given numbers stored with fewer digits, as Config.lows
    lows: tuple[Low, ...] = ()

    @property
    def notes(self) -> tuple[InputNote, ...]:
        """The warning of the given numbers stored with fewer digits (notes_of)."""
        return notes_of(self.lows)


# ---------------------------------------------------------------------------
# Reading a document (raw data + lines), overrides and variants
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """What set an overridden key: `by` as a message names it ('--set', '--q', "variant
    'pre'"), and for a variant the key path in the file where the value is written."""

    by: str
    at: str | None = None
    pads: str | None = None  # an empty entry added for this key, past a list's end
    array: str | None = None  # the array of a weights_file (`by`) that gave this key
    parts: tuple[str, ...] = ()  # the key's parts (a token below embeddings may hold dots)
    made: str | None = None  # the array this key, an entry of it, made where none was

    def named(self, key: str) -> str:
        """What set `key`, as a message names it: a KEY=VALUE option with the key it
        set ('--set weights.encoder.0.ffn.W_1.0.1'), else the option, variant or file."""
        return self.by + (f" {key}" if self.by in ("--set", "--set-b") else "")


@dataclass
class Document:
    """A config file as read: plain data, where each key was, and what was overridden."""

    file: str
    data: dict[str, Any]
    lines: Lines
    overridden: list[str] = field(default_factory=list)  # keys set over the file, in order
    origins: dict[str, Origin] = field(default_factory=dict)  # key -> what set it last
    base: Path | None = None  # the file's directory (None: the current directory)
    # arrays of the weights_file that overrides set entries of, by key path: the entries
    # are written over a copy (the array may be shared, or the npz's own buffer)
    bases: dict[str, Any] = field(default_factory=dict)
    # the tokens holding dots of the vocab the overrides leave, and of the embeddings of
    # the weights_file: a key below embeddings is read against them too, so that the
    # overrides' order does not matter, nor whether the YAML lists the tokens
    tokens: frozenset[str] = frozenset()


def resolve(name: str | None) -> Path:
    """A config path, or the packaged example of that name (default: hello)."""
    if name is None:
        return examples_dir() / "hello.yaml"
    if not name.strip():  # Path("") is ".", the current directory
        raise InputError(
            "an empty config name",
            expected="a config file path, a packaged example's name, or - for stdin",
            found=quoted(name),
        )
    path = Path(name)
    # A file (or link) of that name wins over the example: `hello` in the current
    # directory is that file. (os.path.lexists: False, not an OSError, for a name too
    # long to be a file's; True for a broken or looping link, which reading then reports)
    if os.path.lexists(path):
        return path
    if any(c in name for c in "/\\") or name.endswith((".yaml", ".yml")):
        if path.suffix in (".yaml", ".yml") and path.stem in example_names():
            # `fixtures/002_database_query.yaml` where there is no clone
            raise InputError(
                f"no such file (the packaged example of that name is {path.stem!r}, "
                "given without a directory or .yaml)",
                file=name,
            )
        return path
    packaged = examples_dir() / f"{name}.yaml"
    if os.path.exists(packaged):
        return packaged
    raise InputError(
        "no such file or packaged example" + suggest(name, example_names()),
        file=name,
        expected="a config file path or a packaged example's name (trace-tf examples lists them)",
        found=quoted(name),
    )


STDIN = "-"  # the config name that reads the config from standard input


def read_document(name: str | None, *, example: bool = False) -> Document:
    """The config `name` names (see resolve), or with `example` the packaged example of
    that name, whatever the current directory holds (`check --examples`)."""
    if name == STDIN:
        file, base = "<stdin>", None
        if sys.stdin is None:  # `trace-tf encode - <&-`: Python leaves it None
            raise InputError(
                "standard input is closed",
                file=file,
                expected="a config on standard input",
                found="no standard input",
            )
        if sys.stdin.closed:  # `check - -`: the first - read it to its end
            raise InputError("standard input is read once; give - once", file=file)
        text = read_stream(sys.stdin.buffer, file)
        sys.stdin.close()
    else:
        path = examples_dir() / f"{name}.yaml" if example else resolve(name)
        # a packaged example is named by its name, not by where the package is installed
        packaged = example or name is None or path != Path(name)
        file = f"{path.stem} (packaged example)" if packaged else str(path)
        if not packaged and name in example_names():
            # the file `hello` in the current directory wins over the example (resolve);
            # its messages say so, or its error would read as the example's
            file = f"{name} (a file in the current directory, not the packaged example)"
        text = read_text(path)
        base = None if packaged else path.parent
    data, lines = parse_yaml(text, file)
    if data is None:
        raise InputError("the config is empty", file=file, expected="a YAML mapping")
    if not isinstance(data, dict):
        raise InputError(
            "the config must be a mapping of keys",
            file=file,
            expected="a mapping (model:, vocab:, source:, ... or one operation)",
            found=_kind(data),
        )
    return Document(file=file, data=data, lines=lines, base=base)


def parse_set(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` from --set, the value read as YAML."""
    key, sep, text = item.partition("=")
    key = key.strip()
    # (a token below `embeddings` may be "." or hold dots: apply_override reads it)
    parts = [key] if key.startswith("embeddings.") else key.split(".")
    if not sep or not key or any(not part for part in parts):
        raise InputError(
            "malformed --set",
            path=None,
            expected="KEY=VALUE with a dotted KEY, e.g. model.scale=30",
            found=quoted(item),
        )
    value, _ = parse_yaml(text, f"--set {key}")
    return key, value


def parse_matrix(text: str, option: str, *, allow_inf: bool = False) -> list[Any]:
    """An inline matrix from the command line: rows separated by `;`, numbers by spaces
    or commas ("1 0 0; 1,2,0"); `|` separates the matrices of a 3-D array. A text
    starting with `[` is read as YAML instead. Ragged rows and non-numbers are refused,
    naming the option."""
    text = text.strip()
    if text.startswith("["):
        value, _ = parse_yaml(text, option)
        return value if isinstance(value, list) else [value]
    blocks = [_parse_rows(block, option, allow_inf) for block in text.split("|")]
    if len(blocks) == 1:
        return blocks[0]
    shapes = {(len(b), len(b[0])) for b in blocks}
    if len(shapes) > 1:
        raise InputError(
            f"{option}: the matrices separated by '|' differ in shape",
            expected="matrices of one shape",
            found=", ".join(f"{r} x {c}" for r, c in ((len(b), len(b[0])) for b in blocks)),
        )
    return blocks


def option_number(
    value: float, option: str, *, positive: bool = False, minimum: float | None = None
) -> float:
    """A number given to a command-line option, checked: typer reads 'nan', 'inf' and
    '1e400' as floats, and a NaN passes every range check (`nan < 0` is false)."""
    bound = " > 0" if positive else f" >= {exact(minimum)}" if minimum is not None else ""
    expected = "a finite number" + bound
    found = typed(within_float64(value, option))
    if not math.isfinite(value):
        raise InputError(f"{option} must be a finite number", expected=expected, found=found)
    if positive and value <= 0:
        raise InputError(f"{option} must be positive", expected=expected, found=found)
    if minimum is not None and value < minimum:
        raise InputError(
            f"{option} must be at least {exact(minimum)}", expected=expected, found=found
        )
    return value


def within_float64(value: float, option: str) -> float:
    """A number given to an option, refused where the user typed one float64 cannot hold
    (1e-400, read as 0; 1e400, read as inf), as the loader refuses it in a file."""
    text = typed(value)
    beyond = beyond_float64(text, value)
    if beyond is not None:
        raise InputError(f"{option}: {beyond[0]}", expected=beyond[1], found=text)
    return value


_NUMBER_SEPARATOR = re.compile(r"\s*,\s*|\s+")  # one comma (spaces around it allowed), or spaces


def _parse_rows(text: str, option: str, allow_inf: bool) -> list[list[float]]:
    rows: list[list[float]] = []
    for r, row_text in enumerate(text.split(";")):
        if not row_text.strip():
            raise InputError(
                f"{option}: row {r} is empty",
                expected="numbers separated by spaces or commas, rows by ';'",
                found=quoted(text),
            )
        cells = _NUMBER_SEPARATOR.split(row_text.strip())
        if "" in cells:  # "1,,0", ",1" or "1,": a number left out, not a shorter row
            raise InputError(
                f"{option}: row {r}: a comma with no number beside it",
                expected="one number between commas",
                found=quoted(row_text.strip()),
            )
        row = []
        for c in cells:
            cell = c.replace("−", "-")  # (a minus sign as typeset)
            # YAML 1.2's numbers, as in the file; and -inf, inf, nan as Python writes them
            x = float(cell) if cell in ("-inf", "inf", "nan") else read_number(cell)
            if x is None:
                raise InputError(
                    f"{option}: row {r}: not a number", expected="a number", found=quoted(c)
                )
            if math.isnan(x) or (math.isinf(x) and not (allow_inf and x < 0)):
                raise InputError(
                    f"{option}: row {r}: not a finite number",
                    expected="a finite number" + (" or -inf" if allow_inf else ""),
                    found=quoted(c),
                )
            beyond = beyond_float64(cell, x)  # (-1e400 and 1e-400: as the file refuses them)
            if beyond is not None:
                raise InputError(
                    f"{option}: row {r}: {beyond[0]}", expected=beyond[1], found=quoted(c)
                )
            row.append(x)
        if rows and len(row) != len(rows[0]):
            raise InputError(
                f"{option}: ragged matrix: row {r} has {counted(len(row), 'number')}, "
                f"row 0 has {len(rows[0])}",
                expected=f"{counted(len(rows[0]), 'number')} in every row",
                found=quoted(row_text.strip()),
            )
        rows.append(row)
    return rows


MAX_SET_PAD = 1024  # entries a --set may add past the end of a list (missing layers are drawn)


def key_parts(doc: Document, key: str) -> list[str]:
    """The parts of a dotted key. A token may hold dots (".", "e.g."): below `embeddings`,
    the longest token of the document's vocab or embeddings that the rest of the key
    is, or begins with before a dot, is one part (`embeddings.e.g..0`: e.g., 0); also a
    token of the vocab that the overrides leave or of the weights_file (Document.tokens)."""
    head, _, rest = key.partition(".")
    if head == "embeddings" and rest:
        vocab, given = doc.data.get("vocab"), doc.data.get("embeddings")
        known = [t for t in vocab if isinstance(t, str)] if isinstance(vocab, list) else []
        known += [t for t in given if isinstance(t, str)] if isinstance(given, dict) else []
        known += doc.tokens
        for token in sorted({t for t in known if "." in t}, key=len, reverse=True):
            if rest == token or (rest.startswith(token + ".") and rest != token + "."):
                tail = rest[len(token) + 1 :]
                return [head, token, *(tail.split(".") if tail else [])]
    return key.split(".")


def apply_override(
    doc: Document, key: str, value: Any, origin: Origin, parts: list[str] | None = None
) -> None:
    """Set a dotted key (or the key of `parts`) inside the document's data, creating
    mappings as needed, and record what set it.

    A key through a value that is neither a mapping nor a list (`model.d_model.x`
    when d_model is a number) is refused rather than silently replacing the value."""
    # (parts given are an .npz embedding's, whose token may be empty: `embeddings.`)
    split = parts is None
    parts = key_parts(doc, key) if parts is None else list(parts)
    node: Any = doc.data
    made: str | None = None
    file = origin.by if origin.at is None else f"{doc.file} ({origin.by})"
    if origin.array is not None:
        file = f"{doc.file} (weights_file {origin.by}, array {quoted(origin.array)})"
    if split and "" in parts:  # (`embeddings..x` where no token is "." or begins "x")
        raise InputError(
            f"cannot set {key}: an empty part between its dots",
            path=key,
            expected="a dotted key path (a token below embeddings may hold dots "
            "when the vocabulary has it)",
            found=quoted(key),
            file=file,
        )
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not whole_number(part):
                raise InputError(
                    f"cannot set {key}: {'.'.join(parts[:i])} is a list",
                    path=key,
                    expected="a list index",
                    found=quoted(part),
                    file=file,
                )
            idx = int(part)
            parts[i] = str(idx)  # (the key as read: `encoder.00` is `encoder.0`)
            if idx > len(node) + MAX_SET_PAD:
                raise InputError(
                    f"cannot set {key}: index {idx} is far past the end of "
                    f"{'.'.join(parts[:i])} ({len(node)} entries)",
                    path=key,
                    expected=f"an index below {len(node) + MAX_SET_PAD}",
                    found=str(idx),
                    file=file,
                )
            while len(node) <= idx:
                if len(node) < idx:  # an empty entry before the one set: say who added it
                    padded = join(".".join(parts[:i]), len(node))
                    doc.overridden.append(padded)
                    doc.origins[padded] = replace(origin, pads=key)
                node.append({})
            if last:
                node[idx] = value
            else:
                if node[idx] is None:
                    node[idx] = {}
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:  # (below embeddings, "0" is a token)
                    nxt = parts[i + 1]
                    node[part] = [] if whole_number(nxt) and here != "embeddings" else {}
                    if (
                        made is None  # (the array, not a list made inside it: W_2.0.1.2)
                        and here != "embeddings"
                        and all(whole_number(p) for p in parts[i + 1 :])
                    ):
                        made = here  # (an entry of an array the document does not hold)
                node = node[part]
        if not last and not isinstance(node, dict | list):
            line = doc.lines.get(here) if here not in doc.overridden else None
            where = f" (line {line} of {doc.file})" if line else ""
            number = isinstance(node, int | float) and not isinstance(node, bool)
            if number and all(whole_number(p) for p in parts[i + 1 :]):
                raise InputError(  # (gaussian's w: one number, or one per feature given whole)
                    f"{here} is a single number, with no entries{where}",
                    path=key,
                    expected=f"a single number, set whole at {here}",
                    found=f"{_kind(node)} and an index below it",
                    file=file,
                )
            raise InputError(
                f"{here} is not a mapping or list{where}",
                path=key,
                expected=f"a mapping or list at {here}",
                found=_kind(node),
                file=file,
            )
    key = ".".join(parts)  # (`embeddings...` sets the token ".": its key path `embeddings..`)
    prev = doc.origins.get(key)
    if made is None and prev is not None and prev.made is not None:
        # the same entry set again: still one of the array its first setting made,
        # unless an override set that array, or a key above it, since
        since = max(n for n, k in enumerate(doc.overridden) if k == key)
        if not any(
            _covers(k, prev.made) for k in doc.overridden[since + 1 :] if not doc.origins[k].pads
        ):
            made = prev.made
    if prev is not None and prev.pads:
        # the empty entry an earlier override added here (W.0 for W.1) is now set: it
        # is this override's, in its place among them, not in the earlier one's
        del doc.overridden[len(doc.overridden) - 1 - doc.overridden[::-1].index(key)]
    doc.overridden.append(key)
    doc.origins[key] = replace(origin, parts=tuple(parts), made=made)


def apply_variant(doc: Document, name: str) -> None:
    variants = doc.data.get("variants") or {}
    if not isinstance(variants, dict) or name not in variants:
        known = sorted(variants) if isinstance(variants, dict) else []
        raise InputError(
            f"unknown variant {quoted(name)}{suggest(name, known)}",
            file=doc.file,
            path="variants",
            expected="one of: " + (", ".join(known) or "(the file defines none)"),
            found=quoted(name),
        )
    body = variants[name]
    if not isinstance(body, dict):
        raise _ctx(doc).err(
            f"variants.{name}", "a variant maps dotted keys to values", body, "a mapping"
        )
    for key, value in body.items():
        if key in ("variants", "expect") or key.startswith(("variants.", "expect.")):
            raise _ctx(doc).err(
                f"variants.{name}.{key}",
                "a variant cannot change variants or expect",
                value,
                "keys of the config other than variants and expect",
            )
        origin = Origin(f"variant {name!r}", at=join(f"variants.{name}", key))
        apply_override(doc, key, _deepcopy(value), origin)


def _deepcopy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deepcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deepcopy(v) for v in value]
    return value


def load(
    name: str | None,
    sets: Iterable[str] = (),
    variant: str | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    dtype: str | None = None,
) -> Config | OpConfig:
    """Read, override and validate a config: the whole front door of the engine."""
    doc = read_document(name)
    return build(doc, [parse_set(s) for s in sets], variant, max_elements, dtype)


def overridden(
    doc: Document,
    sets: Sequence[tuple[str, Any]] = (),
    variant: str | None = None,
    options: Sequence[tuple[str, Any, str]] = (),
    tokens: frozenset[str] = frozenset(),
) -> Document:
    """A copy of the document with its variant, then each --set, then a command's own
    options (key, value, option name) set over it; the document itself is untouched.
    `tokens`: more tokens holding dots that keys below embeddings are read against (the
    weights_file's; see Document.tokens)."""
    doc = Document(
        doc.file, _deepcopy(doc.data), doc.lines, list(doc.overridden), dict(doc.origins), doc.base
    )
    doc.tokens = tokens | _final_tokens(doc, _overrides(doc, sets, variant, options))
    if variant is not None:
        apply_variant(doc, variant)
    for key, value in sets:
        apply_override(doc, key, value, Origin("--set"))
    for key, value, option in options:
        apply_override(doc, key, value, Origin(option))
    return doc


def _overrides(
    doc: Document,
    sets: Sequence[tuple[str, Any]],
    variant: str | None,
    options: Sequence[tuple[str, Any, str]],
) -> list[tuple[Any, Any]]:
    """Every override (key, value) in the order `overridden` applies them: the variant's
    keys, each --set, a command's own options."""
    variants = doc.data.get("variants")
    body = variants.get(variant) if isinstance(variants, dict) and variant is not None else None
    return [
        *(body.items() if isinstance(body, dict) else ()),
        *sets,
        *((key, value) for key, value, _ in options),
    ]


def _final_value(doc: Document, name: str, overrides: Iterable[tuple[Any, Any]]) -> Any:
    """The value of the document's top-level key `name` once those of `overrides` (key,
    value) at or below it are applied (those that cannot be are left to say their error
    when the overrides themselves are applied); the document is untouched."""
    scratch = Document(doc.file, {name: _deepcopy(doc.data.get(name))}, doc.lines, base=doc.base)
    for key, value in overrides:
        if isinstance(key, str) and (key == name or key.startswith(name + ".")):
            with contextlib.suppress(InputError):
                apply_override(scratch, key, _deepcopy(value), Origin(""))
    return scratch.data.get(name)


def _final_tokens(doc: Document, overrides: Iterable[tuple[Any, Any]]) -> frozenset[str]:
    """The tokens holding dots of the vocab once `overrides` (key, value) are applied to
    the document's: what a key below embeddings is read against, whichever the order of
    the overrides (`--set embeddings.x.y=[...] --set vocab=[..., x.y]`)."""
    overrides = list(overrides)
    if not any(
        isinstance(k, str) and (k == "vocab" or k.startswith("vocab.")) for k, _ in overrides
    ):
        return frozenset()
    vocab = _final_value(doc, "vocab", overrides)
    if not isinstance(vocab, list):
        return frozenset()
    return frozenset(t for t in vocab if isinstance(t, str) and "." in t)


def build(
    doc: Document,
    sets: Sequence[tuple[str, Any]] = (),
    variant: str | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    dtype: str | None = None,
    options: Sequence[tuple[str, Any, str]] = (),
) -> Config | OpConfig:
    """Validate a document (after a variant, --set overrides and a command's options)
    into a Config or OpConfig.

    `dtype` (the --dtype option) sets model.dtype, after everything else."""

    # Keys below embeddings are read against the weights_file's tokens too (`embeddings.
    # x.y.0`: entry 0 of token x.y, which only the npz may give): where an override sets
    # below embeddings, the npz the overrides leave is read first, so that they are
    # applied once, in order, each read as it is meant (an npz that cannot be read is
    # said once the overrides are applied: an override's own error comes first).
    every = _overrides(doc, sets, variant, options)
    tokens: frozenset[str] = frozenset()
    early: tuple[str, list[tuple[str, Any]]] | None = None
    if any(isinstance(k, str) and k.startswith("embeddings.") for k, _ in every):
        raw = _final_value(doc, "weights_file", every)
        probe = Document(doc.file, {"weights_file": raw}, doc.lines, base=doc.base)
        with contextlib.suppress(InputError):  # (said below, if the npz is still read)
            early = (_weights_file(probe)[0], read_weights_file(probe, max_elements))
            embedded = (a[len("embeddings.") :] for a, _ in early[1])
            tokens = frozenset(t for t in embedded if "." in t)
    final = overridden(doc, sets, variant, options, tokens)
    if dtype is not None:
        if "model" not in final.data:
            raise InputError(
                f"--dtype {dtype} applies to a model config; this file holds a single operation",
                file=final.file,
                expected="a config with a 'model:' section (single operations run in float64)",
            )
        apply_override(final, "model.dtype", dtype, Origin("--dtype"))
    if "model" in final.data and final.data.get("weights_file") is not None:
        name = _weights_file(final)[0]
        arrays = early[1] if early and early[0] == name else read_weights_file(final, max_elements)
        place_weights_file(final, arrays)
    ctx = _ctx(final)
    return _Validator(ctx, max_elements).document(final.data, variant)


def _weights_file(doc: Document) -> tuple[str, str]:
    """The path of the document's `weights_file` (relative to the config's directory; no
    ~) and how to name it in a message (' (the weights_file of c.yaml, line 3)')."""
    raw = doc.data["weights_file"]
    if not isinstance(raw, str) or not raw.strip() or "\0" in raw:  # (no path holds NUL)
        raise _ctx(doc).err("weights_file", "not a file name", raw, "the path of an .npz file")
    set_by = doc.origins.get("weights_file")
    line = doc.lines.get("weights_file")
    of_config = f" (the weights_file of {doc.file}" + (
        f", set by {set_by.by})" if set_by else f", line {line})" if line else ")"
    )
    return str((doc.base or Path()) / raw), of_config


def read_weights_file(doc: Document, max_elements: int) -> list[tuple[str, Any]]:
    """The arrays of the document's `weights_file` (an .npz; loader.read_npz), by name."""
    name, of_config = _weights_file(doc)
    try:
        return read_npz(Path(name), name, max_elements, OBJECT_COST)
    except InputError as exc:
        exc.message += of_config
        raise


def place_weights_file(doc: Document, arrays: Sequence[tuple[str, Any]]) -> None:
    """Put each of `arrays`, those of the document's `weights_file` (read_weights_file),
    into its data where the YAML would hold it: `embeddings.<token>` or, below
    `weights`, its key path (`encoder.0.self_attn.W_q`), so that every check of the
    YAML's arrays applies to it. The arrays stay numpy arrays (the validator takes them
    as they are); a key the document already gives is refused, naming both."""
    ctx = _ctx(doc)
    name, of_config = _weights_file(doc)
    set_by = doc.origins.get("weights_file")
    read: dict[str, str] = {}  # (the arrays so far, by their key paths as read)
    overrides = doc.overridden[:]  # (the arrays are placed after them)
    named = max((n for n, k in enumerate(overrides) if k == "weights_file"), default=-1)
    above = set(overrides[named + 1 :])  # (those since an override named the weights_file)

    def twice(key: str, first: str) -> InputError:
        return ctx.err(
            key,
            f"given twice: {first} of weights_file {name}"
            + (f" (set by {set_by.by})" if set_by else ""),
            expected="each weight given once, in the YAML or in the .npz",
        )

    for array, value in arrays:
        # an embedding's token may hold dots: it is one key below `embeddings`
        token = array[len("embeddings.") :] if array.startswith("embeddings.") else None
        key = array if token is not None else f"weights.{array}"
        if token is None and "" in array.split("."):
            raise InputError(  # (`b_1.` would become a mapping {'': ...} below b_1)
                "not a key path: "
                + ("an empty name" if not array else "an empty part between its dots")
                + of_config,
                file=name,
                path=f"array {quoted(array)}",
                expected="a key path below weights, such as encoder.0.ffn.W_1",
            )
        as_read = key if token is not None else _index_read(key)
        if as_read in read:  # (whatever overrides set there: `encoder.00.` is `encoder.0.`)
            raise twice(key, f"as arrays {quoted(read[as_read])} and {quoted(array)}")
        read[as_read] = array
        if token is not None:
            given = doc.data.get("embeddings")
            given = given.get(token) if isinstance(given, dict) else None
        else:
            given = _at(doc.data, key.split("."))
        setters = [k for k in overrides if not doc.origins[k].pads and _covers(k, as_read)]
        # (the file's value at key, unless an override set it or a key above it)
        in_file = doc.lines.given(key) and not setters
        if not in_file and any(k in above for k in setters):
            # an override that set the key whole, or a key above it, stands over the
            # array, as over the YAML's (`--set weights.encoder.0.ffn={}`: drawn),
            # unless it came before the weights_file was named (`weights: null,
            # weights_file: w.npz`: the npz fills what is not given)
            continue
        if given is not None and not in_file:
            # an override's value at the key stands over the array (not entries that
            # made one where an override before the weights_file left none); entries set
            # by overrides are written over a copy of it
            inside = _set_inside(overrides, doc.origins, as_read)
            if setters and not any(doc.origins[k].made == as_read for k in inside):
                continue
            if inside:
                _under_entries(doc, as_read, token, inside, name, array, value)
                continue
        if given is not None:
            # the file's value: every override's value at or above the key was dealt
            # with above (it stands over the array, or the array is the base of its
            # entries), so what is left is the YAML's own
            raise twice(key, f"in {doc.file} and as array {quoted(array)}")
        origin = Origin(name, at="weights_file", array=array)
        apply_override(doc, key, value, origin, None if token is None else ["embeddings", token])


def _under_entries(
    doc: Document,
    key: str,
    token: str | None,
    inside: Sequence[str],
    file: str,
    array: str,
    value: Any,
) -> None:
    """Place the weights_file's `array` (at `key`, its indices as overrides read them:
    `_index_read`) under the entries that overrides set inside it (`inside`, in the
    order set): it becomes their base (Document.bases), set just before the first of
    them, as a weight of the YAML would be, so that its source names the array and
    then the entries set."""
    first = doc.overridden.index(inside[0])
    parts = ("embeddings", token) if token is not None else tuple(key.split("."))
    doc.overridden.insert(first, key)
    doc.origins[key] = Origin(file, at="weights_file", array=array, parts=parts)
    for k in inside:  # no longer entries of an array the document does not give
        doc.origins[k] = replace(doc.origins[k], made=None)
    doc.bases[key] = value


def _index_read(key: str) -> str:
    """A key path below weights with its indices as overrides read them: `encoder.00` is
    `encoder.0`."""
    return ".".join(str(int(p)) if whole_number(p) else p for p in key.split("."))


def _set_inside(overridden: Sequence[str], origins: Mapping[str, Origin], key: str) -> list[str]:
    """The keys below `key` that overrides set (its entries, or a part of it), in the
    order set; not the empty entries an override added past a list's end. Below
    embeddings a token may hold dots: `embeddings.x.y` (token x.y) is not inside
    `embeddings.x`, so the key's parts are read, not its text."""
    return [
        k
        for k in overridden
        if k.startswith(key + ".") and not origins[k].pads and _below(origins[k].parts, key)
    ]


def _below(parts: Sequence[str], key: str) -> bool:
    """Whether the key of `parts` lies below `key` (some of its first parts are `key`);
    true when its parts are not recorded (its text then says)."""
    return not parts or any(".".join(parts[:n]) == key for n in range(1, len(parts)))


def _covers(key: str, path: str) -> bool:
    """Whether setting `key` sets the value at `path`, a weight's key path: it is `path`
    or a key above it (above an embedding, `embeddings.<token>`, only `embeddings`: a
    token may hold dots, and `embeddings.x` is not above `embeddings.x.y`)."""
    if path.startswith("embeddings."):
        return key in (path, "embeddings")
    return path == key or path.startswith(key + ".")


def _in_part(axis: int, lo: int, hi: int) -> Callable[[tuple[str, ...]], bool]:
    """Whether the indices of an entry set inside a fused weight (`0.1` of a W_q, `3` of
    a b_q) fall in one head's part of it, indices lo..hi along `axis` (a W's columns, a
    bias's entries, a rel_bias's row); a whole row of a W (`0`) falls in every head's."""
    return lambda at: len(at) <= axis or lo <= int(at[axis]) <= hi


def _at(data: Any, parts: Sequence[str]) -> Any:
    """The value at a key path of plain data (list entries by index), or None."""
    for part in parts:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and whole_number(part) and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def check_size(
    doc: Document, m: ModelConfig, n_vocab: int, lengths: Sequence[int], max_elements: int
) -> None:
    """Refuse a model whose arrays would hold more than `max_elements` numbers over
    sequences of these lengths, before anything is built (as `build` does for the file's
    own sequences): `cost --vary L=...` asks before it lists the L tokens."""
    _Validator(_ctx(doc), max_elements).check_size(m, n_vocab, lengths)


def _kind(value: Any) -> str:
    """A short description of what a value is, for 'found ...'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"the number {typed(value) if isinstance(value, Typed) else repr(value)}"
    if isinstance(value, str):
        typeset = value.strip().replace("−", "-")  # (a minus sign as typeset, U+2212)
        minus = " (its '−' is a typeset minus sign: write '-')"
        return f"the string {quoted(value, 40)}" + (
            minus if "−" in value and read_number(typeset) is not None else ""
        )
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, np.ndarray):
        return f"an array of shape {shape_text(value.shape, 'x')}"
    return type(value).__name__


@dataclass
class _Ctx:
    file: str
    lines: Lines
    overridden: list[str]
    origins: dict[str, Origin] = field(default_factory=dict)
    bases: dict[str, Any] = field(default_factory=dict)  # Document.bases

    def err(
        self,
        path: str,
        message: str,
        found: Any = ...,
        expected: str | None = None,
        found_text: str | None = None,
    ) -> InputError:
        """An InputError at `path`; `found` is described, or `found_text` given as is."""
        key = next(
            (k for k in reversed(self.overridden) if path == k or path.startswith(k + ".")),
            None,
        )
        # a key overrides made on their way (model.new of model.new.x) is not the file's:
        # one override is named (a key set twice is one); several are not named alone,
        # nor the file's line
        made = (
            []
            if self.lines.given(path)
            else list(dict.fromkeys(k for k in self.overridden if k.startswith(path + ".")))
        )
        from_npz = [self.origins.get(k, Origin("")) for k in made]
        arrays = [k for k, o in zip(made, from_npz, strict=True) if o.array and not o.pads]
        # (the empty entries an override added past a list's end are its own: W.3.0 adds
        # W.0..W.2, and is still one override)
        real = [k for k, o in zip(made, from_npz, strict=True) if not o.pads]
        if key is None and (len(real) == 1 or (made and all(o.array for o in from_npz))):
            key = real[0]  # (the arrays of a weights_file below path: the first named)
        line = None if made else self.lines.get(path)
        if key is not None:  # the value is not the file's: say what set it
            origin = self.origins.get(key, Origin("--set"))
            written = origin.pads or key  # the key as the user wrote it
            by = origin.by
            if origin.array is not None:  # from a weights_file: name its array
                by = f"from weights_file {by}, array {quoted(origin.array)}"
                if len(arrays) > 1:
                    by += f" and {len(arrays) - 1} more"
            elif origin.at is None:  # an option (a KEY=VALUE option with the key given)
                by = origin.named(written)
            elif written != path:  # a variant's key, above path
                by += f", at {written}"
            if origin.pads and origin.array is None:
                by += f", which added {key} empty before it"
            message += f" ({by})" if origin.array is not None else f" (set by {by})"
            rest = "" if origin.pads else path[len(key) :]
            line = None if origin.at is None else self.lines.get(origin.at + rest)
            if origin.pads and key == path and isinstance(found, dict) and not found:  # (added)
                found = ...
                found_text = "nothing: an entry left empty"
        return InputError(
            message,
            file=self.file,
            path=path or None,
            line=line,
            expected=expected,
            found=found_text if found is ... else _kind(found),
        )

    @functools.cached_property
    def made(self) -> set[str]:
        """The key paths of arrays the document does not give that overrides set entries
        of (`--set weights.encoder.0.ffn.W_2.0.1=5` with W_2 drawn)."""
        _, _, made = self._overrides
        return {array for array, n in made.items() if n > self._since(array)}

    def _setter(self, key: str) -> tuple[int, str] | None:
        """The last override that set `key` or a key above it: its place among the
        overrides (entries set inside `key` before it were replaced) and its key."""
        if key.startswith("embeddings."):  # (a token may hold dots: `embeddings.e.g.`)
            parents = ["embeddings"]
        else:
            names = key.split(".")
            parents = [".".join(names[:n]) for n in range(1, len(names))]
        last, _, _ = self._overrides
        return max(((last[k], k) for k in (*parents, key) if k in last), default=None)

    def _since(self, key: str) -> int:
        setter = self._setter(key)
        return -1 if setter is None else setter[0]

    def entries(self, key: str) -> list[str]:
        """The keys below `key` that overrides set since `key` was last set whole (its
        entries, or parts of it), in the order set; not the empty entries an override
        added past a list's end."""
        return _set_inside(self.overridden[self._since(key) + 1 :], self.origins, key)

    @functools.cached_property
    def _overrides(
        self,
    ) -> tuple[dict[str, int], dict[str, list[tuple[str, tuple[str, ...]]]], dict[str, int]]:
        """`given`'s index of the overrides, made once (an .npz may set thousands of keys):
        each key's last place among them; by array, the keys set inside it and their
        indices below it; by array made of its entries alone, the place of the last."""
        last: dict[str, int] = {}
        inside: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        made: dict[str, int] = {}
        for n, k in enumerate(self.overridden):
            if self.origins[k].pads:
                continue
            last[k] = n
            if (array := self.origins[k].made) is not None:
                made[array] = n
            parts = self.origins[k].parts or tuple(k.split("."))
            for i in range(1, len(parts)):  # entries of an array: indices below it
                if all(whole_number(p) for p in parts[i:]):
                    inside.setdefault(".".join(parts[:i]), []).append((k, parts[i:]))
        return last, inside, made

    def given(self, key: str, within: Callable[[tuple[str, ...]], bool] | None = None) -> Source:
        """Where the value of `key`, given in the document, came from: the last override
        at `key` or a key above it (--set, a variant, an array of weights_file), else the
        file's line; with the overrides that set entries inside it (those whose indices
        below `key` are `within` a part of it, when given)."""
        last, inside, made = self._overrides
        setter = self._setter(key)
        since = -1 if setter is None else setter[0]  # (entries set before were replaced)
        partly = tuple(
            dict.fromkeys(
                self.origins[k].named(k)
                for k, at in inside.get(key, ())
                if last[k] > since and (within is None or within(at))
            )
        )
        if made.get(key, -1) > since:
            # no array but the one its entries made (a weight can be set entry by entry)
            first = self.origins[inside[key][0][0]]
            kind = "set" if first.at is None else "variant"
            text = f"only its entries, set by {', '.join(partly)}"
            return Source(kind, text, by=first.by, partly=partly)
        if setter is None:
            line = self.lines.get(key)
            where = f"{self.file} line {line}" if line else f"given in {self.file}"
            src = Source("file", where, file=self.file, line=line)
        elif (origin := self.origins[setter[1]]).array is not None:
            text = f"{origin.by}, array {quoted(origin.array)}"
            src = Source("npz", text, file=origin.by, array=origin.array)
        else:
            k = setter[1]
            by = origin.by if k == key else origin.named(k)
            line = None if origin.at is None else self.lines.get(origin.at + key[len(k) :])
            text = by + (f", {self.file} line {line}" if line else "")
            kind = "set" if origin.at is None else "variant"
            src = Source(kind, text, file=self.file if line else None, line=line, by=by)
        if partly:
            src = replace(
                src, text=f"{src.text}; entries set by {', '.join(partly)}", partly=partly
            )
        return src

    def set_by(self, *keys: str) -> str:
        """' (KEY set by WHAT)' for the first of `keys` an override set, where a message
        about another key says what this one's value makes wrong; else ''. (A variant
        or a --set that turns a part off names itself, not only the value it left.)"""
        for key in keys:
            origin = self.origins.get(key)
            if origin is not None and origin.array is None:
                return f" ({key} set by {origin.by})"
        return ""


def _ctx(doc: Document) -> _Ctx:
    return _Ctx(doc.file, doc.lines, doc.overridden, doc.origins, doc.bases)


FLOAT32_MAX = float(np.finfo(np.float32).max)
# float32 rounds a positive number up to its smallest, 2^-149, from just above half of
# it; half itself (ties to even) and below round to 0
FLOAT32_ZERO = 2.0**-150


def outside_float32(value: float, *, divisor: bool = False) -> tuple[str, str] | None:
    """Why float32, the model's dtype, cannot hold `value`, a given number, as (problem,
    expected): it would be an infinity, or 0 where it is not (a divisor's 0: a division
    by 0). None where float32 holds it. Each bound exact, not rounded: the refused
    number is never within it."""
    if abs(value) > FLOAT32_MAX:
        return (
            "beyond the range of float32, the model's dtype",
            f"a number of magnitude at most {exact(FLOAT32_MAX)}, or float64",
        )
    if 0 < abs(value) <= FLOAT32_ZERO:
        zero = exact(FLOAT32_ZERO)
        return (
            "below the range of float32, the model's dtype (it would be 0)",
            f"a number above {zero} (2^-150), or float64"
            if divisor
            else f"0, or a number of magnitude above {zero} (2^-150; float32 rounds less"
            " to 0), or float64",
        )
    return None


@dataclass(frozen=True)
class Low:
    """Given numbers below the smallest normal number of the dtype they are used in,
    stored there with fewer significant digits: the first's key path and number, how
    many there are, and that dtype."""

    where: str
    value: float
    count: int
    dtype: str


def below_normal(arr: np.ndarray, magnitude: np.ndarray, path: str, dtype: str) -> Low | None:
    """The numbers of `arr` (at `path`; `magnitude` its |arr|) that `dtype` holds with fewer
    significant digits, below its smallest normal number (1e-40 in float32 is 9.99995e-41),
    or None. One vectorised pass; the rest only where there are some."""
    dt = np.dtype(dtype)
    low = (magnitude < float(np.finfo(dt).smallest_normal)) & (arr != 0)
    if dt != np.float64 and low.any():  # (one float32 holds exactly: no loss)
        low &= arr.astype(dt).astype(np.float64) != arr
    if not low.any():
        return None
    where, at = _first(path, low)
    return Low(where, float(arr[at]), int(low.sum()), dtype)


def notes_of(lows: Sequence[Low]) -> tuple[InputNote, ...]:
    """The one warning of given numbers stored with fewer digits, naming the first and
    counting the rest; () without."""
    if not lows:
        return ()
    where, value, dtype = lows[0].where, lows[0].value, lows[0].dtype
    count = sum(low.count for low in lows)
    dt = np.dtype(dtype)
    digits = 17 if dt == np.float64 else 6  # (enough to show the digits lost)
    stored = float(np.array(value, dtype=dt))
    # (the others may be below another dtype's smallest normal: pe_base's is float64's)
    more = f"; {counted(count - 1, 'more number')} stored with fewer digits" if count > 1 else ""
    return (
        InputNote(
            f"{where}: {exact(value)} is below {dtype}'s smallest normal number "
            f"{float(np.finfo(dt).smallest_normal):.6g}; stored as {stored:.{digits}g} "
            f"(fewer significant digits){more}"
        ),
    )


OBJECT_COST = 128  # numbers (1 KiB) charged to the size limit for each array or step kept


def trace_size(m: ModelConfig, L: int, n_vocab: int) -> int:
    """An upper bound on the numbers a traced run over sequences of L positions records,
    L standing for every query and key length, with OBJECT_COST more for each step."""
    d, H, dk, dv, dff = m.d_model, m.n_heads, m.d_k, m.d_v, m.d_ff
    enc, dec = m.encoder_layers, m.decoder_layers
    blocks = enc + dec * (2 if enc else 1)  # attention blocks
    # q, k (and q_raw, k_raw), v, context; scores, scaled, masked, softmax; then concat,
    # wo, residual, norm and its two statistics.
    attn = H * (4 * L * dk + 2 * L * dv + 4 * L * L) + L * (H * dv + 3 * d + 2)
    if m.score in ("bilinear", "additive"):  # q_b; or q_a, k_a and tanh(q_a[i] + k_a[j])
        attn += H * (L * dk + L * (L + 2) * m.d_a)
    if m.positional in ("relative", "alibi"):  # rel_bias and biased (as RoPE's q_raw and k_raw)
        attn += H * 2 * L * L
    if m.qk_norm != "none":  # q_norm and k_norm, and their statistics (mean and var at most)
        attn += H * (2 * L * dk + 4 * L)  # (projection: once per block, no more than this)
    capped = m.attn_softcap is not None  # each head's capped scores
    attn += H * L * L * capped
    sinks = m.attn_sinks  # each head's sink step, one number a query row (and the sink)
    attn += H * (L + 1) * sinks
    ffn = L * (2 * dff + 3 * d + 2)
    # a mixture of experts: router, route_prob, routed; each of the L·k token-expert
    # pairs' x, hidden, act, up, gated and out
    ffn += L * (3 * m.experts + m.experts_top_k * (4 * dff + 2 * d))
    oss = m.activation == "swiglu_oss"  # gate_clamp and up_clamp, each FFN and expert pair
    ffn += oss * 2 * L * dff * (1 + m.experts_top_k)
    # a shared expert (model.shared_expert): its FFN's steps on every token (hidden, act,
    # up, gated, out; gate_clamp, up_clamp) and its gate
    shared = m.shared_expert != "none"
    ffn += shared * (L * (4 + 2 * oss) * m.shared_expert_d_ff + L * d + L)
    sandwich = m.norm_position == "sandwich"  # post_norm and its statistics, each sublayer
    attn += L * (d + 2) if sandwich else 0
    ffn += L * (d + 2) if sandwich else 0
    # embed, pe, token_type, input, embedding norm, final norm, output (norms'
    # statistics); the mask
    typed = m.token_types > 0
    stack = (6 + typed) * L * d + L * L + 4 * L
    stacks = (enc > 0) + (dec > 0)
    numbers = blocks * attn + (enc + dec) * ffn + stacks * stack + L * L + 2 * L * n_vocab
    # the sliding layers' own masks (model.window a list of windows); logits_raw
    raw = m.logit_softcap is not None or m.logit_scale is not None
    extra = dec * m.mixed_windows + raw
    numbers += dec * m.mixed_windows * L * L + raw * L * n_vocab
    # The steps, each charged OBJECT_COST: per head at most 14 (20 with QK-norm; capped
    # one more), per block 6 (9 with sandwich; 12 more with projection QK-norm), per FFN 7
    # (10 with sandwich), per stack 9 (10 with token types); the cross mask, logits and
    # probs; the sliding layers' masks and logits_raw.
    steps = (
        blocks * ((20 if m.qk_norm != "none" else 14) * H + 6 + 3 * sandwich)
        + blocks * 12 * (m.qk_norm == "projection")
        + (enc + dec) * (7 + 3 * sandwich + (3 + 6 * m.experts) * (m.experts > 0))
        + (enc + dec) * 2 * oss * (1 + m.experts)
        + (enc + dec) * shared * (6 + 2 * oss)
        + stacks * (9 + typed)
        + 3
        + blocks * H * capped
        + blocks * H * sinks
        + extra
    )
    return numbers + OBJECT_COST * steps


def _first(path: str, where: np.ndarray) -> tuple[str, tuple[int, ...]]:
    """The key path of the first entry of the array at `path` where `where` holds
    (`W.1.0`; `path` itself for a single number), and that entry's index."""
    at = tuple(int(i) for i in np.argwhere(where)[0])
    return (join(path, ".".join(map(str, at))) if at else path), at


class _Validator:
    def __init__(self, ctx: _Ctx, max_elements: int) -> None:
        self.ctx = ctx
        self.max_elements = max_elements
        self.drawn: list[str] = []
        self.given_fused: list[str] = []
        self.seed = 0
        self.init_std = 1.0
        self.dtype = "float64"  # the model's, once read: given numbers must fit it
        # array path -> its numbers below the smallest normal of the dtype they are used in
        self.subnormal: dict[str, Low] = {}
        self.vocab_listed = False  # whether the file (or an override) gives `vocab`

    # -- primitives ---------------------------------------------------------

    def mapping(self, value: Any, path: str, allowed: Sequence[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.ctx.err(path, "not a mapping", value, "a mapping of keys")
        for key in value:
            if key not in allowed:
                at = join(path, key)
                hf = HF_KEYS.get(at) or HF_KEYS.get("*." + at.split(".", 1)[-1])
                raise self.ctx.err(
                    at,
                    f"unknown key {quoted(key)}" + (f": {hf}" if hf else suggest(key, allowed)),
                    expected="one of: " + ", ".join(allowed),
                )
        return value

    def number(
        self, value: Any, path: str, *, positive: bool = False, minimum: float | None = None
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.ctx.err(path, "not a number", value, "a number")
        if not math.isfinite(value):
            raise self.ctx.err(path, "not a finite number", value, "a finite number")
        if positive and value <= 0:
            raise self.ctx.err(path, "must be positive", value, "a number > 0")
        if minimum is not None and value < minimum:
            raise self.ctx.err(path, f"must be at least {minimum}", value, f"a number >= {minimum}")
        return float(value)

    def integer(self, value: Any, path: str, minimum: int = 0) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.ctx.err(path, "not a whole number", value, "a whole number")
        if value < minimum:
            raise self.ctx.err(
                path, f"must be at least {minimum}", value, f"a whole number >= {minimum}"
            )
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.ctx.err(path, "not a boolean", value, "true or false")
        return value

    def choice(self, value: Any, path: str, options: Sequence[str]) -> str:
        if not isinstance(value, str) or value not in options:
            hint = suggest(value, options) if isinstance(value, str) else ""
            raise self.ctx.err(
                path, f"not a valid choice{hint}", value, "one of: " + ", ".join(options)
            )
        return value

    def text(self, value: Any, path: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise self.ctx.err(path, "not text", value, "a string")
        return str(value)

    def array(
        self,
        value: Any,
        path: str,
        shape: tuple[int, ...] | None,
        *,
        finite: bool = True,
        dims: str = "",
        base: Callable[[], np.ndarray] | None = None,
    ) -> np.ndarray:
        """A nested list of numbers as a float64 array, checked for raggedness and shape.

        `dims` names the expected dimensions (`d_model x d_k`) for the error message,
        so a wrong shape says which size of the model it disagrees with. `base`: what
        the array is when the config does not give it (drawn, or a default), which
        entries set by overrides (`--set ...W_2.0.1=5`) then change."""
        if path in self.ctx.bases:  # an array of the weights_file, entries set over it
            # (its numbers checked once the entries are written: one may replace a NaN)
            given = self._array(self.ctx.bases[path], path, shape, finite=False, dims=dims)
            copied = np.array(given, dtype=np.float64)  # (never the loaded array itself)
            changed = self._entries(copied, value, path)
            return self._array(changed, path, shape, finite=finite, dims=dims)
        if base is not None and shape is not None and path in self.ctx.made:
            # (the drawn numbers are not held to the dtype as given ones: each entry set is)
            changed = self._entries(base(), value, path)
            return self._array(changed, path, shape, dims=dims, given=False)
        try:
            return self._array(value, path, shape, finite=finite, dims=dims)
        except InputError:
            # an override that set a key below it which no array has (`W_2.-1.0`,
            # `W_2.0.x`, where the config does not give W_2) made what is wrong
            for key in self.ctx.entries(path):
                if not all(whole_number(i) for i in key[len(path) + 1 :].split(".")):
                    raise self._no_such_entry(key, shape) from None
            # entries set by overrides where the document has no array to set them in
            # (a fused weight not given): the array is not what is wrong
            if path not in self.ctx.made:
                raise
            made = list(dict.fromkeys(self.ctx.entries(path)))
            by = self.ctx.origins[made[-1]].named(made[-1])
            # (a single operation's matrices are not drawn: the whole one is needed)
            model = path.startswith(("weights.", "embeddings."))
            what = "weight" if model else "matrix"
            raise InputError(
                f"entries set in a {what} the config does not give (by {by})",
                file=self.ctx.file,
                path=path,
                expected=f"the whole {what} first, --set {path}=[...]"
                + (f" of shape {shape_text(shape, 'x')}" if shape else "")
                + (
                    " (not given, a weight is drawn, a norm's γ and β are 1 and 0, a bias is none)"
                    if model
                    else ""
                ),
                found=f"only entries: {', '.join(made[:3])}" + (", ..." if len(made) > 3 else ""),
            ) from None

    def _entries(self, array: np.ndarray, value: Any, path: str) -> np.ndarray:
        """`array` with what overrides set below `path` written over it, in the order set:
        an entry (`W_2.0.1=5`) or a part (`W_2.0=[...]`, a whole row, of its shape).
        Each is read from `value`, what the overrides built at `path` (lists, and
        mappings by index: `--set W_2.0.1=5` alone makes [{"1": 5}])."""
        for key in self.ctx.entries(path):
            at = key[len(path) + 1 :].split(".")
            if not all(whole_number(i) for i in at) or len(at) > array.ndim:
                raise self._no_such_entry(key, array.shape)
            index = tuple(int(i) for i in at)
            if any(i >= n for i, n in zip(index, array.shape, strict=False)):
                raise self.ctx.err(
                    key,
                    "no such entry",
                    expected=f"indices within shape {shape_text(array.shape, 'x')}",
                )
            v = value
            for i in at:  # (a list by position, a mapping by the index as written)
                v = v[int(i)] if isinstance(v, list) else v[i]
            rest = array.shape[len(index) :]
            if rest:  # (each entry held to the dtype as given: the whole may be drawn)
                array[index] = self._array(v, key, rest)
            else:
                array[index] = self._array(self.number(v, key), key, ())
        return array

    def _no_such_entry(self, key: str, shape: tuple[int, ...] | None) -> InputError:
        """An override's key below an array that names no entry of it (`W_2.0.1.0`,
        `W_2.-1.0`)."""
        expected = f"indices of shape {shape_text(shape, 'x')}" if shape else "indices 0, 1, ..."
        return self.ctx.err(key, "no such entry", expected=expected)

    def _array(
        self,
        value: Any,
        path: str,
        shape: tuple[int, ...] | None,
        *,
        finite: bool = True,
        dims: str = "",
        given: bool = True,
    ) -> np.ndarray:
        """`value` as a float64 array of `shape`; with `given`, every number of it is
        one given (not drawn), held to the dtype's range and noted below its normal ones."""
        if isinstance(value, np.ndarray):  # from a weights_file: float64 already
            arr = value
        else:
            self._shape(value, path)
            arr = np.array(value, dtype=np.float64)
        if finite and not np.isfinite(arr).all():
            where, at = _first(path, ~np.isfinite(arr))
            raise self.ctx.err(where, "not a finite number", float(arr[at]), "a finite number")
        if finite and given and self.dtype == "float32":
            magnitude = np.abs(arr)
            # rounded to float32 an infinity, or 0: no longer the number written
            for outside in (magnitude > FLOAT32_MAX, (magnitude <= FLOAT32_ZERO) & (arr != 0)):
                if outside.any():
                    where, at = _first(path, outside)
                    why = outside_float32(float(arr[at]))
                    assert why is not None
                    raise self.ctx.err(where, why[0], float(arr[at]), why[1])
            self._subnormal(arr, magnitude, path)
        elif finite and given and not isinstance(value, np.ndarray):  # float64: one typed
            self._subnormal(arr, np.abs(arr), path)
        if shape is not None and tuple(arr.shape) != shape:
            # a size the shape comes from, set by --set or a variant, is named as its cause
            sizes = [f"model.{k}" for k in re.findall(r"\w+", dims) if k in MODEL_KEYS]
            raise self.ctx.err(
                path,
                "wrong shape" + self.ctx.set_by(*sizes),
                expected=f"shape {shape_text(shape, 'x')}" + (f" ({dims})" if dims else ""),
                found_text=f"shape {shape_text(tuple(arr.shape), 'x')}",
            )
        return arr

    def _subnormal(
        self, arr: np.ndarray, magnitude: np.ndarray, path: str, dtype: str | None = None
    ) -> None:
        """Note the given numbers of `arr` that `dtype` (the model's unless told) holds with
        fewer significant digits (below_normal): the first, and how many (Config.notes)."""
        low = below_normal(arr, magnitude, path, dtype or self.dtype)
        if low is None:
            self.subnormal.pop(path, None)
        else:
            self.subnormal[path] = low

    def given_number(self, value: float, path: str, dtype: str | None = None) -> float:
        """A single given number the model computes with in `dtype` (its own unless told:
        norm_eps, a scale, a temperature; pe_base in float64): noted below that dtype's
        smallest normal number as an array's are."""
        arr = np.array(value, dtype=np.float64)
        self._subnormal(arr, np.abs(arr), path, dtype)
        return value

    def lows(self) -> tuple[Low, ...]:
        """The given numbers stored with fewer digits (Config.notes says them), each array
        once: not a row an override set, `W.0=[...]`, counted again in its whole array `W`."""
        return tuple(
            v
            for p, v in self.subnormal.items()
            if not any(p.startswith(q + ".") for q in self.subnormal)
        )

    def _shape(self, value: Any, path: str) -> tuple[int, ...]:
        """Shape of a nested list of numbers; refuses ragged rows and non-numbers."""
        if isinstance(value, bool) or value is None or isinstance(value, str | dict):
            raise self.ctx.err(path, "not a number", value, "a number")
        if isinstance(value, int | float):
            return ()
        if isinstance(value, np.ndarray):  # (a weights_file's row, given on its own)
            return tuple(value.shape)
        if not isinstance(value, list):
            raise self.ctx.err(path, "not a number", value, "a number")
        if not value:
            return (0,)
        first = self._shape(value[0], join(path, 0))
        if not first:  # a vector: check every entry quickly
            for i, v in enumerate(value):
                if isinstance(v, bool) or not isinstance(v, int | float):
                    if isinstance(v, list):
                        raise self.ctx.err(
                            join(path, i), "ragged matrix: a list among numbers", v, "a number"
                        )
                    raise self.ctx.err(join(path, i), "not a number", v, "a number")
            return (len(value),)
        for i, v in enumerate(value[1:], start=1):
            s = self._shape(v, join(path, i))
            if s != first:
                raise self.ctx.err(
                    join(path, i),
                    "ragged matrix: rows differ in length",
                    expected=f"shape {shape_text(first, 'x')} like row 0",
                    found_text=f"shape {shape_text(s, 'x')}",
                )
        return (len(value), *first)

    def scale(self, raw: Any, path: str, d_k: int) -> tuple[float, str]:
        """What the scores are divided by: sqrt_dk or a positive number, and how to show it."""
        if raw == "sqrt_dk":
            return math.sqrt(d_k), root_text("sqrt(d_k)", d_k)
        if isinstance(raw, str):
            raise self.ctx.err(
                path,
                f"not a number or sqrt_dk{suggest(raw, ['sqrt_dk'])}",
                raw,
                "a positive number or sqrt_dk",
            )
        scale = self.number(raw, path, positive=True)
        return scale, exact(scale) + (" (not scaled)" if scale == 1 else "")

    def score_weights(
        self,
        block: dict[str, Any],
        path: str,
        score: str,
        d_q: int,
        d_k: int,
        d_a: int,
        draw_path: str | None,
    ) -> ScoreWeights:
        """The weights the score function reads; missing ones are drawn under `draw_path`
        (a model), or are an error (a single operation; gaussian's w defaults to 1 there)."""
        for key in ALL_SCORE_WEIGHTS:
            if block.get(key) is not None and key not in SCORE_WEIGHTS[score]:
                owner = next(s for s, keys in SCORE_WEIGHTS.items() if key in keys)
                raise self.ctx.err(
                    join(path, key),
                    f"{key} is a weight of score {owner}, but the score is {score}",
                    expected=f"no {key}, or score: {owner}",
                )
        shapes = {"W_a_q": (d_q, d_a), "W_a_k": (d_k, d_a), "v_a": (d_a,), "W_b": (d_q, d_k)}
        out: dict[str, np.ndarray] = {}
        for key in SCORE_WEIGHTS[score]:
            where, raw = join(path, key), block.get(key)
            if key == "w":  # a number, or one kernel width per feature
                given = self.ctx.bases.get(where)  # (of a weights_file, entries set over it)
                if where in self.ctx.made or (given is not None and np.ndim(given) == 0):
                    # not given: drawn as one number (a model) or 1 (a single operation)
                    why = " (not given: it is " + ("drawn as one)" if draw_path else "1)")
                    raise self.ctx.err(
                        where,
                        "w is a single number here, with no entries to set"
                        + (why if given is None else ""),
                        expected=f"a single number, or one per feature ({d_q}), set whole: "
                        f"{where}=[...]",
                        found_text=f"entries set: {', '.join(self.ctx.entries(where))}",
                    )
                if raw is None:
                    w = self.draw(f"{draw_path}.w", ()) if draw_path else 1.0
                elif isinstance(raw, list | np.ndarray):
                    w = self.array(raw, where, (d_q,))
                else:
                    w = self.number(raw, where)
                out[key] = np.asarray(w, dtype=np.float64)
            elif raw is not None:
                draw = functools.partial(self.draw, f"{draw_path}.{key}", shapes[key])
                out[key] = self.array(raw, where, shapes[key], base=draw if draw_path else None)
            elif draw_path is not None:
                out[key] = self.draw(f"{draw_path}.{key}", shapes[key])
            else:
                raise self.ctx.err(
                    where,
                    f"missing {key}: score {score} needs " + ", ".join(SCORE_WEIGHTS[score]),
                    expected=f"shape {shape_text(shapes[key], 'x')}"
                    if d_a or key != "W_a_q"
                    else f"a {d_q} x d_a matrix",
                )
        return ScoreWeights(**out)

    def draw(self, path: str, shape: tuple[int, ...]) -> np.ndarray:
        """An array the file does not give: N(0, init_std^2), seeded by seed and key path.
        A draw beyond float64 (init_std 1e308) is an infinity, which the run reports with
        the step, as _astype's beyond float32; not numpy's RuntimeWarning first."""
        rng = np.random.default_rng([self.seed, zlib.crc32(path.encode())])
        self.drawn.append(path)
        with np.errstate(over="ignore"):
            return rng.standard_normal(shape) * self.init_std

    def weight(
        self,
        block: dict[str, Any],
        key: str,
        path: str,
        draw_path: str,
        shape: tuple[int, ...],
        dims: str = "",
    ) -> np.ndarray:
        if block.get(key) is None:
            return self.draw(draw_path, shape)
        base = lambda: self.draw(draw_path, shape)  # noqa: E731 (entries set over a drawn one)
        return self.array(block[key], path, shape, dims=dims, base=base)

    def bias(
        self, block: dict[str, Any], key: str, path: str, size: int, dims: str = ""
    ) -> np.ndarray | None:
        if block.get(key) is None:
            return None
        return self.array(block[key], path, (size,), dims=dims, base=lambda: np.zeros(size))

    # -- the document -------------------------------------------------------

    def document(self, data: dict[str, Any], variant: str | None) -> Config | OpConfig:
        self.mapping(data, "", TOP_KEYS)
        ops = [k for k in OP_KINDS if k in data]
        if "model" not in data:
            if not ops:
                raise self.ctx.err(
                    "model",
                    "missing required section 'model'",
                    expected="a 'model:' mapping with d_model (or a single operation: "
                    + ", ".join(OP_KINDS)
                    + ")",
                )
            if len(ops) > 1:
                raise self.ctx.err(
                    ops[1], "a file holds one operation", expected=f"only {ops[0]!r}"
                )
            # a model's sections (vocab, weights, source, ...) mean nothing here: never
            # silently ignored (`--set weights.x=1` on a norm file ran it unchanged)
            own = ("title", "reference", ops[0], "expect", "variants")
            other = next((k for k in data if k not in own), None)
            if other is not None:
                raise self.ctx.err(
                    other,
                    f"a single operation ('{ops[0]}:') has no {other}; it belongs to a model config",
                    data[other],
                    expected=f"only {', '.join(own)} beside '{ops[0]}:'",
                )
            variants = self.variants(data.get("variants"))
            return OpConfig(
                file=self.ctx.file,
                title=self.text(data.get("title"), "title"),
                reference=self.text(data.get("reference"), "reference"),
                kind=ops[0],
                params=self.operation(ops[0], data[ops[0]]),
                expect=self.expect(data.get("expect"), variants),
                variant=variant,
                lows=self.lows(),
            )
        if ops:
            # a --set model.x on such a file: name it (not when the file itself holds both)
            in_file = self.ctx.lines.get("model") is not None
            added = (
                [] if in_file else [k for k in self.ctx.overridden if k.split(".")[0] == "model"]
            )
            raise self.ctx.err(
                added[0] if added else ops[0],
                "a model config cannot also hold a single operation",
                expected="either a 'model:' section or one of " + ", ".join(OP_KINDS),
                found_text=f"'model:' and '{ops[0]}:'",
            )
        return self.model_document(data, variant)

    def operation(self, kind: str, value: Any) -> dict[str, Any]:
        """The parameters of a single-operation file, validated."""
        if kind == "attention":
            a = self.mapping(
                value,
                kind,
                (
                    "Q",
                    "K",
                    "V",
                    "scale",
                    "temperature",
                    "mask",
                    "score",
                    "softcap",
                    *ALL_SCORE_WEIGHTS,
                ),
            )
            for key in ("Q", "K", "V"):
                if a.get(key) is None:
                    raise self.ctx.err(
                        f"attention.{key}", f"missing {key}", expected="a matrix (rows of numbers)"
                    )
            score = self.choice(a.get("score", "scaled_dot"), "attention.score", SCORES)
            Q = self.matrix(a["Q"], "attention.Q")
            # Additive and bilinear scores compare queries and keys of different widths.
            same_width = score not in ("additive", "bilinear")
            K = self.matrix(
                a["K"],
                "attention.K",
                cols=Q.shape[1] if same_width else None,
                what="columns as Q (d_k)",
                like="attention.Q",
            )
            V = self.matrix(
                a["V"],
                "attention.V",
                rows=K.shape[0],
                what="rows as K (one value per key)",
                like="attention.K",
            )
            d_a = 0
            if score == "additive" and a.get("W_a_q") is not None:
                d_a = self.matrix(
                    a["W_a_q"],
                    "attention.W_a_q",
                    rows=Q.shape[1],
                    what="rows as Q has columns",
                    like="attention.Q",
                ).shape[1]
            # its steps hold L_q x L_k numbers four or five times, and the additive score's
            # q_a, k_a and tanh (L_q x L_k x d_a) more: an upper bound, refused before any
            # is computed, as a model is
            n_q, n_k = Q.shape[0], K.shape[0]
            additive = (n_q * n_k + n_q + n_k) * d_a if score == "additive" else 0
            total = n_q * n_k * 5 + additive + n_q * V.shape[1]
            if total > self.max_elements:
                raise self.ctx.err(
                    "attention",
                    f"too large: {n_q} queries x {n_k} keys are over the limit "
                    "(raise it with --max-elements)",
                    expected=f"at most {self.max_elements:,} numbers",
                    found_text=f"about {total:,} in its steps",
                )
            sw = self.score_weights(a, "attention", score, Q.shape[1], K.shape[1], d_a, None)
            scale, text = self.scale(
                a.get("scale", "sqrt_dk" if score == "scaled_dot" else 1),
                "attention.scale",
                K.shape[1],  # d_k, the keys' width (a bilinear W_b is d_q x d_k)
            )
            mask = None
            if a.get("mask") is not None:
                mask = self.array(
                    a["mask"], "attention.mask", (Q.shape[0], K.shape[0]), finite=False
                )
                bad = np.argwhere(np.isnan(mask) | (mask == np.inf))
                if bad.size:
                    i, j = (int(x) for x in bad[0])
                    raise self.ctx.err(
                        f"attention.mask.{i}.{j}",
                        "a mask holds 0 or -inf (or finite numbers)",
                        float(mask[i, j]),
                        "0, -inf or a finite number",
                    )
                self._subnormal(mask, np.abs(mask), "attention.mask")  # (its -inf is no note)
            cap = self.softcap(a.get("softcap"), "attention.softcap", score, "attention.score")
            return {
                "Q": Q,
                "K": K,
                "V": V,
                "scale": self.given_number(scale, "attention.scale"),
                "scale_text": text,
                "mask": mask,
                "score": score,
                **sw.arrays(),
                "temperature": self.given_number(
                    self.number(a.get("temperature", 1), "attention.temperature", positive=True),
                    "attention.temperature",
                ),
                "softcap": None if cap is None else self.given_number(cap, "attention.softcap"),
            }
        if kind == "norm":
            n = self.mapping(value, kind, ("kind", "x", "eps", "gamma", "beta"))
            norm_kind = self.choice(
                n.get("kind", "layer"), "norm.kind", ("layer", "rms", "batch", "instance")
            )
            if n.get("x") is None:
                raise self.ctx.err("norm.x", "missing x", expected="a matrix")
            x = self.array(n["x"], "norm.x", None)
            want = 3 if norm_kind == "instance" else 2
            if x.ndim != want or 0 in x.shape:
                # the override that set the kind where x is the file's (--kind over a file)
                by = "" if self.ctx.set_by("norm.x") else self.ctx.set_by("norm.kind")
                raise self.ctx.err(
                    "norm.x",
                    f"wrong shape for {norm_kind} norm{by}",
                    expected="a 3-D batch x channels x n array"
                    if want == 3
                    else "a non-empty matrix",
                    found_text=f"shape {shape_text(x.shape, 'x')}",
                )
            size = x.shape[1]

            def scale_or_shift(key: str) -> np.ndarray | None:
                """γ or β: one number per feature (per channel for instance norm) of x."""
                if n.get(key) is None:
                    return None
                arr = self.array(n[key], f"norm.{key}", None)
                if arr.shape != (size,):
                    # the override that set x where this one is the file's (--x over a file)
                    by = "" if self.ctx.set_by(f"norm.{key}") else self.ctx.set_by("norm.x")
                    per = "channel" if norm_kind == "instance" else "feature"
                    raise self.ctx.err(
                        f"norm.{key}",
                        "wrong shape" + by,
                        expected=f"shape {size} (one number per {per} of norm.x)",
                        found_text=f"shape {shape_text(arr.shape, 'x')}",
                    )
                return arr

            gamma, beta = scale_or_shift("gamma"), scale_or_shift("beta")
            return {
                "kind": norm_kind,
                "x": x,
                "gamma": gamma,
                "beta": beta,
                "eps": self.given_number(
                    self.number(n.get("eps", 1e-5), "norm.eps", minimum=0), "norm.eps"
                ),
            }
        p = self.mapping(
            value, kind, ("length", "d_model", "kind", "base", "rope_scaling", "rope_dims")
        )
        for key in ("length", "d_model"):
            if p.get(key) is None:
                raise self.ctx.err(f"pe.{key}", f"missing {key}", expected="a whole number >= 1")
        length = self.integer(p["length"], "pe.length", 1)
        d_model = self.integer(p["d_model"], "pe.d_model", 1)
        if length * d_model > self.max_elements:
            raise self.ctx.err(
                "pe",
                f"too large: {length} x {d_model} numbers are over the limit "
                "(raise it with --max-elements)",
                expected=f"at most {self.max_elements:,} numbers",
                found_text=f"{length * d_model:,}",
            )
        kind = self.choice(p.get("kind", "sinusoidal"), "pe.kind", ("sinusoidal", "rope"))
        if kind == "rope" and d_model < 2:  # its table would have no column
            raise self.ctx.err(
                "pe.d_model",
                "RoPE turns pairs of columns (2i, 2i+1), and 1 column has none",
                expected="a whole number >= 2 with kind rope",
                found_text=str(d_model),
            )
        base = self.given_number(
            self.number(p.get("base", 10000), "pe.base", positive=True), "pe.base"
        )
        return {
            "length": length,
            "d_model": d_model,
            "kind": kind,
            "base": base,
            "rope_scaling": self.rope_scaling(
                p.get("rope_scaling"), "pe.rope_scaling", kind, "pe.kind", base
            ),
            "rope_dims": self.rope_dims(p.get("rope_dims"), "pe.rope_dims", p, d_model),
        }

    def matrix(
        self,
        value: Any,
        path: str,
        rows: int | None = None,
        cols: int | None = None,
        what: str = "",
        like: str = "",
    ) -> np.ndarray:
        """A non-empty 2-D matrix, optionally with a given number of rows or columns (`what`
        they match: that of the matrix at `like`, named if an override set it)."""
        arr = self.array(value, path, None)
        if arr.ndim == 1 and arr.size:
            arr = arr[:, None] if (rows is not None and arr.shape[0] == rows) else arr[None, :]
        bad = arr.ndim != 2 or 0 in arr.shape
        bad = (
            bad
            or (rows is not None and arr.shape[0] != rows)
            or (cols is not None and arr.shape[1] != cols)
        )
        if bad:
            want = "a non-empty matrix" + (f" with as many {what}" if what else "")
            if rows is not None:
                want += f" ({counted(rows, 'row')})"
            if cols is not None:
                want += f" ({counted(cols, 'column')})"
            # the override that set `like` where this one is the file's (--q over a file)
            by = self.ctx.set_by(like) if like and not self.ctx.set_by(path) else ""
            raise self.ctx.err(
                path,
                "wrong shape" + by,
                expected=want,
                found_text=f"shape {shape_text(arr.shape, 'x')}",
            )
        return arr

    def variants(self, value: Any) -> set[str]:
        if value is None:
            return set()
        if not isinstance(value, dict):
            raise self.ctx.err("variants", "not a mapping of variant names", value, "a mapping")
        for name, body in value.items():
            if not isinstance(body, dict):
                raise self.ctx.err(
                    f"variants.{name}", "a variant maps dotted keys to values", body, "a mapping"
                )
        return set(value)

    def expect(self, value: Any, variants: set[str]) -> tuple[Expect, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.ctx.err("expect", "not a list of checks", value, "a list")
        out = []
        for i, item in enumerate(value):
            path = f"expect.{i}"
            item = self.mapping(item, path, EXPECT_KEYS)
            if not isinstance(item.get("step"), str):
                raise self.ctx.err(
                    join(path, "step"),
                    "missing or not a step path",
                    item.get("step"),
                    "a step path",
                )
            if "value" not in item:
                raise self.ctx.err(
                    join(path, "value"), "missing the expected value", expected="a number or matrix"
                )
            var = item.get("variant")
            if var is not None and (not isinstance(var, str) or var not in variants):
                raise self.ctx.err(
                    join(path, "variant"),
                    f"unknown variant{suggest(str(var), sorted(variants))}",
                    var,
                    "one of: " + (", ".join(sorted(variants)) or "(none defined under 'variants')"),
                )
            value = self.array(item["value"], join(path, "value"), None, finite=False)
            atol = self.number(item.get("atol", 1e-6), join(path, "atol"), minimum=0)
            document = None
            if "document" in item:
                document = self.array(
                    item["document"], join(path, "document"), value.shape, finite=False
                )
            elif "document_atol" in item:
                raise self.ctx.err(
                    join(path, "document_atol"),
                    "a tolerance for a document value the entry does not give",
                    expected="document_atol beside a `document` value",
                )
            out.append(
                Expect(
                    step=item["step"],
                    value=value,
                    atol=atol,
                    note=self.text(item.get("note"), join(path, "note")),
                    variant=var,
                    line=self.ctx.lines.get(path),
                    rtol=self.number(item.get("rtol", 0), join(path, "rtol"), minimum=0),
                    document=document,
                    document_atol=self.number(
                        item.get("document_atol", atol), join(path, "document_atol"), minimum=0
                    ),
                )
            )
        return tuple(out)

    def model_section(self, value: Any) -> ModelConfig:
        m = self.mapping(value, "model", MODEL_KEYS)
        p = "model."
        if "d_model" not in m:
            raise self.ctx.err(
                "model.d_model", "missing required key d_model", expected="a whole number >= 1"
            )
        d_model = self.integer(m["d_model"], p + "d_model", 1)
        n_heads = self.integer(m.get("n_heads", 1), p + "n_heads", 1)
        n_kv_heads = self.integer(m.get("n_kv_heads", n_heads), p + "n_kv_heads", 1)
        if n_kv_heads > n_heads or n_heads % n_kv_heads:
            raise self.ctx.err(
                p + "n_kv_heads",
                f"n_kv_heads {n_kv_heads} does not divide n_heads {n_heads}: each K/V head "
                "serves the same number of query heads" + self.ctx.set_by("model.n_heads"),
                expected=f"a whole number from 1 to {n_heads} dividing n_heads {n_heads}",
                found_text=str(n_kv_heads),
            )
        if "d_k" in m:
            d_k = self.integer(m["d_k"], p + "d_k", 1)
        else:
            if d_model % n_heads:
                raise self.ctx.err(
                    p + "n_heads",
                    f"d_model {d_model} is not divisible by n_heads {n_heads}, so d_k has no default",
                    expected="n_heads dividing d_model, or an explicit model.d_k",
                )
            d_k = d_model // n_heads
        d_v = self.integer(m.get("d_v", d_k), p + "d_v", 1)
        d_ff = self.integer(m.get("d_ff", 4 * d_model), p + "d_ff", 1)
        enc = self.integer(m.get("encoder_layers", 1), p + "encoder_layers", 0)
        dec = self.integer(m.get("decoder_layers", 0), p + "decoder_layers", 0)
        if enc == 0 and dec == 0:
            raise self.ctx.err(
                p + "encoder_layers",
                "the model has no layers",
                expected="encoder_layers or decoder_layers >= 1",
            )
        norm_position = self.choice(
            m.get("norm_position", "post"), p + "norm_position", NORM_POSITIONS
        )
        embed_scale_raw = m.get("embed_scale", 1)
        if embed_scale_raw == "sqrt_d_model":
            embed_scale, embed_text = math.sqrt(d_model), root_text("sqrt(d_model)", d_model)
        else:
            if isinstance(embed_scale_raw, str):
                raise self.ctx.err(
                    p + "embed_scale",
                    "not a number or sqrt_d_model",
                    embed_scale_raw,
                    "a number or sqrt_d_model",
                )
            embed_scale = self.number(embed_scale_raw, p + "embed_scale")
            embed_text = exact(embed_scale)
        score = self.choice(m.get("score", "scaled_dot"), p + "score", SCORES)
        # Only the scaled dot product divides by sqrt(d_k) unless told; the others by 1.
        scale, scale_text = self.scale(
            m.get("scale", "sqrt_dk" if score == "scaled_dot" else 1), p + "scale", d_k
        )
        config = ModelConfig(
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            d_k=d_k,
            d_v=d_v,
            d_ff=d_ff,
            encoder_layers=enc,
            decoder_layers=dec,
            positional=self.choice(m.get("positional", "sinusoidal"), p + "positional", POSITIONAL),
            rope_pairs=self.choice(
                m.get("rope_pairs", "adjacent"), p + "rope_pairs", tuple(ROPE_PAIRS)
            ),
            **self.rope_layers(m, p, enc, dec),
            rope_dims=self.rope_dims(m.get("rope_dims"), p + "rope_dims", m, d_k),
            alibi_slopes=self.alibi_slopes(
                m.get("alibi_slopes"),
                p + "alibi_slopes",
                m.get("positional", "sinusoidal"),  # (checked above)
                n_heads,
            ),
            max_len=self.integer(m.get("max_len", 128), p + "max_len", 1),
            token_types=self.integer(m.get("token_types", 0), p + "token_types", 0),
            embed_scale=embed_scale,
            embed_scale_text=embed_text,
            norm_position=norm_position,
            parallel=self.parallel(
                m.get("parallel", "none"), p + "parallel", norm_position, enc, dec
            ),
            final_norm=self.boolean(m.get("final_norm", norm_position != "post"), p + "final_norm"),
            embed_norm=self.boolean(m.get("embed_norm", False), p + "embed_norm"),
            norm=self.choice(m.get("norm", "layer"), p + "norm", NORM_KINDS),
            norm_eps=self.number(m.get("norm_eps", 1e-5), p + "norm_eps", minimum=0),
            qk_norm=self.qk_norm(m.get("qk_norm", "none"), p + "qk_norm", score),
            activation=self.choice(m.get("activation", "relu"), p + "activation", ACTIVATIONS),
            scale=scale,
            scale_text=scale_text,
            temperature=self.number(m.get("temperature", 1), p + "temperature", positive=True),
            score=score,
            d_a=self.integer(m.get("d_a", d_k), p + "d_a", 1),
            seed=self.integer(m.get("seed", 0), p + "seed", 0),
            init_std=self.number(m.get("init_std", 1.0), p + "init_std", minimum=0),
            tie_embeddings=self.boolean(m.get("tie_embeddings", False), p + "tie_embeddings"),
            dtype=self.choice(m.get("dtype", "float64"), p + "dtype", DTYPES),
            **self.windows(m.get("window"), p + "window", enc, dec),
            attn_softcap=self.softcap(m.get("attn_softcap"), p + "attn_softcap", score),
            logit_softcap=self.softcap(m.get("logit_softcap"), p + "logit_softcap"),
            logit_scale=self.logit_scale(m.get("logit_scale"), p + "logit_scale"),
            attn_sinks=self.attn_sinks(m.get("attn_sinks", False), p + "attn_sinks", score),
            **self.experts(m, enc, dec),
            **self.shared_expert(m, p, d_ff),
            **self.swiglu_oss(m, p),
        )
        if config.dtype == "float32":  # a given number float32 cannot hold is refused
            # (not pe_base nor init_std: used in float64, the angles and draws then stored)
            # (a cap divides, then multiplies; a logit scale of 0 is refused as a divisor's)
            divisors = ("scale", "temperature", *SOFTCAPS, "logit_scale")
            for key in ("embed_scale", "norm_eps", *divisors, *SWIGLU_OSS_DEFAULTS):
                if getattr(config, key) is None:  # a cap that is off
                    continue
                why = outside_float32(getattr(config, key), divisor=key in divisors)
                if why is not None:
                    raise self.ctx.err(p + key, why[0], getattr(config, key), why[1])
        return config

    def rope_layers(self, m: dict[str, Any], p: str, enc: int, dec: int) -> dict[str, Any]:
        """model.pe_base (a number > 0) and model.rope_scaling (`rope_scaling`): one for every
        layer, or either a list of one per decoder layer (Gemma 3's local and global RoPE:
        [10000, 10000, 1000000, ...], [null, null, {type: linear, factor: 8}, ...]), only in
        a decoder-only RoPE model. -> ModelConfig's pe_base, rope_scaling, layer_pe_bases
        and layer_rope_scalings"""
        positional = m.get("positional", "sinusoidal")  # (checked before)
        raw_bases, raw_scalings = m.get("pe_base", 10000), m.get("rope_scaling")

        def scaling(value: Any, path: str, base: float, base_key: str) -> RopeScaling | None:
            return self.rope_scaling(value, path, positional, p + "positional", base, base_key)

        if not isinstance(raw_bases, list) and not isinstance(raw_scalings, list):
            base = self.number(raw_bases, p + "pe_base", positive=True)
            return {
                "pe_base": base,
                "rope_scaling": scaling(raw_scalings, p + "rope_scaling", base, p + "pe_base"),
            }
        for key, value in (("pe_base", raw_bases), ("rope_scaling", raw_scalings)):
            if isinstance(value, list):
                self.layer_list(value, p + key, positional, enc, dec)
        # each layer's base (None: no RoPE) and its key path, then its scaling, checked
        # against that base
        bases: list[tuple[float | None, str]]
        if isinstance(raw_bases, list):
            bases = [
                (
                    None if b is None else self.number(b, f"{p}pe_base.{l}", positive=True),
                    f"{p}pe_base.{l}",
                )
                for l, b in enumerate(raw_bases)
            ]
            self.some_rope(bases, p)
        else:
            bases = [(self.number(raw_bases, p + "pe_base", positive=True), p + "pe_base")] * dec
        turned = [(b, key) for b, key in bases if b is not None]  # the layers with RoPE
        if isinstance(raw_scalings, list):
            scalings: list[RopeScaling | None] = []
            for l, value in enumerate(raw_scalings):
                layer_base, base_key = bases[l]
                if layer_base is None:  # no RoPE to rescale
                    self.no_scaling(value, f"{p}rope_scaling.{l}", base_key)
                    scalings.append(None)
                else:
                    scalings.append(scaling(value, f"{p}rope_scaling.{l}", layer_base, base_key))
        else:  # one scaling, checked against each base (yarn's needs one other than 1), of
            # the layers with RoPE only
            each = [scaling(raw_scalings, p + "rope_scaling", *b) for b in dict.fromkeys(turned)]
            scalings = [None if b is None else each[0] for b, _ in bases]
        layers = tuple(b for b, _ in bases), tuple(scalings)
        if len(set(zip(*layers, strict=True))) == 1:  # one RoPE for every layer
            return {"pe_base": layers[0][0], "rope_scaling": layers[1][0]}
        first = next(l for l, b in enumerate(layers[0]) if b is not None)  # a turning layer's
        return {
            "pe_base": layers[0][first],
            "rope_scaling": layers[1][first],
            "layer_pe_bases": layers[0],
            "layer_rope_scalings": layers[1],
        }

    def some_rope(self, bases: list[tuple[float | None, str]], p: str) -> None:
        """Refuse a list of bases every entry of which is null: no layer would turn q and k."""
        if all(b is None for b, _ in bases):
            raise self.ctx.err(
                p + "pe_base",
                "a null base leaves its layer without RoPE, and every entry is null: no "
                "layer would turn q and k",
                expected="a base (a number > 0) for at least one layer, or model.positional: "
                "none for a model without positions",
                found_text=f"a list of {counted(len(bases), 'null')}",
            )

    def no_scaling(self, value: Any, path: str, base_key: str) -> None:
        """Refuse a RoPE scaling for a layer whose base (at `base_key`) is null: that layer
        has no RoPE whose frequencies it could rescale."""
        if value is not None:
            raise self.ctx.err(
                path,
                f"a RoPE scaling rescales a layer's RoPE frequencies, and {base_key} is null: "
                "that layer has no RoPE",
                value,
                f"null for {path}, or a base for {base_key}",
            )

    def layer_list(self, value: list[Any], path: str, positional: str, enc: int, dec: int) -> None:
        """Refuse a list of model.pe_base or model.rope_scaling (`path`) but one entry per
        decoder layer of a decoder-only RoPE model: sinusoidal positions have one base, and
        no per-layer RoPE of an encoder is settled."""
        noun = "base" if path.endswith("pe_base") else "scaling"
        what = "bases" if noun == "base" else "RoPE scalings"
        if positional != "rope":
            raise self.ctx.err(
                path,
                f"a list of {what} gives each decoder layer its own RoPE, and "
                f"model.positional is {positional}" + self.ctx.set_by("model.positional"),
                expected=f"model.positional: rope beside a list, or one value for {path}",
                found_text=f"a list of {counted(len(value), noun)}",
            )
        self.per_layer(value, path, what, noun, "", enc, dec)

    def per_layer(
        self, value: list[Any], path: str, what: str, noun: str, each: str, enc: int, dec: int
    ) -> None:
        """Refuse a list of `what` at `path` (model.window, pe_base, rope_scaling, experts)
        but one entry per decoder layer of a decoder-only model (`enc` 0): `noun` counts its
        entries, `each` says what one is (` (each ...)`)."""
        if enc:
            raise self.ctx.err(
                path,
                f"a list of {what} is for a decoder-only model (one entry per decoder layer), "
                f"and encoder_layers is {enc}" + self.ctx.set_by("model.encoder_layers"),
                expected=f"model.encoder_layers: 0 beside a list, or one value for {path}",
                found_text=f"a list of {counted(len(value), noun)}",
            )
        if len(value) != dec:
            raise self.ctx.err(
                path,
                f"a list of {what} has one entry per decoder layer, and decoder_layers is "
                f"{dec}" + self.ctx.set_by("model.decoder_layers"),
                expected=f"{counted(dec, noun)}{each}, or one value for every layer",
                found_text=counted(len(value), noun),
            )

    def rope_scaling(
        self,
        value: Any,
        path: str,
        positional: str,
        positional_key: str,
        base: float,
        base_key: str = "",
    ) -> RopeScaling | None:
        """model.rope_scaling (pe.rope_scaling): null (or absent) is none; else a mapping of
        `type` (linear, llama3, yarn) and the numbers that type reads (ROPE_SCALINGS), each
        checked; only beside `positional_key`, whose value is `positional`, rope; `base`
        the frequencies' base, given at `base_key` (model.pe_base, pe.base by `path`)."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.ctx.err(path, "not a mapping", value, "a mapping: type, factor, ...")
        given = self.mapping(value, path, ROPE_SCALING_KEYS)  # (HF's names said: HF_KEYS)
        if positional != "rope":
            raise self.ctx.err(
                path,
                f"RoPE scaling rescales the rotary frequencies, and {positional_key} is "
                f"{positional}" + self.ctx.set_by(positional_key),
                expected=f"{positional_key}: rope beside {path}, or "
                f"{path}: null (a variant leaving rope sets both)",
                found_text=f"{positional_key.rsplit('.', 1)[1]} {positional}",
            )
        kinds = tuple(ROPE_SCALINGS)
        if "type" not in given:
            raise self.ctx.err(
                join(path, "type"),
                "missing required key type",
                expected="one of: " + ", ".join(kinds),
            )
        kind = given["type"]
        if isinstance(kind, str) and kind in NO_ROPE_SCALING:
            raise self.ctx.err(
                join(path, "type"),
                f"RoPE scaling {kind} {NO_ROPE_SCALING[kind]}",
                kind,
                "one of: " + ", ".join(kinds),
            )
        kind = self.choice(kind, join(path, "type"), kinds)
        needed, optional = ROPE_SCALINGS[kind]
        for key in given:
            if key != "type" and key not in needed + optional:
                raise self.ctx.err(
                    join(path, key),
                    f"type {kind} does not read {key}" + self.ctx.set_by(join(path, "type")),
                    expected=f"only type, {', '.join(needed + optional)} with type {kind}",
                )
        for key in needed:
            if key not in given:
                raise self.ctx.err(
                    join(path, key),
                    f"missing required key {key} (type {kind} reads it)",
                    expected="a whole number >= 1" if key == "original_max_len" else "a number > 0",
                )

        def positive(key: str, default: float) -> float:
            if key not in given:
                return default
            return self.given_number(
                self.number(given[key], join(path, key), positive=True), join(path, key), "float64"
            )

        factor = positive("factor", 1.0)
        original = 0  # (read by llama3 and yarn only)
        if "original_max_len" in given:
            original = self.integer(given["original_max_len"], join(path, "original_max_len"), 1)
        if kind == "linear":
            return RopeScaling(kind, factor)
        if kind == "llama3":
            low, high = positive("low_freq_factor", 0), positive("high_freq_factor", 0)
            if low >= high:
                raise self.ctx.err(
                    join(path, "high_freq_factor"),
                    "the band of smoothed frequencies runs from original_max_len / "
                    "low_freq_factor down to original_max_len / high_freq_factor: it needs "
                    "low_freq_factor < high_freq_factor",
                    expected=f"a number above low_freq_factor {exact(low)}",
                    found_text=exact(high),
                )
            return RopeScaling(kind, factor, original, low, high)
        beta_fast, beta_slow = positive("beta_fast", 32.0), positive("beta_slow", 1.0)
        if beta_fast < beta_slow:
            raise self.ctx.err(
                join(path, "beta_fast"),
                "yarn keeps the pairs that turn more than beta_fast times in original_max_len "
                "positions and rescales those turning fewer than beta_slow times: it needs "
                "beta_fast >= beta_slow",
                expected=f"a number >= beta_slow {exact(beta_slow)}",
                found_text=exact(beta_fast),
            )
        if base == 1:
            base_key = base_key or ("pe.base" if path.startswith("pe.") else "model.pe_base")
            raise self.ctx.err(
                path,
                f"yarn finds its band of pairs by dividing by ln({base_key}), and "
                f"{base_key} is 1 (every pair turns alike)" + self.ctx.set_by(base_key),
                expected=f"{base_key} other than 1 with yarn",
                found_text="1",
            )
        truncate = self.boolean(given.get("truncate", True), join(path, "truncate"))
        return RopeScaling(
            kind,
            factor,
            original,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
            truncate=truncate,
            attention_factor=self.yarn_attention(given, path, factor, positive),
        )

    def parallel(self, value: Any, path: str, norm_position: str, enc: int, dec: int) -> str:
        """model.parallel: none, separate or shared; side by side only with pre-norm (a
        post-norm would normalise the sum, which no model does: each sublayer's norm is of
        its input) and in self-attention + FFN layers (not with cross-attention, which has
        no settled place beside them)."""
        parallel = self.choice(value, path, PARALLEL)
        if parallel == "none":
            return parallel
        if norm_position != "pre":
            raise self.ctx.err(
                path,
                "a parallel layer normalises its input for the attention and the FFN and adds "
                "both to it, x + attn(Norm(x)) + ffn(Norm(x)): a pre-norm layer, and "
                f"norm_position is {norm_position}" + self.ctx.set_by("model.norm_position"),
                expected="model.norm_position: pre beside model.parallel, or parallel: none",
                found_text=f"norm_position {norm_position}",
            )
        if enc and dec:
            raise self.ctx.err(
                path,
                "parallel layers are self-attention and FFN side by side; the decoder of an "
                "encoder-decoder model has cross-attention too, with no settled place beside them",
                expected="a decoder-only (encoder_layers: 0) or encoder-only (decoder_layers: 0) "
                "model, or parallel: none",
                found_text=f"encoder_layers {enc}, decoder_layers {dec}",
            )
        return parallel

    def rope_dims(self, value: Any, path: str, m: dict[str, Any], width: int) -> int:
        """model.rope_dims (pe.rope_dims): null (or absent) is 0, every column; else the
        columns RoPE turns, an even number from 2 to `width` (d_k; pe.d_model), only beside
        positional (pe.kind) rope."""
        if value is None:
            return 0
        dims = self.integer(value, path, 2)
        model = path.startswith("model.")
        key, width_key = ("positional", "d_k") if model else ("kind", "d_model")
        kind = m.get(key, "sinusoidal")
        if kind != "rope":
            raise self.ctx.err(
                path,
                f"rope_dims counts the columns RoPE turns, and {key} is {kind}"
                + self.ctx.set_by(path.split(".")[0] + "." + key),
                expected=f"{key}: rope beside rope_dims, or no rope_dims",
                found_text=f"{key} {kind}",
            )
        if dims % 2 or dims > width:
            raise self.ctx.err(
                path,
                f"RoPE turns pairs of columns among the first rope_dims of {width_key} {width}",
                expected=f"an even whole number from 2 to {width_key} {width}",
                found_text=str(dims),
            )
        return dims

    def yarn_attention(
        self,
        given: dict[str, Any],
        path: str,
        factor: float,
        positive: Callable[[str, float], float],
    ) -> float:
        """yarn's attention factor on cos and sin: given, or as Hugging Face derives it from
        the factor f: mscale(f, mscale) / mscale(f, mscale_all_dim) when both are given,
        else mscale(f, 1), where mscale(f, m) = 0.1 m ln f + 1 (1 for f <= 1)."""
        scales = [k for k in ("mscale", "mscale_all_dim") if k in given]
        if "attention_factor" in given and scales:
            raise self.ctx.err(
                join(path, scales[0]),
                "the attention factor is given, and mscale and mscale_all_dim only derive it",
                expected="attention_factor, or mscale and mscale_all_dim, not both",
            )
        if len(scales) == 1:
            other = ({"mscale", "mscale_all_dim"} - set(scales)).pop()
            raise self.ctx.err(
                join(path, scales[0]),
                f"the attention factor is mscale(factor, mscale) / mscale(factor, "
                f"mscale_all_dim): {scales[0]} without {other} is not read",
                expected=f"{other} beside {scales[0]}, or neither",
            )

        def mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        if "attention_factor" in given:
            return positive("attention_factor", 1.0)
        if scales:
            return mscale(positive("mscale", 1.0)) / mscale(positive("mscale_all_dim", 1.0))
        return mscale(1.0)

    def qk_norm(self, value: Any, path: str, score: str) -> str:
        """model.qk_norm: none or head; head only beside a score of a dot product of Q and
        K (QK_NORM_SCORES), whose size it bounds: additive's tanh(q W_a_q + k W_a_k) and
        gaussian's distances are no such product, and no model normalises for them."""
        qk_norm = self.choice(value, path, QK_NORMS)
        if qk_norm != "none" and score not in QK_NORM_SCORES:
            raise self.ctx.err(
                path,
                f"QK-norm normalises the queries and keys of a dot-product score, and "
                f"model.score is {score}" + self.ctx.set_by("model.score"),
                expected=f"model.score {', '.join(QK_NORM_SCORES[:-1])} or "
                f"{QK_NORM_SCORES[-1]} beside qk_norm {qk_norm}, or qk_norm none",
                found_text=f"model.score: {score}",
            )
        return qk_norm

    def alibi_slopes(
        self, value: Any, path: str, positional: str, n_heads: int
    ) -> tuple[float, ...] | None:
        """model.alibi_slopes: null (or absent) is the paper's rule (ops.alibi_slopes); else
        one slope > 0 per head, each used exactly as written; only with positional alibi."""
        if value is None:
            return None
        if positional != "alibi":
            raise self.ctx.err(
                path,
                f"ALiBi's slopes are given, and model.positional is {positional}"
                + self.ctx.set_by("model.positional"),
                expected=f"model.positional: alibi beside {path}, or {path}: null "
                "(a variant leaving alibi sets both)",
                found_text=f"positional {positional}",
            )
        slopes = self.array(value, path, (n_heads,), dims="n_heads")
        if (slopes <= 0).any():
            where, at = _first(path, slopes <= 0)
            raise self.ctx.err(
                where,
                "an ALiBi slope must be positive: B = −m·(i − j) is a penalty growing with "
                "the distance",
                float(slopes[at]),
                "a number > 0",
            )
        return tuple(float(x) for x in slopes)

    def experts(
        self, m: dict[str, Any], encoder_layers: int, decoder_layers: int
    ) -> dict[str, Any]:
        """model.experts E (null or absent: a dense FFN), or a list of one such per decoder
        layer (Qwen-MoE's dense mlp_only_layers among sparse ones); experts_top_k k, 1 <= k
        <= every E, required beside it, and experts_normalize (default true, Mixtral's);
        the two are refused without experts. -> ModelConfig's experts, layer_experts,
        experts_top_k, experts_normalize"""
        value = m.get("experts")
        layers = self.layer_experts(value, encoder_layers, decoder_layers)
        if not any(layers):
            for key in ("experts_top_k", "experts_normalize"):
                if m.get(key) is not None:
                    raise self.ctx.err(
                        f"model.{key}",
                        f"{key} is a setting of a mixture of experts, and model.experts "
                        + (
                            "is not given (a dense FFN)"
                            if value is None
                            else "gives no layer experts"
                        )
                        + self.ctx.set_by("model.experts"),
                        expected=f"model.experts: the number of experts beside model.{key}, "
                        f"or no {key}",
                        found_text=f"{key} without experts",
                    )
            return {}
        E = min(e for e in layers if e)  # (the fewest of a sparse layer bounds k)
        where = "model.experts" + (f".{layers.index(E)}" if isinstance(value, list) else "")
        if m.get("experts_top_k") is None:
            raise self.ctx.err(
                "model.experts_top_k",
                "missing required key experts_top_k (how many experts each token is sent to)",
                expected=f"a whole number from 1 to {where} ({E})",
            )
        k = self.integer(m["experts_top_k"], "model.experts_top_k", 1)
        if k > E:
            raise self.ctx.err(
                "model.experts_top_k",
                f"more experts per token than {where} ({E})" + self.ctx.set_by("model.experts"),
                expected=f"a whole number from 1 to {E}",
                found_text=str(k),
            )
        normalize = m.get("experts_normalize", True)
        return {
            "experts": max(layers),
            "layer_experts": layers if len(set(layers)) > 1 else (),
            "experts_top_k": k,
            "experts_normalize": self.boolean(normalize, "model.experts_normalize"),
        }

    def shared_expert(self, m: dict[str, Any], p: str, d_ff: int) -> dict[str, Any]:
        """model.shared_expert: none (default), gated (Qwen2-MoE's σ(X w_g) times the
        shared FFN) or plain (DeepSeek's, added as it is), only beside model.experts; and
        model.shared_expert_d_ff, its width (default d_ff), only beside a shared expert.
        -> ModelConfig's shared_expert and shared_expert_d_ff"""
        kind = self.choice(m.get("shared_expert", "none"), p + "shared_expert", SHARED_EXPERTS)
        if kind == "none":
            if m.get("shared_expert_d_ff") is not None:
                raise self.ctx.err(
                    p + "shared_expert_d_ff",
                    "shared_expert_d_ff is the width of a shared expert, and "
                    "model.shared_expert is none" + self.ctx.set_by("model.shared_expert"),
                    expected="model.shared_expert: gated or plain beside it, or no "
                    "shared_expert_d_ff",
                    found_text="shared_expert_d_ff without a shared expert",
                )
            return {}
        experts = m.get("experts")  # (checked before: a number, or a list of numbers and nulls)
        if experts is None or (isinstance(experts, list) and all(e is None for e in experts)):
            raise self.ctx.err(
                p + "shared_expert",
                "a shared expert is beside a mixture's routed experts, and model.experts is "
                "not given (a dense FFN)" + self.ctx.set_by("model.experts"),
                expected="model.experts beside model.shared_expert, or shared_expert: none",
                found_text=f"shared_expert: {kind}",
            )
        width = m.get("shared_expert_d_ff")
        return {
            "shared_expert": kind,
            "shared_expert_d_ff": d_ff
            if width is None
            else self.integer(width, p + "shared_expert_d_ff", 1),
        }

    def layer_experts(
        self, value: Any, encoder_layers: int, decoder_layers: int
    ) -> tuple[int, ...]:
        """model.experts as each layer's experts (0: a dense FFN): one number (or null) for
        every layer, or a list of one per decoder layer, only for a decoder-only model (as
        model.window's list)."""
        path = "model.experts"
        if not isinstance(value, list):
            return (0 if value is None else self.integer(value, path, 1),)
        each = " (each a whole number >= 1 of experts, or null: a dense FFN)"
        self.per_layer(value, path, "experts", "expert count", each, encoder_layers, decoder_layers)
        return tuple(
            0 if e is None else self.integer(e, f"{path}.{l}", 1) for l, e in enumerate(value)
        )

    def swiglu_oss(self, m: dict[str, Any], p: str) -> dict[str, Any]:
        """model.swiglu_limit (> 0) and model.swiglu_alpha (> 0), GPT-OSS's defaults 7 and
        1.702 where not given, with activation swiglu_oss only: refused beside any other.
        -> ModelConfig's swiglu_limit and swiglu_alpha"""
        activation = m.get("activation", "relu")  # (checked before)
        if activation != "swiglu_oss":
            key = next((k for k in SWIGLU_OSS_DEFAULTS if m.get(k) is not None), None)
            if key is not None:
                raise self.ctx.err(
                    p + key,
                    f"{key} is a setting of GPT-OSS's clamped SwiGLU, and model.activation "
                    f"is {activation}" + self.ctx.set_by("model.activation"),
                    expected=f"model.activation: swiglu_oss beside {p}{key}, or no {key}",
                    found_text=f"model.activation: {activation}",
                )
            return {}
        return {  # (null, as absent: the default)
            key: self.number(default if m.get(key) is None else m[key], p + key, positive=True)
            for key, default in SWIGLU_OSS_DEFAULTS.items()
        }

    def windows(
        self, value: Any, path: str, encoder_layers: int, decoder_layers: int
    ) -> dict[str, Any]:
        """model.window: null (or absent) is unlimited, 0; else a whole number >= 1 of keys
        each causal self-attention query sees; or a list of one such (or null: full
        attention) per decoder layer, Gemma 2's [4096, null, ...]. Only a decoder-only
        model: the encoder's self-attention is bidirectional, and no sliding window of it
        is settled. -> ModelConfig's window and layer_windows"""
        if not isinstance(value, list):
            return {"window": self.window(value, path, encoder_layers)}
        each = " (each a whole number >= 1, or null: full attention)"
        # (beside an encoder each entry is refused as a window is: `window`)
        self.per_layer(value, path, "windows", "window", each, 0, decoder_layers)
        layers = tuple(self.window(w, f"{path}.{l}", encoder_layers) for l, w in enumerate(value))
        return {"window": layers[0] if len(set(layers)) == 1 else 0, "layer_windows": layers}

    def window(self, value: Any, path: str, encoder_layers: int) -> int:
        """One window of model.window (see `windows`): null is unlimited, 0."""
        if value is None:
            return 0
        window = self.integer(value, path, 1)
        if encoder_layers:
            raise self.ctx.err(
                path,
                "a sliding window is for a decoder-only model (an encoder's self-attention is "
                f"not causal), and encoder_layers is {encoder_layers}"
                + self.ctx.set_by("model.encoder_layers"),
                expected="model.encoder_layers: 0 beside model.window, or no window",
                found_text=str(window),
            )
        return window

    def softcap(
        self, value: Any, path: str, score: str | None = None, score_key: str = "model.score"
    ) -> float | None:
        """model.attn_softcap, model.logit_softcap (attention.softcap): null (or absent) is
        off; else the cap c > 0 of s ↦ c · tanh(s / c). The attention's only beside a
        dot-product score (`score`, at `score_key`; SOFTCAP_SCORES), whose size it bounds."""
        if value is None:
            return None
        cap = self.number(value, path, positive=True)
        if score is not None and score not in SOFTCAP_SCORES:
            raise self.ctx.err(
                path,
                f"a soft cap bounds a dot-product score, and {score_key} is "
                f"{score} (additive's v_aᵀ tanh(…) is bounded already, gaussian's is never "
                "positive)" + self.ctx.set_by(score_key),
                expected=f"{score_key} {', '.join(SOFTCAP_SCORES[:-1])} or "
                f"{SOFTCAP_SCORES[-1]} beside {path}, or {path}: null",
                found_text=f"{score_key}: {score}",
            )
        return cap

    def logit_scale(self, value: Any, path: str) -> float | None:
        """model.logit_scale: null (or absent) is none; else the number s > 0 the logits
        are multiplied by (Cohere's logit_scale; one <= 0 would erase or reverse their order)."""
        return None if value is None else self.number(value, path, positive=True)

    def attn_sinks(self, value: Any, path: str, score: str) -> bool:
        """model.attn_sinks: a learned sink logit per self-attention head (GPT-OSS); only
        beside a dot-product score (SINK_SCORES), on whose scale GPT-OSS learns it."""
        on = self.boolean(value, path)
        if on and score not in SINK_SCORES:
            raise self.ctx.err(
                path,
                "an attention sink is a logit beside the scaled dot products (GPT-OSS's), and "
                f"model.score is {score}: no sink of its scores is settled"
                + self.ctx.set_by("model.score"),
                expected=f"model.score {', '.join(SINK_SCORES[:-1])} or {SINK_SCORES[-1]} "
                f"beside {path}: true, or {path}: false",
                found_text=f"model.score: {score}",
            )
        return on

    def check_size(self, m: ModelConfig, n_vocab: int, lengths: Sequence[int]) -> None:
        """Refuse, before allocating anything, a model whose arrays would be too large.

        An upper bound on the numbers one run holds: every weight (the q/k/v ones twice,
        as fused weights are split into copies) and every traced step (trace_size); each
        array and step also counts OBJECT_COST numbers, for the Python objects that keep
        it (a million layers of d_model 2 hold few numbers, but many objects)."""
        d, H, dk, dv, dff, V = m.d_model, m.n_heads, m.d_k, m.d_v, m.d_ff, n_vocab
        enc, dec = m.encoder_layers, m.decoder_layers
        qkv = H * (d * (2 * dk + dv) + 2 * dk + dv)
        attn = 2 * qkv + H * dv * d + 3 * d  # + W_o, b_o, gamma, beta
        attn += 2 * sum(m.qk_norm_width) if m.qk_norm != "none" else 0  # QK-norm's γ, β
        attn += 2 * d if m.norm_position == "sandwich" else 0  # post_norm's gamma and beta
        attn += H * (dk * dk + 2 * dk * m.d_a + m.d_a + dk)  # score weights, at most
        ffn = 2 * d * dff + dff + (5 if m.norm_position == "sandwich" else 3) * d
        ffn += m.experts * (3 * d * dff + 2 * dff + d) + (d + 1) * m.experts  # experts, router
        shared = m.shared_expert != "none"  # the shared expert's FFN and shared_gate
        ffn += shared * (3 * d * m.shared_expert_d_ff + 2 * m.shared_expert_d_ff + 2 * d)
        blocks = enc + dec * (2 if enc else 1)  # attention blocks
        total = blocks * attn + (enc + dec) * ffn + 8 * d  # + the final and embedding norms
        total += 2 * V * d + V + (m.max_len * d if m.positional == "learned" else 0)
        total += m.token_types * d
        if m.positional == "relative":  # a table per self-attention head
            total += (enc + dec) * H * (2 * m.max_len - 1)
        total += trace_size(m, max(lengths, default=1), V)
        # The weight arrays, at most: per head 6, 3 score weights, a rel_bias and a sink; per block W_o,
        # b_o, gamma, beta and QK-norm's 4; per FFN 6; an embedding per token; a few more.
        total += OBJECT_COST * (
            blocks * (11 * H + 8) + (enc + dec) * (6 * (1 + m.experts) + 7 * shared) + V + 8
        )
        if total > self.max_elements:
            # every size the bound grows with, so that the one at fault is in sight
            extra = f", d_a {m.d_a}" if m.score in ("bilinear", "additive") else ""
            if m.positional in BOUNDED_POSITIONAL:
                extra += f", max_len {m.max_len} ({BOUNDED_POSITIONAL[m.positional]})"
            if m.token_types:
                extra += f", token_types {m.token_types}"
            raise self.ctx.err(
                "model",
                "too large: the model's arrays would be over the limit "
                "(raise it with --max-elements)",
                expected=f"at most {self.max_elements:,} numbers",
                found_text=f"up to about {total:,} (an upper bound) for d_model {d}, "
                f"{H} head(s) of d_k {dk} / d_v {dv}, d_ff {dff}{extra}, {enc} + {dec} "
                f"layer(s), {V} token(s) of vocab and sequences of up to "
                f"{max(lengths, default=1)} tokens",
            )

    def model_document(self, data: dict[str, Any], variant: str | None) -> Config:
        m = self.model_section(data["model"])
        self.seed, self.init_std, self.dtype = m.seed, m.init_std, m.dtype
        # its single numbers, each noted in the dtype it is used in: pe_base and init_std
        # in float64 (the angles and the draws are computed so, then stored in the dtype)
        for key in ("embed_scale", "norm_eps", "scale", "temperature"):
            self.given_number(getattr(m, key), "model." + key)
        self.given_number(m.init_std, "model.init_std", "float64")
        for l, base in enumerate(m.layer_pe_bases or (m.pe_base,)):  # (each layer's, a list)
            if base is not None:  # (a layer without RoPE has none)
                self.given_number(
                    base, "model.pe_base" + (f".{l}" if m.layer_pe_bases else ""), "float64"
                )
        d = m.d_model
        vocab = self.vocab(data.get("vocab"), data.get("embeddings"))
        vocab_set = set(vocab)
        tokens = self.tokens(data.get("tokens"), vocab_set)

        src_raw, tgt_raw = data.get("source"), data.get("target")
        # Rough sizes first (before any array is built) for the element limit.
        lengths = [
            len(v) if isinstance(v, list) else len(str(v).split())
            for v in (src_raw, tgt_raw)
            if v is not None
        ]
        self.check_size(m, len(vocab), lengths)

        embeddings = self.embeddings(data.get("embeddings"), vocab, d)
        source = target = None
        if m.encoder_layers:
            if src_raw is None:
                raise self.ctx.err(
                    "source",
                    "missing source: the encoder needs an input",
                    expected="tokens, a string or an L x d_model matrix",
                )
            source = self.sequence(src_raw, "source", vocab_set, d)
        elif src_raw is not None:
            raise self.ctx.err(
                "source",
                "a decoder-only model (encoder_layers: 0) reads target, not source",
                src_raw,
                "no source",
            )
        if m.decoder_layers:
            if tgt_raw is not None:
                target = self.sequence(tgt_raw, "target", vocab_set, d)
        elif tgt_raw is not None:
            raise self.ctx.err(
                "target",
                "an encoder-only model (decoder_layers: 0) has no target",
                tgt_raw,
                "no target",
            )
        for seq, name in ((source, "source"), (target, "target")):
            if seq is not None and m.positional in BOUNDED_POSITIONAL and len(seq) > m.max_len:
                raise self.ctx.err(
                    name,
                    f"longer than model.max_len ({m.max_len}) " + BOUNDED_POSITIONAL[m.positional],
                    expected=f"at most {counted(m.max_len, 'token')}",
                    found_text=f"{len(seq)} tokens",
                )
        source = self.types(data.get("source_types"), "source", source, m)
        target = self.types(data.get("target_types"), "target", target, m)

        w = self.mapping(
            data.get("weights"),
            "weights",
            (
                "encoder",
                "decoder",
                "encoder_final_norm",
                "decoder_final_norm",
                "encoder_embed_norm",
                "decoder_embed_norm",
                "positional",
                "token_types",
                "output",
            ),
        )
        encoder = self.layers(w.get("encoder"), "encoder", m.encoder_layers, m, cross=False)
        decoder = self.layers(
            w.get("decoder"), "decoder", m.decoder_layers, m, cross=m.encoder_layers > 0
        )
        enc_final = self.stack_norm(w, "encoder_final_norm", m, m.encoder_layers > 0)
        dec_final = self.stack_norm(w, "decoder_final_norm", m, m.decoder_layers > 0)
        enc_embed = self.stack_norm(w, "encoder_embed_norm", m, m.encoder_layers > 0)
        dec_embed = self.stack_norm(w, "decoder_embed_norm", m, m.decoder_layers > 0)
        positional = None
        if m.positional == "learned":
            positional = self.weight(
                w,
                "positional",
                "weights.positional",
                "positional",
                (m.max_len, d),
                "max_len x d_model",
            )
        elif w.get("positional") is not None:
            raise self.ctx.err(
                "weights.positional",
                f"learned positions given, but model.positional is {m.positional}"
                + self.ctx.set_by("model.positional"),
                expected="model.positional: learned",
            )
        token_types = None
        if m.token_types:
            token_types = self.weight(
                w,
                "token_types",
                "weights.token_types",
                "token_types",
                (m.token_types, d),
                "token_types x d_model",
            )
        elif w.get("token_types") is not None:
            raise self.ctx.err(
                "weights.token_types",
                "a token-type table is given, but model.token_types is 0 (none)"
                + self.ctx.set_by("model.token_types"),
                expected="model.token_types: the table's rows, or no weights.token_types",
            )
        output_W, output_b = self.output(w.get("output"), m, vocab)
        variants = self.variants(data.get("variants"))
        from_file = [o for o in self.ctx.origins.values() if o.array is not None and not o.pads]
        config = Config(
            file=self.ctx.file,
            title=self.text(data.get("title"), "title"),
            reference=self.text(data.get("reference"), "reference"),
            model=m,
            vocab=vocab,
            tokens=tokens,
            embeddings=embeddings,
            source=source,
            target=target,
            encoder=encoder,
            decoder=decoder,
            encoder_final_norm=enc_final,
            decoder_final_norm=dec_final,
            encoder_embed_norm=enc_embed,
            decoder_embed_norm=dec_embed,
            positional=positional,
            token_types=token_types,
            output_W=output_W,
            output_b=output_b,
            expect=self.expect(data.get("expect"), variants),
            drawn=tuple(self.drawn),
            given_fused=tuple(self.given_fused),
            variant=variant,
            overrides=tuple(  # (each once; not the empty entries an override added)
                dict.fromkeys(
                    k
                    for k in self.ctx.overridden
                    if (o := self.ctx.origins.get(k, Origin(""))).array is None and not o.pads
                )
            ),
            weights_file=next((o.by for o in from_file), None),
            weights_file_arrays=len(from_file),
            lows=self.lows(),
        )
        config = replace(config, sources=self.sources(data, config))
        if m.dtype == "float64":
            return config
        # Drawn and given numbers are read in float64 (the same numbers whatever the
        # dtype), then rounded once; the expected values of `expect` stay as written.
        dt = np.dtype(m.dtype)
        done: dict[int, np.ndarray] = {}  # (the arrays converted are alive until the end)
        return replace(
            config,
            **{
                f.name: _astype(getattr(config, f.name), dt, done)
                for f in fields(config)
                if f.name not in ("model", "expect", "sources", "notes")
            },
        )

    def sources(self, data: dict[str, Any], cfg: Config) -> dict[str, Source]:
        """Where each array handed to the engine came from (Config.sources), in the order
        of `named_arrays`, a fused weight just before the first head's part of it."""
        m = cfg.model
        drawn = {p if p.startswith("embeddings.") else f"weights.{p}": p for p in self.drawn}
        fused = {f"weights.{k}" for k in self.given_fused}

        out: dict[str, Source] = {}
        for key, value in cfg.named_arrays().items():
            sep, whole, h = head_part(key) or ("", "", "")
            name = whole.rsplit(".", 1)[-1]
            partly = self.ctx.given(key).partly if key in self.ctx.made else ()
            entries = f"; entries set by {', '.join(partly)}" if partly else ""
            if key in drawn:
                out[key] = Source(
                    "drawn",
                    f"drawn: seed {m.seed}, N(0, {exact(m.init_std)}²){entries}",
                    seed=m.seed,
                    init_std=m.init_std,
                    draw_path=drawn[key],
                    partly=partly,
                )
            elif sep and whole in fused:
                if whole not in out:
                    out[whole] = self.ctx.given(whole)
                n = value.shape[-1] if value.ndim else 1  # (a sink: one number, entry h of sinks)
                first = int(h) * n
                matrix = name.startswith("W")
                if name == "rel_bias":
                    part = f"row {h}"
                elif n == 1:
                    part = f"{'column' if matrix else 'entry'} {first}"
                else:
                    part = f"{'columns' if matrix else 'entries'} {first}..{first + n - 1}"
                # with the entries set inside the fused weight that fall in this head's part
                lo, hi = (int(h), int(h)) if name == "rel_bias" else (first, first + n - 1)
                src = self.ctx.given(whole, _in_part(1 if matrix else 0, lo, hi))
                out[key] = Source(
                    "fused",
                    f"{part} of {whole} ({src.text})",
                    fused=whole,
                    part=part,
                    fused_text=src.text,
                    partly=src.partly,
                )
            elif key.startswith("weights.") and (
                _at(data, key.split(".")) is None or key in self.ctx.made
            ):
                text = "default: " + ("ones" if key.endswith(".gamma") else "zeros")
                out[key] = Source("default", text + entries, partly=partly)
            else:
                out[key] = self.ctx.given(key)
        if m.tie_embeddings:
            tie = self.ctx.given("model.tie_embeddings")
            text = f"tied: the embeddings transposed; model.tie_embeddings from {tie.text}"
            out[TIED_OUTPUT] = replace(tie, kind="tied", text=text)
        for name in ("source", "target"):  # numbers given as the embeddings
            seq: Sequence_ | None = getattr(cfg, name)
            if seq is not None and seq.matrix is not None:
                out[name] = self.ctx.given(name)
        return out

    def vocab(self, value: Any, embeddings: Any) -> tuple[str, ...]:
        self.vocab_listed = value is not None
        if value is None:
            return tuple(str(k) for k in embeddings) if isinstance(embeddings, dict) else ()
        if not isinstance(value, list):
            raise self.ctx.err("vocab", "not a list", value, "a list of tokens")
        first: dict[str, int] = {}  # token -> its index (a dict: a 200k vocab is no wait)
        for i, tok in enumerate(value):
            if not isinstance(tok, str | int | float) or isinstance(tok, bool):
                raise self.ctx.err(f"vocab.{i}", "not a token", tok, "a string")
            tok = _token_text(tok)
            if tok in first:
                raise self.ctx.err(
                    f"vocab.{i}",
                    f"duplicate token {quoted(tok)} (first at vocab.{first[tok]})",
                    expected="each token once",
                )
            first[tok] = i
        return tuple(first)

    def of_vocab(self, vocab: Sequence[str]) -> str:
        """'a token of vocab', listing a short vocabulary, or why it has no token to list."""
        if not vocab:
            return (
                "a token of vocab (the vocab given is empty)"
                if self.vocab_listed
                else "a token (the file has no vocab or embeddings)"
            )
        shown = ", ".join(vocab[:12]) + (", …" if len(vocab) > 12 else "")
        return f"a token of vocab ({shown})"

    def tokens(self, value: Any, vocab: set[str]) -> Tokens:
        t = self.mapping(value, "tokens", ("bos", "eos", "pad"))
        out: dict[str, str | None] = {}
        for key in ("bos", "eos", "pad"):
            tok = t.get(key)
            if tok is not None:
                if not isinstance(tok, str | int | float) or isinstance(tok, bool):
                    raise self.ctx.err(
                        f"tokens.{key}", "not a token", tok, self.of_vocab(sorted(vocab))
                    )
                tok = _token_text(tok)
                if tok not in vocab:
                    raise self.ctx.err(
                        f"tokens.{key}",
                        f"token {quoted(tok)} is not in the vocabulary{suggest(tok, sorted(vocab))}",
                        expected=self.of_vocab(sorted(vocab)),
                    )
            out[key] = tok
        return Tokens(**out)

    def embeddings(self, value: Any, vocab: tuple[str, ...], d: int) -> dict[str, np.ndarray]:
        given = value if value is not None else {}
        if not isinstance(given, dict):
            raise self.ctx.err("embeddings", "not a mapping", given, "a mapping token -> vector")
        out: dict[str, np.ndarray] = {}
        known = set(vocab)  # (a tuple's `in` made this quadratic: 20 s for GPT-2's 50,257)
        for tok in given:
            if tok not in known:
                raise self.ctx.err(
                    f"embeddings.{tok}",
                    f"token {quoted(tok)} is not in the vocabulary{suggest(tok, vocab)}",
                    expected=self.of_vocab(vocab),
                )
        for tok in vocab:
            if tok in given and given[tok] is not None:
                draw = functools.partial(self.draw, f"embeddings.{tok}", (d,))
                out[tok] = self.array(
                    given[tok], f"embeddings.{tok}", (d,), dims="d_model", base=draw
                )
            else:
                out[tok] = self.draw(f"embeddings.{tok}", (d,))
        return out

    def sequence(self, value: Any, path: str, vocab: set[str], d: int) -> Sequence_:
        if isinstance(value, str):
            toks: list[Any] = value.split()
        elif isinstance(value, list):
            if value and all(isinstance(v, list) for v in value):
                matrix = self.array(value, path, None)
                if matrix.ndim != 2 or matrix.shape[1] != d:
                    raise self.ctx.err(
                        path,
                        "wrong shape for a numeric sequence",
                        expected=f"shape L x {d} (d_model {d})",
                        found_text=f"shape {shape_text(matrix.shape, 'x')}",
                    )
                return Sequence_(tokens=None, matrix=matrix)
            toks = value
        else:
            raise self.ctx.err(
                path, "not a sequence", value, "a list of tokens, a string or a matrix"
            )
        if not toks:
            raise self.ctx.err(path, "empty sequence", expected="at least one token")
        out = []
        for i, tok in enumerate(toks):
            if isinstance(tok, list | dict) or tok is None or isinstance(tok, bool):
                raise self.ctx.err(join(path, i), "not a token", tok, "a token of vocab")
            tok = _token_text(tok)
            if tok not in vocab:
                raise self.ctx.err(
                    join(path, i),
                    f"unknown token {quoted(tok)}{suggest(tok, sorted(vocab))}",
                    expected=self.of_vocab(sorted(vocab)),
                )
            out.append(tok)
        return Sequence_(tokens=tuple(out))

    def types(
        self, value: Any, name: str, seq: Sequence_ | None, m: ModelConfig
    ) -> Sequence_ | None:
        """`seq` with the token type of each position (`<name>_types`; all 0 when not
        given) when the model has token types; types given without them are refused."""
        path = f"{name}_types"
        n = m.token_types
        if value is not None and not n:
            raise self.ctx.err(
                path,
                "token types given, but model.token_types is 0 (the model has none)"
                + self.ctx.set_by("model.token_types"),
                expected=f"model.token_types >= 1 beside {path}, or no {path}",
                found_text=f"{path} and model.token_types: 0",
            )
        if value is not None and seq is None:
            reads = (
                f"the model reads no {name} (encoder_layers: 0)"
                if name == "source"
                else "the model reads no target (decoder_layers: 0)"
                if not m.decoder_layers
                else "no target is given (the decoder starts from [tokens.bos], type 0)"
            )
            raise self.ctx.err(
                path,
                f"token types for {name}, but {reads}",
                expected=f"{path} beside a {name}, or no {path}",
                found_text=f"{path} and no {name}",
            )
        if seq is None or not n:
            return seq
        if value is None:
            return replace(seq, types=(0,) * len(seq))
        expected = f"a list of {counted(len(seq), 'whole number')} from 0 to {n - 1}"
        if not isinstance(value, list):
            raise self.ctx.err(path, "not a list of token types", value, expected)
        if len(value) != len(seq):
            raise self.ctx.err(
                path,
                f"{counted(len(value), 'token type')} for the {counted(len(seq), 'position')} "
                f"of {name}" + self.ctx.set_by(name),
                expected=f"one type per position of {name}: {expected}",
                found_text=counted(len(value), "type"),
            )
        types = []
        for i, raw in enumerate(value):
            t = self.integer(raw, join(path, i), 0)
            if t >= n:
                shown = exact(raw) if isinstance(raw, float) else str(t)  # 1e+308, not 309 digits
                raise self.ctx.err(
                    join(path, i),
                    f"type {shown} is beyond the token-type table (model.token_types {n}: "
                    f"types 0 to {n - 1})" + self.ctx.set_by("model.token_types"),
                    expected=f"a whole number from 0 to {n - 1}",
                    found_text=shown,
                )
            types.append(t)
        return replace(seq, types=tuple(types), types_given=True)

    def norm(self, value: Any, path: str, d: int, dims: str = "d_model") -> NormWeights:
        """γ and β of d numbers (`dims` names d), ones and zeros where not given."""
        n = self.mapping(value, path, ("gamma", "beta"))
        gamma = (
            self.array(n["gamma"], f"{path}.gamma", (d,), dims=dims, base=lambda: np.ones(d))
            if n.get("gamma") is not None
            else np.ones(d)
        )
        beta = (
            self.array(n["beta"], f"{path}.beta", (d,), dims=dims, base=lambda: np.zeros(d))
            if n.get("beta") is not None
            else np.zeros(d)
        )
        return NormWeights(gamma, beta)

    def attention(
        self, value: Any, path: str, m: ModelConfig, relative: bool = False
    ) -> AttentionWeights:
        """Per-head or fused attention weights; fused W_q/W_k/W_v are split by columns,
        a fused rel_bias (`relative`: a self-attention of positional relative) by rows.

        Grouped-query attention (model.n_kv_heads < n_heads): W_k, W_v, b_k, b_v are
        the K/V heads' (fused n_kv_heads·d_k wide, or per K/V head in `kv_heads`), and
        each query head's HeadWeights holds its K/V head's arrays themselves, shared."""
        p = f"weights.{path}"
        projections = ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v")
        per_head = (*projections, "rel_bias", "sink")  # the keys with a per-head and a fused
        fused_names = [FUSED_NAMES.get(k, k) for k in per_head]  # form; the fused ones' names
        a = self.mapping(
            value,
            p,
            [
                "heads",
                "kv_heads",
                *fused_names,
                "q_norm",
                "k_norm",
                "W_o",
                "b_o",
                "norm",
                "post_norm",
            ],
        )
        d, H, dk, dv = m.d_model, m.n_heads, m.d_k, m.d_v
        kv_keys = KV_KEYS if m.grouped else ()  # held by the K/V heads, not the query heads
        fused_keys = [k for k in fused_names if a.get(k) is not None]
        heads_raw, kv_raw = a.get("heads"), a.get("kv_heads")
        if kv_raw is not None and not m.grouped:
            raise self.ctx.err(
                f"{p}.kv_heads",
                f"kv_heads is for grouped-query attention, and model.n_kv_heads is n_heads "
                f"({H})" + self.ctx.set_by("model.n_kv_heads", "model.n_heads"),
                expected="W_k/W_v in heads: [...] or fused, or model.n_kv_heads below n_heads",
                found_text="kv_heads",
            )
        for listed, entries in (("heads", heads_raw), ("kv_heads", kv_raw)):
            if entries is None or not fused_keys or not isinstance(entries, list):
                continue
            # Fused projections may still come with per-head score weights.
            for h, entry in enumerate(entries):
                given = [k for k in per_head if isinstance(entry, dict) and k in entry]
                if given:
                    # fused ones from a weights_file, when the error names the YAML's head
                    origins = [(k, self.ctx.origins.get(f"{p}.{k}")) for k in fused_keys]
                    npz = [(k, o) for k, o in origins if o is not None and o.array is not None]
                    source = (
                        f" (fused {npz[0][0]} from weights_file {npz[0][1].by}, "
                        f"array {quoted(str(npz[0][1].array))})"
                        if npz
                        else ""
                    )
                    raise self.ctx.err(
                        f"{p}.{listed}.{h}.{given[0]}",
                        f"one form per block: per-head '{listed}' and fused weights are both "
                        "given" + source,
                        expected=f"either {listed}: [...] or fused W_q/W_k/W_v (rel_bias, sinks) "
                        "(with fused weights, heads may hold only score weights)",
                        found_text=f"fused {', '.join(fused_keys)} beside {listed}.{h}.{given[0]}",
                    )
        sizes = {"W_q": dk, "W_k": dk, "W_v": dv, "b_q": dk, "b_k": dk, "b_v": dv}
        names = {k: "d_v" if k.endswith("v") else "d_k" for k in sizes}
        n_offsets = 2 * m.max_len - 1  # offsets −(max_len − 1) .. +(max_len − 1)
        fused: dict[str, np.ndarray] = {}
        if "rel_bias" in fused_keys:
            if not relative:
                self.refuse_rel_bias(f"{p}.rel_bias", m, path)
            fused["rel_bias"] = self.array(
                a["rel_bias"],
                f"{p}.rel_bias",
                (H, n_offsets),
                dims=f"n_heads x (2·max_len − 1), max_len {m.max_len}",
            )
            self.given_fused.append(f"{path}.rel_bias")
        if "sinks" in fused_keys:
            if not m.attn_sinks or path.endswith("cross_attn"):
                self.refuse_sink(f"{p}.sinks", path)
            fused["sinks"] = self.array(a["sinks"], f"{p}.sinks", (H,), dims="n_heads")
            self.given_fused.append(f"{path}.sinks")
        for k in (k for k in fused_keys if k in projections):
            n, count = (m.n_kv_heads, "n_kv_heads") if k in kv_keys else (H, "n_heads")
            shape = (d, n * sizes[k]) if k.startswith("W") else (n * sizes[k],)
            dims = f"{count}·{names[k]}"
            dims = f"d_model x {dims}" if k.startswith("W") else dims
            fused[k] = self.array(a[k], f"{p}.{k}", shape, dims=dims)
            self.given_fused.append(f"{path}.{k}")

        def part(k: str, h: int) -> np.ndarray:
            """Head h's columns of a fused weight (entries of a bias): a contiguous copy,
            as numpy multiplies a strided view by another loop than BLAS, and the fused
            form must give the per-head numbers bit for bit."""
            cols = slice(h * sizes[k], (h + 1) * sizes[k])
            return np.ascontiguousarray(fused[k][:, cols] if k.startswith("W") else fused[k][cols])

        def projection(entry: dict[str, Any], k: str, listed: str, h: int) -> np.ndarray | None:
            """Head h's W_q/W_k/... (or K/V head h's, `listed` kv_heads): fused, given or drawn."""
            if k in fused:
                return part(k, h)
            at, draw_at = f"{p}.{listed}.{h}.{k}", f"{path}.{listed}.{h}.{k}"
            if k.startswith("W"):
                return self.weight(entry, k, at, draw_at, (d, sizes[k]), f"d_model x {names[k]}")
            return self.bias(entry, k, at, sizes[k], names[k])

        kv: list[dict[str, np.ndarray | None]] = []  # the K/V heads' arrays (grouped only)
        if m.grouped:
            kv_entries = self.head_entries(kv_raw, f"{p}.kv_heads", m.n_kv_heads, kv_keys)
            kv = [
                {k: projection(kd, k, "kv_heads", j) for k in kv_keys}
                for j, kd in enumerate(kv_entries)
            ]
        qk = {name: self.qk_norm_weights(a.get(name), f"{p}.{name}", m) for name in QK_KEYS}
        heads: list[HeadWeights] = []
        for h, hd in enumerate(
            self.head_entries(heads_raw, f"{p}.heads", H, (*per_head, *ALL_SCORE_WEIGHTS), m)
        ):
            hp = f"{p}.heads.{h}"
            arrays: dict[str, np.ndarray | None] = {}
            if "rel_bias" in fused:  # head h's row, a contiguous copy
                arrays["rel_bias"] = np.ascontiguousarray(fused["rel_bias"][h])
            elif hd.get("rel_bias") is not None:
                if not relative:
                    self.refuse_rel_bias(f"{hp}.rel_bias", m, path)
                arrays["rel_bias"] = self.array(
                    hd["rel_bias"],
                    f"{hp}.rel_bias",
                    (n_offsets,),
                    dims=f"2·max_len − 1, max_len {m.max_len}",
                    base=functools.partial(self.draw, f"{path}.heads.{h}.rel_bias", (n_offsets,)),
                )
            elif relative:
                arrays["rel_bias"] = self.draw(f"{path}.heads.{h}.rel_bias", (n_offsets,))
            arrays["sink"] = self.sink(hd, fused.get("sinks"), hp, path, h, m)
            for k in sizes:
                # a shared K/V head's arrays are the same objects in each of its query heads
                arrays[k] = kv[m.kv_head(h)][k] if k in kv_keys else projection(hd, k, "heads", h)
            sw = self.score_weights(hd, hp, m.score, dk, dk, m.d_a, f"{path}.heads.{h}")
            heads.append(HeadWeights(**arrays, score=sw, **qk))  # type: ignore[arg-type]
        return AttentionWeights(
            heads=tuple(heads),
            W_o=self.weight(
                a, "W_o", f"{p}.W_o", f"{path}.W_o", (H * dv, d), "n_heads·d_v x d_model"
            ),
            b_o=self.bias(a, "b_o", f"{p}.b_o", d, "d_model"),
            norm=self.norm(a.get("norm"), f"{p}.norm", d),
            post_norm=self.post_norm(a.get("post_norm"), f"{p}.post_norm", m),
        )

    def qk_norm_weights(self, value: Any, path: str, m: ModelConfig) -> NormWeights | None:
        """A block's q_norm or k_norm with model.qk_norm on (γ, β of d_k with head; of
        n_heads·d_k or n_kv_heads·d_k with projection), else None; given where QK-norm is
        off, refused."""
        name = path.rsplit(".", 1)[-1]
        if m.qk_norm == "head":
            return self.norm(value, path, m.d_k, "d_k")
        if m.qk_norm == "projection":
            q, k = m.qk_norm_width
            if name == "q_norm":
                return self.norm(value, path, q, "n_heads·d_k (qk_norm projection)")
            return self.norm(value, path, k, "n_kv_heads·d_k (qk_norm projection)")
        if value is not None:
            raise self.ctx.err(
                path,
                "QK-norm weights are given but model.qk_norm is none"
                + self.ctx.set_by("model.qk_norm"),
                expected=f"model.qk_norm: head or projection, or no {name}",
                found_text="model.qk_norm: none",
            )
        return None

    def post_norm(self, value: Any, path: str, m: ModelConfig) -> NormWeights | None:
        """A sublayer's post_norm, the norm of its output (γ, β of d_model), with
        model.norm_position sandwich, else None; given in another placement, refused."""
        if m.norm_position == "sandwich":
            return self.norm(value, path, m.d_model)
        if value is not None:
            raise self.ctx.err(
                path,
                "a post_norm (the norm of the sublayer's output, beside norm on its input) is "
                f"given but model.norm_position is {m.norm_position}"
                + self.ctx.set_by("model.norm_position"),
                expected="model.norm_position: sandwich, or no post_norm",
                found_text=f"model.norm_position: {m.norm_position}",
            )
        return None

    def bounded_list(self, raw: Any, path: str, n: int, unit: str, more: str, of: str) -> list[Any]:
        """`raw` as a list of at most n entries, one per `unit` (none: empty); more than
        n are refused as `more {more} than {of} (n)`."""
        if raw is not None and not isinstance(raw, list):
            raise self.ctx.err(path, "not a list", raw, f"a list of {n} (one entry per {unit})")
        entries = raw or []
        if len(entries) > n:
            raise self.ctx.err(
                f"{path}.{n}",
                f"more {more} than {of} ({n})",
                expected=f"at most {counted(n, unit)}",
                found_text=f"{len(entries)} {unit}s",
            )
        return entries

    def head_entries(
        self,
        raw: Any,
        path: str,
        n: int,
        allowed: Sequence[str],
        grouped: ModelConfig | None = None,
    ) -> list[dict[str, Any]]:
        """The n entries of a `heads` (or `kv_heads`) list, each a mapping of `allowed`
        keys (an empty one where the list is short). `grouped`: the model, when these are
        the query heads of grouped-query attention, whose W_k/W_v/b_k/b_v are refused."""
        what = "K/V head" if path.endswith("kv_heads") else "head"
        of = "model.n_kv_heads" if what == "K/V head" else "model.n_heads"
        entries = self.bounded_list(raw, path, n, what, f"{what}s", of)
        out = []
        for h in range(n):
            entry = entries[h] if h < len(entries) else None
            if grouped is not None and grouped.grouped and isinstance(entry, dict):
                given = [k for k in KV_KEYS if k in entry]
                if given:
                    m = grouped
                    raise self.ctx.err(
                        f"{path}.{h}.{given[0]}",
                        f"under grouped-query attention (model.n_kv_heads {m.n_kv_heads} < "
                        f"n_heads {m.n_heads}) {given[0]} belongs to the K/V heads"
                        + self.ctx.set_by("model.n_kv_heads", "model.n_heads"),
                        expected=f"{given[0]} in kv_heads.{m.kv_head(h)} (or fused, "
                        f"n_kv_heads·{'d_v' if given[0].endswith('v') else 'd_k'} wide)",
                        found_text=f"{given[0]} in heads.{h}",
                    )
            out.append(self.mapping(entry, f"{path}.{h}", allowed))
        return out

    def sink(
        self,
        entry: dict[str, Any],
        fused: np.ndarray | None,
        hp: str,
        path: str,
        h: int,
        m: ModelConfig,
    ) -> np.ndarray | None:
        """Head h's sink logit with model.attn_sinks in a self-attention block (`path`):
        entry h of the block's `fused` sinks, its own `sink` (a number), or drawn under
        `<path>.heads.<h>.sink`; None elsewhere, where a given one is refused."""
        sinks = m.attn_sinks and not path.endswith("cross_attn")
        if entry.get("sink") is not None and not sinks:
            self.refuse_sink(f"{hp}.sink", path)
        if not sinks:
            return None
        if fused is not None:  # entry h, a 0-d copy
            return np.array(fused[h])
        draw = functools.partial(self.draw, f"{path}.heads.{h}.sink", ())
        if entry.get("sink") is None:
            return draw()
        return self.array(entry["sink"], f"{hp}.sink", (), dims="a number", base=draw)

    def refuse_sink(self, where: str, path: str) -> NoReturn:
        """A sink where the model has none: a cross-attention (GPT-OSS's sinks are its
        self-attention's; none of another sequence's keys is settled) or attn_sinks off."""
        if path.endswith("cross_attn"):
            raise self.ctx.err(
                where,
                "attention sinks are a self-attention's (GPT-OSS's decoder); none is settled "
                "for cross-attention",
                expected="a sink only in self_attn blocks",
                found_text="a sink in cross_attn",
            )
        raise self.ctx.err(
            where,
            "an attention sink is given, but model.attn_sinks is false"
            + self.ctx.set_by("model.attn_sinks"),
            expected="model.attn_sinks: true, or no sink",
            found_text="model.attn_sinks: false",
        )

    def refuse_rel_bias(self, where: str, m: ModelConfig, path: str) -> NoReturn:
        """A rel_bias where the model has none: a cross-attention (its keys are another
        sequence) or a model whose positional is not relative (alibi's is fixed)."""
        if path.endswith("cross_attn"):
            raise self.ctx.err(
                where,
                "cross-attention has no relative position bias (its keys are another sequence)",
                expected="rel_bias only in self_attn blocks",
                found_text="rel_bias in cross_attn",
            )
        if m.positional == "alibi":
            raise self.ctx.err(
                where,
                "ALiBi's bias is fixed, not learned: B = −m·(i − j) with each head's slope "
                "m = 2^(−8(h+1)/H) (or model.alibi_slopes), no table to give"
                + self.ctx.set_by("model.positional"),
                expected="no rel_bias with model.positional: alibi (or positional: relative)",
                found_text="a rel_bias",
            )
        raise self.ctx.err(
            where,
            f"a relative position bias is given, but model.positional is {m.positional}"
            + self.ctx.set_by("model.positional"),
            expected="model.positional: relative, or no rel_bias",
            found_text=f"model.positional: {m.positional}",
        )

    def ffn(
        self,
        value: Any,
        path: str,
        m: ModelConfig,
        shared: NormWeights | None = None,
        layer: int | None = None,
    ) -> FFNWeights | MoEWeights:
        """An FFN's weights (a mixture of experts' where its layer has experts: decoder
        layer `layer`'s entry of model.experts' list); with a `shared` norm (model.parallel:
        shared, the attention's), it has none of its own, and giving one is refused."""
        p = f"weights.{path}"
        E = m.experts if layer is None else m.experts_of(layer)
        setting = "model.experts" + (f".{layer}" if m.layer_experts and layer is not None else "")
        keys = ("W_1", "b_1", "W_3", "b_3", "W_2", "b_2")
        moe = ("router", "router_bias", "experts", "shared", "shared_gate")
        f = self.mapping(value, p, (*keys, *moe, "norm", "post_norm"))
        if shared is not None and f.get("norm") is not None:
            raise self.ctx.err(
                f"{p}.norm",
                "with one shared norm the FFN reads the attention's, self_attn.norm: it has "
                "no norm of its own" + self.ctx.set_by("model.parallel"),
                expected=f"no ffn.norm (the norm's weights under {p.removesuffix('ffn')}"
                "self_attn.norm), or model.parallel: separate",
                found_text="model.parallel: shared",
            )
        own = [k for k in (moe if not E else keys) if f.get(k) is not None]
        if own and E:
            raise self.ctx.err(
                f"{p}.{own[0]}",
                f"with {setting} ({E}) each expert has its own {own[0]}"
                + self.ctx.set_by("model.experts"),
                expected=f"{p}.experts.<e>.{own[0]} (e from 0 to {E - 1}), or no "
                f"{setting} (a dense FFN)",
                found_text=f"{own[0]} of the whole FFN",
            )
        if own:
            given = "is null (a dense FFN)" if setting != "model.experts" else "is not given"
            raise self.ctx.err(
                f"{p}.{own[0]}",
                f"{own[0]} belongs to a mixture of experts, and {setting} {given}"
                + self.ctx.set_by("model.experts"),
                expected=f"{setting} and model.experts_top_k beside {own[0]}, or no {own[0]}",
                found_text=f"{own[0]} in a dense FFN",
            )
        norm = self.norm(f.get("norm"), f"{p}.norm", m.d_model) if shared is None else shared
        post_norm = self.post_norm(f.get("post_norm"), f"{p}.post_norm", m)
        if not E:
            return self.dense_ffn(f, path, m, norm, post_norm)
        router = self.weight(
            f, "router", f"{p}.router", f"{path}.router", (m.d_model, E), "d_model x experts"
        )
        entries = self.bounded_list(
            f.get("experts"), f"{p}.experts", E, "expert", "experts", setting
        )
        experts = tuple(
            self.dense_ffn(
                self.mapping(entries[e] if e < len(entries) else None, f"{p}.experts.{e}", keys),
                f"{path}.experts.{e}",
                m,
                norm,
                None,
            )
            for e in range(E)
        )
        router_bias = self.bias(f, "router_bias", f"{p}.router_bias", E, "experts")
        for key, needs in (("shared", ("gated", "plain")), ("shared_gate", ("gated",))):
            if f.get(key) is not None and m.shared_expert not in needs:
                raise self.ctx.err(
                    f"{p}.{key}",
                    f"{key} belongs to a {' or '.join(needs)} shared expert, and "
                    f"model.shared_expert is {m.shared_expert}"
                    + self.ctx.set_by("model.shared_expert"),
                    expected=f"model.shared_expert: {' or '.join(needs)} beside {key}, or no {key}",
                    found_text=f"model.shared_expert: {m.shared_expert}",
                )
        common = (  # the shared expert (a name apart from `shared`, the shared norm)
            self.dense_ffn(
                self.mapping(f.get("shared"), f"{p}.shared", keys),
                f"{path}.shared",
                m,
                norm,
                None,
                m.shared_expert_d_ff,
            )
            if m.shared_expert != "none"
            else None
        )
        gate = (
            self.weight(
                f,
                "shared_gate",
                f"{p}.shared_gate",
                f"{path}.shared_gate",
                (m.d_model, 1),
                "d_model x 1",
            )
            if m.shared_expert == "gated"
            else None
        )
        return MoEWeights(
            router=router,
            experts=experts,
            norm=norm,
            post_norm=post_norm,
            router_bias=router_bias,
            shared=common,
            shared_gate=gate,
        )

    def dense_ffn(
        self,
        f: dict[str, Any],
        path: str,
        m: ModelConfig,
        norm: NormWeights,
        post_norm: NormWeights | None,
        d_ff: int | None = None,
    ) -> FFNWeights:
        """A dense FFN's W_1, b_1, (gated: W_3, b_3), W_2, b_2 under `path` (a mixture's
        expert: `decoder.0.ffn.experts.1`; its shared expert, of width `d_ff`:
        `decoder.0.ffn.shared`), drawn by the SPEC's rule where not given."""
        p = f"weights.{path}"
        ff, ff_name = (m.d_ff, "d_ff") if d_ff is None else (d_ff, "shared_expert_d_ff")
        if not m.gated:
            for key in ("W_3", "b_3"):
                if f.get(key) is not None:
                    self.refuse_up(f"{p}.{key}", key, m)
        return FFNWeights(
            W_1=self.weight(
                f, "W_1", f"{p}.W_1", f"{path}.W_1", (m.d_model, ff), f"d_model x {ff_name}"
            ),
            b_1=self.bias(f, "b_1", f"{p}.b_1", ff, ff_name),
            W_3=self.weight(
                f, "W_3", f"{p}.W_3", f"{path}.W_3", (m.d_model, ff), f"d_model x {ff_name}"
            )
            if m.gated
            else None,
            b_3=self.bias(f, "b_3", f"{p}.b_3", ff, ff_name),
            W_2=self.weight(
                f, "W_2", f"{p}.W_2", f"{path}.W_2", (ff, m.d_model), f"{ff_name} x d_model"
            ),
            b_2=self.bias(f, "b_2", f"{p}.b_2", m.d_model, "d_model"),
            norm=norm,
            post_norm=post_norm,
        )

    def refuse_up(self, where: str, key: str, m: ModelConfig) -> NoReturn:
        """W_3 or b_3, the up projection of a gated FFN, where the FFN is not gated."""
        raise self.ctx.err(
            where,
            f"{key} is the up projection of a gated FFN, but model.activation is "
            f"{m.activation}" + self.ctx.set_by("model.activation"),
            expected=f"model.activation: {', '.join([*GATES][:-1])} or {[*GATES][-1]}, or no {key}",
            found_text=f"model.activation: {m.activation}",
        )

    def layers(
        self, value: Any, stack: str, n: int, m: ModelConfig, cross: bool
    ) -> tuple[LayerWeights, ...]:
        p = f"weights.{stack}"
        value = self.bounded_list(value, p, n, "layer", f"{stack} layers", f"model.{stack}_layers")
        keys = ("self_attn", "cross_attn", "ffn") if stack == "decoder" else ("self_attn", "ffn")
        out = []
        for l in range(n):
            layer = self.mapping(value[l] if l < len(value) else None, f"{p}.{l}", keys)
            if not cross and layer.get("cross_attn") is not None:
                raise self.ctx.err(
                    f"{p}.{l}.cross_attn",
                    "a decoder-only model (encoder_layers: 0) has no cross-attention",
                    expected="no cross_attn",
                )
            self_attn = self.attention(
                layer.get("self_attn"),
                f"{stack}.{l}.self_attn",
                m,
                relative=m.positional == "relative",
            )
            # (in the paper's order, so what is drawn is listed, and checked, in it)
            cross_attn = (
                self.attention(layer.get("cross_attn"), f"{stack}.{l}.cross_attn", m)
                if cross
                else None
            )
            shared = self_attn.norm if m.parallel == "shared" else None
            ffn = self.ffn(layer.get("ffn"), f"{stack}.{l}.ffn", m, shared, l)
            out.append(LayerWeights(self_attn=self_attn, ffn=ffn, cross_attn=cross_attn))
        return tuple(out)

    def stack_norm(
        self, w: dict[str, Any], key: str, m: ModelConfig, has_stack: bool
    ) -> NormWeights | None:
        """A stack's final norm (`encoder_final_norm`) or embedding norm
        (`decoder_embed_norm`): its weights when the model has it, else None; given
        weights for a norm the model does not have are refused."""
        final = key.endswith("_final_norm")
        switch = "model.final_norm" if final else "model.embed_norm"
        if has_stack and (m.final_norm if final else m.embed_norm):
            return self.norm(w.get(key), f"weights.{key}", m.d_model)
        if w.get(key) is not None:
            reason = f"{switch} is off" if has_stack else "the model has no such stack"
            cause = ""
            if has_stack:
                cause = self.ctx.set_by(switch, *(["model.norm_position"] if final else []))
            what = "a final norm" if final else "an embedding norm"
            stack = key.split("_", 1)[0]
            raise self.ctx.err(
                f"weights.{key}",
                f"{what} is given but {reason}{cause}",
                expected="no " + key,
                found_text=f"{switch}: false" if has_stack else f"model.{stack}_layers: 0",
            )
        return None

    def output(
        self, value: Any, m: ModelConfig, vocab: tuple[str, ...]
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        o = self.mapping(value, "weights.output", ("W", "b"))
        V = len(vocab)
        if m.tie_embeddings and o.get("W") is not None:
            self.refuse_tied_entry(m, vocab)
            raise self.ctx.err(
                "weights.output.W",
                "output.W is given but model.tie_embeddings is on (the output uses the embeddings)"
                + self.ctx.set_by("model.tie_embeddings"),
                expected="no output.W with tied embeddings",
            )
        if V == 0:
            if o:
                raise self.ctx.err(
                    "weights.output", "output weights need a vocab", expected="a vocab"
                )
            return None, None
        W = (
            None
            if m.tie_embeddings
            else self.weight(
                o, "W", "weights.output.W", "output.W", (m.d_model, V), "d_model x vocab size"
            )
        )
        return W, self.bias(o, "b", "weights.output.b", V, "vocab size")

    def refuse_tied_entry(self, m: ModelConfig, vocab: tuple[str, ...]) -> None:
        """An entry of output.W set with tied embeddings: name the embedding's entry that
        holds it (the output weight is the embeddings transposed: W[i, j] is entry i of
        token j's embedding)."""
        tied = "output.W is the embeddings transposed, as model.tie_embeddings is on"
        tied += self.ctx.set_by("model.tie_embeddings")
        for key in self.ctx.entries("weights.output.W"):
            at = key.split(".")[3:]
            if not 1 <= len(at) <= 2 or not all(whole_number(n) for n in at):
                continue
            i, j = int(at[0]), int(at[-1])
            if len(at) == 1 and i < m.d_model:  # a row: entry i of every embedding
                raise self.ctx.err(
                    key,
                    f"{tied}: its row {i} is entry {i} of every token's embedding",
                    expected=f"each entry set there: embeddings.<token>.{i}=VALUE",
                )
            if len(at) == 2 and i < m.d_model and j < len(vocab):
                raise self.ctx.err(
                    key,
                    f"{tied}: its entry {i}, {j} is entry {i} of the embedding of token "
                    + quoted(vocab[j]),
                    expected=f"that entry set there: embeddings.{vocab[j]}.{i}=VALUE",
                )


def head_part(key: str) -> tuple[str, str, str] | None:
    """A per-head weight's key split: `weights.<block>.heads.<h>.<name>` (or
    `kv_heads.<h>`) -> ("heads", `weights.<block>.<name>`, h), the list, the fused
    weight it is a part of, and the head; None for a key of no head."""
    found = re.fullmatch(r"(.*)\.((?:kv_)?heads)\.(\d+)\.([^.]+)", key)
    if found is None:
        return None
    block, listed, h, name = found.groups()
    return listed, f"{block}.{FUSED_NAMES.get(name, name)}", h


def _astype(value: Any, dtype: np.dtype[Any], done: dict[int, np.ndarray] | None = None) -> Any:
    """Every array inside `value` (arrays, tuples, mappings, weight dataclasses) in `dtype`;
    an array met twice (a K/V head's W_k in each query head of its group) becomes one
    array, converted once (`done`: by the id of the array, what it became).

    A given number beyond float32 was refused; a drawn one (init_std 1e39) becomes an
    infinity, which the run reports as an overflow, naming the step."""
    done = {} if done is None else done
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f":
            return value
        if id(value) not in done:
            with np.errstate(over="ignore"):
                done[id(value)] = value.astype(dtype)
        return done[id(value)]
    if isinstance(value, tuple):
        return tuple(_astype(v, dtype, done) for v in value)
    if isinstance(value, Mapping):
        return {k: _astype(v, dtype, done) for k, v in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        return replace(
            value, **{f.name: _astype(getattr(value, f.name), dtype, done) for f in fields(value)}
        )
    return value


def _token_text(tok: Any) -> str:
    if isinstance(tok, float) and tok.is_integer():
        return str(int(tok))
    return str(tok)
