"""The engine against Hugging Face's Cohere (CohereForCausalLM, Command R) and Cohere 2
(Cohere2ForCausalLM, Command R7B), float64, eval.

Small random models, every parameter drawn anew (hf_common.draw_parameters: γ near 1),
are converted here by the mapping written below (nested YAML data, fused form) and
checked to 1e-12: every hidden state, every head's attention weights
(`output_attentions`), the logits, and `generate --greedy` against
`generate(do_sample=False)`; each wrong variant of the mapping fails.

The conventions mapped:
- CohereDecoderLayer: x + attn(LN(x)) + mlp(LN(x)), one `input_layernorm` both read:
  `parallel: shared`, its weights `self_attn.norm` (no `ffn.norm`).
- CohereLayerNorm: (x − mean)/√(var + ε) · weight, no bias: LayerNorm with β 0 (`gamma`
  only given: a norm's β is 0 where not given).
- rotary: `rotate_half` here takes columns (2i, 2i+1) together (x[..., ::2], x[..., 1::2])
  and the frequencies are `repeat_interleave`d: `rope_pairs: adjacent`, over the whole
  head, base `rope_theta`.
- CohereMLP: down(silu(gate(x)) · up(x)), `swiglu`; q, k, v, o without bias (default
  `attention_bias: False`); tied embeddings; `logits · logit_scale`:
  `model.logit_scale`.
- Cohere 2: `layer_types` (every `sliding_window_pattern`-th layer full): a sliding layer
  attends to its last `sliding_window` keys and turns q and k by RoPE, a full one sees
  every key and turns nothing (NoPE): `model.window` and `model.pe_base` as lists, a
  full layer's entries null.
- `use_qk_norm` (Cohere, off by default) is a LayerNorm over each head whose weight is
  per head (n_heads × head_dim): trace-tf's QK-norm shares one γ among the heads of a
  block, so the mapping refuses it.
- Four float32 internals are replaced by their float64 formulas under `float64`: the
  LayerNorm (cast to float32), the rotary angles (torch.float), apply_rotary_pos_emb
  (q.float(), k.float()) and the eager softmax (dtype=torch.float32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import shape_id
from hf_common import (
    assert_greedy_matches,
    assert_matches,
    assert_recipe_runs,
    decode_json,
    draw_parameters,
    eager_float64,
    hf_outputs,
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from transformers import Cohere2Config, Cohere2ForCausalLM, CohereConfig, CohereForCausalLM
from transformers.models.cohere import modeling_cohere
from transformers.models.cohere2 import modeling_cohere2

PROMPT = 7  # tokens: longer than every window below

# Cohere's shapes (CohereConfig's own: vocab 256000, hidden 8192, 40 layers of 64 heads,
# MLP 22528, 8192 positions, logit_scale 0.0625; rotary_config sets 13 tokens, 32
# positions, MLP 2 × hidden, every head its own K/V head unless given)
SHAPES: list[dict[str, Any]] = [
    dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, logit_scale=0.5),
    dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
         logit_scale=0.0625, rope_theta=100.0, layer_norm_eps=1e-3),
    dict(hidden_size=24, num_attention_heads=3, num_key_value_heads=1, num_hidden_layers=2,
         intermediate_size=20, logit_scale=0.25, vocab_size=11),
]  # fmt: skip

# Cohere 2's (Cohere2Config's own as Cohere's, sliding_window 4096, every 4th layer
# full): windows below the prompt, the full layer last (pattern 4) or in between
SHAPES2: list[dict[str, Any]] = [
    dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=4, sliding_window=2,
         logit_scale=0.5),
    dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
         sliding_window=3, logit_scale=0.25, rope_theta=100.0,
         layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
]  # fmt: skip


def layer_norm_float64(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """CohereLayerNorm.forward (Cohere2LayerNorm's is the same) without its casts to float32."""
    mean = hidden_states.mean(-1, keepdim=True)
    variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
    return self.weight * ((hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon))


def rotary_float64(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
    """CohereRotaryEmbedding.forward with its angles in float64: pos · θ^(−2i/d), each
    frequency repeated for the pair's two columns (repeat_interleave, as its own)."""
    c = self.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    base = c.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.repeat_interleave(freqs, 2, dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_float64(modeling: ModuleType) -> Callable[..., Any]:
    """`modeling`'s apply_rotary_pos_emb without its casts of q and k to float32."""

    def apply(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        turn = modeling.rotate_half
        return q * cos + turn(q) * sin, k * cos + turn(k) * sin

    return apply


@contextmanager
def float64_of(modeling: ModuleType, prefix: str) -> Iterator[pytest.MonkeyPatch]:
    """HF's Cohere (or Cohere 2) with its four float32 computations done in float64."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(getattr(modeling, f"{prefix}LayerNorm"), "forward", layer_norm_float64)
        mp.setattr(getattr(modeling, f"{prefix}RotaryEmbedding"), "forward", rotary_float64)
        mp.setattr(modeling, "apply_rotary_pos_emb", rotate_float64(modeling))
        mp.setattr(modeling, "eager_attention_forward", eager_float64)
        yield mp


def float64() -> Any:
    return float64_of(modeling_cohere, "Cohere")


def float64_2() -> Any:
    return float64_of(modeling_cohere2, "Cohere2")


def cohere(shape: dict[str, Any], seed: int) -> CohereForCausalLM:
    return draw_parameters(CohereForCausalLM(rotary_config(CohereConfig, shape)), seed)


def cohere2(shape: dict[str, Any], seed: int) -> Cohere2ForCausalLM:
    shape = dict(shape)
    types = shape.pop("layer_types", None)
    config = rotary_config(Cohere2Config, shape)
    if types is not None:
        config.layer_types = types
    return draw_parameters(Cohere2ForCausalLM(config), seed)


def to_config(model: Any, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form; a
    Cohere 2 (its config has layer_types) with its windows and RoPE by layer."""
    c = model.config
    if getattr(c, "use_qk_norm", False):
        raise ValueError("use_qk_norm: a LayerNorm over each head with a weight per head")
    assert c.rope_parameters["rope_type"] == "default"
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    layers = []
    for l in range(c.num_hidden_layers):
        a, f = f"model.layers.{l}.self_attn", f"model.layers.{l}.mlp"
        attn = {f"W_{x}": p[f"{a}.{x}_proj.weight"].T for x in "qkvo"}
        attn["norm"] = {"gamma": p[f"model.layers.{l}.input_layernorm.weight"]}  # β 0
        ffn = {  # no norm: the MLP reads input_layernorm's
            "W_1": p[f"{f}.gate_proj.weight"].T,
            "W_3": p[f"{f}.up_proj.weight"].T,
            "W_2": p[f"{f}.down_proj.weight"].T,
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    theta = float(c.rope_parameters["rope_theta"])
    model_data: dict[str, Any] = {
        "d_model": c.hidden_size,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "d_ff": c.intermediate_size,
        "encoder_layers": 0,
        "decoder_layers": c.num_hidden_layers,
        "positional": "rope",
        "rope_pairs": "adjacent",
        "pe_base": theta,
        "norm_position": "pre",
        "parallel": "shared",
        "norm": "layer",
        "norm_eps": c.layer_norm_eps,
        "activation": "swiglu",
        "tie_embeddings": True,
        "logit_scale": c.logit_scale,
    }
    if hasattr(c, "layer_types"):  # Cohere 2: RoPE and a window in the sliding layers only
        sliding = [t == "sliding_attention" for t in c.layer_types]
        model_data["window"] = [c.sliding_window if s else None for s in sliding]
        model_data["pe_base"] = [theta if s else None for s in sliding]
    wte = p["model.embed_tokens.weight"]
    return listed(
        {
            "model": model_data,
            "vocab": vocab,
            "embeddings": {t: wte[i] for i, t in enumerate(vocab)},
            "target": [vocab[i] for i in prompt],
            "weights": {
                "decoder": layers,
                "decoder_final_norm": {"gamma": p["model.norm.weight"]},
            },
        }
    )


def expected_of(model: Any, prompt: list[int]) -> dict[str, np.ndarray]:
    with float64() if isinstance(model, CohereForCausalLM) else float64_2():
        return hf_outputs(model, prompt)


def test_the_drawn_models_are_not_hf_s_init() -> None:
    """γ near 1 but not 1, no norm bias to draw, tied output: a misplaced norm shows."""
    for model in (cohere(SHAPES[0], 0), cohere2(SHAPES2[0], 0)):
        p = dict(model.named_parameters())
        for name in ("model.layers.0.input_layernorm.weight", "model.norm.weight"):
            assert 0.05 < float((p[name].detach() - 1).abs().mean()) < 1
        assert not any(n.endswith("norm.bias") or "proj.bias" in n for n in p)
        assert "lm_head.weight" not in p  # tied
        assert model.config.logit_scale not in (None, 1.0)


def test_the_small_configs_are_small_and_cohere2_has_both_kinds() -> None:
    """Every size of the configs' defaults (a 35B's) set small; Cohere 2's default pattern
    makes every 4th layer full, and the test's windows bite within the prompt."""
    assert (CohereConfig().vocab_size, CohereConfig().hidden_size) == (256000, 8192)
    for model in (cohere(SHAPES[1], 0), cohere2(SHAPES2[0], 0)):
        c = model.config
        assert c.vocab_size <= 13 and c.hidden_size <= 24 and c.intermediate_size <= 48
        assert c.max_position_embeddings == 32
    c2 = cohere2(SHAPES2[0], 0).config
    assert c2.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert c2.sliding_window < PROMPT


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_cohere(shape: dict[str, Any], seed: int) -> None:
    model = cohere(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES2, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_cohere2(
    shape: dict[str, Any], seed: int
) -> None:
    model = cohere2(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    # the window bites in HF's own numbers: a sliding layer's weights 0 on j <= i − W
    i, j = np.indices((PROMPT, PROMPT))
    for l, kind in enumerate(c.layer_types):
        hidden = (j <= i - c.sliding_window) if kind == "sliding_attention" else (j > i)
        assert np.all(expected[f"decoder.{l}.self_attn.h0.softmax"][hidden & (j <= i)] == 0)
    assert_matches(expected, traced(to_config(model, prompt)).value)


def no_logit_scale(raw: dict[str, Any]) -> None:
    del raw["model"]["logit_scale"]


def halves(raw: dict[str, Any]) -> None:
    """LLaMA's rotate_half pairs (i, i + d/2), not Cohere's interleaved (2i, 2i+1)."""
    raw["model"]["rope_pairs"] = "halves"


def separate_norms(raw: dict[str, Any]) -> None:
    """A norm each (GPT-NeoX's), the FFN's left at γ 1: not the shared input_layernorm."""
    raw["model"]["parallel"] = "separate"


def rope_everywhere(raw: dict[str, Any]) -> None:
    """Cohere 2's full layers turned as its sliding ones are (one base for every layer)."""
    bases = raw["model"]["pe_base"]
    raw["model"]["pe_base"] = next(b for b in bases if b is not None)


COHERE_WRONG = [no_logit_scale, halves, separate_norms]


@pytest.mark.parametrize("mutate", COHERE_WRONG)
def test_the_comparison_catches_a_wrong_cohere_mapping(
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    model = cohere(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = to_config(model, prompt)
    expected = expected_of(model, prompt)
    assert_matches(expected, traced(raw).value)  # (as it is: equal)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("mutate", [*COHERE_WRONG, rope_everywhere])
def test_the_comparison_catches_a_wrong_cohere2_mapping(
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    model = cohere2(SHAPES2[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = to_config(model, prompt)
    expected = expected_of(model, prompt)
    assert_matches(expected, traced(raw).value)  # (as it is: equal)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


def test_qk_norm_is_refused_by_the_mapping() -> None:
    """Cohere's QK-norm has a γ per head, which trace-tf's shared q_norm cannot hold."""
    model = CohereForCausalLM(rotary_config(CohereConfig, dict(SHAPES[0], use_qk_norm=True)))
    assert tuple(model.model.layers[0].self_attn.q_norm.weight.shape) == (2, 8)  # per head
    with pytest.raises(ValueError, match="use_qk_norm"):
        to_config(model.double(), [0, 1])


@pytest.mark.parametrize("make, shape", [(cohere, SHAPES[1]), (cohere2, SHAPES2[0])])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_hf_generate(
    make: Callable[[dict[str, Any], int], Any], shape: dict[str, Any], tmp_path: Path
) -> None:
    model = make(shape, 5)
    f64 = float64 if isinstance(model, CohereForCausalLM) else float64_2
    assert_greedy_matches(model, to_config, tmp_path, f64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipes_run_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Cohere and Cohere 2 code, after GPT-2's (its Quoted), as printed: every
    value as HF computes it, and greedy generate as its own; then its functions convert
    every test model (the mapping written again, independently of to_config)."""
    monkeypatch.chdir(tmp_path)
    gpt2 = run_readme("From Hugging Face GPT-2")
    scope = assert_recipe_runs("From Hugging Face Cohere", "cohere", float64, after=gpt2)
    scope2 = assert_recipe_runs("From Hugging Face Cohere 2", "cohere2", float64_2, after=scope)
    assert scope2["model"].config.sliding_window < len(scope2["prompt"])  # the window bites
    for n, (make, shape) in enumerate(
        [(cohere, s) for s in SHAPES] + [(cohere2, s) for s in SHAPES2]
    ):
        model = make(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, PROMPT), vocab_of(model)
        np.savez("m.npz", **scope["cohere_arrays"](model, vocab))
        config = scope["cohere_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(expected_of(model, prompt), decode_json("m.yaml"))
