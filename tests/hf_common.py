"""What the Hugging Face comparisons (tests/test_hf_gpt2.py, tests/test_hf_llama.py,
tests/test_hf_bert.py, tests/test_hf_mistral.py, tests/test_hf_gemma.py,
tests/test_hf_gemma2.py, tests/test_hf_gemma3.py, tests/test_hf_qwen3.py,
tests/test_hf_qwen2.py, tests/test_hf_olmo2.py, tests/test_hf_mixtral.py,
tests/test_hf_qwen3_moe.py, tests/test_hf_olmoe.py, tests/test_hf_gpt_oss.py,
tests/test_hf_cohere.py) share: how a
model's values are compared with trace-tf's, and how each is run; for the LLaMA-shaped
decoders (LLaMA, Mistral, Gemma, Qwen2, Qwen3, Mixtral, Qwen3-MoE, OLMoE, GPT-OSS), their
values by trace-tf step and the
float64 replacements of HF's float32 internals."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import config_from, readme_python
from transformers import modeling_rope_utils
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run
from trace_tf.trace import Trace

RTOL = ATOL = 1e-12

runner = CliRunner()


def assert_matches(expected: dict[str, np.ndarray], value: Callable[[str], np.ndarray]) -> None:
    for path, want in expected.items():
        np.testing.assert_allclose(value(path), want, rtol=RTOL, atol=ATOL, err_msg=path)


def traced(raw: dict[str, Any], command: str = "decode") -> Trace:
    """`raw` (every weight given) decoded (or encoded) by the engine, every step kept."""
    cfg = config_from(raw)
    assert isinstance(cfg, Config) and cfg.drawn == ()
    return run(cfg, command)


def prompt_for(model: Any, seed: int, length: int = 5) -> list[int]:
    return np.random.default_rng(seed).integers(model.config.vocab_size, size=length).tolist()


def invoke_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def decode_json(config: str, command: str = "decode") -> Callable[[str], np.ndarray]:
    """`trace-tf decode CONFIG --format json` (or `encode`): a step's value by its path."""
    steps = {s["path"]: s["value"] for s in invoke_json(command, config)["steps"]}
    return lambda path: np.asarray(steps[path], dtype=np.float64)


@torch.no_grad()
def hf_greedy(model: Any, prompt: list[int], n: int, eos: int | None) -> list[int]:
    """The tokens `generate(do_sample=False)` adds to `prompt`."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def assert_greedy_matches(
    model: Any,
    to_config: Callable[[Any, list[int]], dict[str, Any]],
    tmp_path: Path,
    float64: Callable[[], AbstractContextManager[Any]] = nullcontext,
    n: int = 8,
) -> None:
    """`trace-tf generate --greedy` on `to_config(model, prompt)` against HF's
    `generate(do_sample=False)` (run under `float64`): without eos, to n tokens; then
    with eos set to the third token HF produced, so both must stop there (eos counted
    among the produced tokens). HF's cache and trace-tf's are both on."""
    prompt = prompt_for(model, 5, 4)
    with float64():
        free = hf_greedy(model, prompt, n, None)
        assert len(free) == n
        eos = free[2]
        stopped = hf_greedy(model, prompt, n, eos)
    assert stopped == free[: free.index(eos) + 1]
    vocab = vocab_of(model)
    for tokens in (free, stopped):
        raw = to_config(model, prompt)
        if tokens is stopped:
            raw["tokens"] = {"eos": vocab[eos]}
        path = tmp_path / "model.yaml"
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        out = invoke_json("generate", str(path), "--greedy", "--max-tokens", str(n))
        assert out["generated"] == [vocab[i] for i in tokens]
        assert out["stopped"] == ("eos" if tokens is stopped else "max_tokens")


def listed(x: Any) -> Any:
    """Arrays as the nested lists a YAML file holds."""
    if isinstance(x, dict):
        return {k: listed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [listed(v) for v in x]
    return x.tolist() if isinstance(x, np.ndarray) else x


def run_readme(
    section: str, seed: int | None = None, scope: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The Python code of README's `section` run as printed, in the current directory
    (torch seeded with `seed` first, if given): the names it defines, added to `scope`
    (what an earlier section's code defined) if given."""
    if seed is not None:
        torch.manual_seed(seed)
    scope = {} if scope is None else scope
    exec(compile(readme_python(section), "README.md", "exec"), scope)  # our own README
    return scope


def vocab_of(model: Any) -> list[str]:
    return [f"t{i}" for i in range(model.config.vocab_size)]


def rotary_config(
    config_class: Any, shape: dict[str, Any], eos: int | None = None, by_layer_type: bool = False
) -> Any:
    """A LLaMA-family config (LLaMA, Mistral, Qwen2, Qwen3, OLMo 2, Gemma 1–3) of `shape`, HF's
    names with `rope_theta` and `rope_scaling` (HF's rope_parameters but rope_theta) flat,
    as the tests' SHAPES write them: 13 tokens, 32 positions unless given, no special
    token but `eos`, eager attention; an MLP twice the width and every head its own K/V
    head unless given (the configs' defaults are a 7B's widths, or 8 K/V heads).
    `by_layer_type`: rope_parameters per layer type, the same for both (Gemma 3's)."""
    shape = dict(shape)
    theta = shape.pop("rope_theta", 10000.0)
    rope = {**shape.pop("rope_scaling", {"rope_type": "default"}), "rope_theta": theta}
    shape.setdefault("intermediate_size", 2 * shape["hidden_size"])
    shape.setdefault("num_key_value_heads", shape["num_attention_heads"])
    return config_class(
        vocab_size=shape.pop("vocab_size", 13),
        max_position_embeddings=shape.pop("max_position_embeddings", 32),
        rope_parameters={t: dict(rope) for t in ("sliding_attention", "full_attention")}
        if by_layer_type
        else rope,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=None,
        attn_implementation="eager",
        **shape,
    )


def draw_parameters(
    model: Any, seed: int, norm_weight: float = 1.0, norms: tuple[str, ...] = ("norm.weight",)
) -> Any:
    """`model` in float64, eval, every parameter drawn anew with `seed` (HF's own init
    leaves biases at 0 and γ at 1, where a misplaced norm or bias would not show); a
    norm's weight (a name ending in one of `norms`: GPT-J's are `ln_1`, `ln_f`) near
    `norm_weight` (0 for Gemma's, whose γ is 1 + weight)."""
    model = model.double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head.weight is not listed
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith(norms):
                p.copy_(norm_weight + 0.3 * noise)  # γ near 1
            elif p.dim() == 1:
                p.copy_(0.3 * noise)  # biases
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)  # nn.Linear, out x in: unit-size outputs
    return model


# HF's LLaMA family (LLaMA, Mistral) computes three things in float32 whatever the model's
# dtype: its RMSNorm, its rotary angles and its eager softmax. The same formulas in float64:


def rms_norm_float64(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward (MistralRMSNorm's is the same) without its cast to float32."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class _Float64Torch(types.ModuleType):
    """torch with `torch.float` (and `float32`) float64: what HF's rope init functions,
    which compute in torch.float whatever the model's dtype, see under hf_rope_init."""

    def __getattr__(self, name: str) -> Any:
        return torch.float64 if name in ("float", "float32") else getattr(torch, name)


def hf_rope_init(config: Any, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """HF's own rope init function for `config`'s rope_type (modeling_rope_utils:
    linear, llama3, yarn, ...), run in float64: its inverse frequencies and attention
    scaling; with `layer_type`, that type's RoPE (Gemma 3's rope_parameters by type)."""
    rope = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    by_type = {} if layer_type is None else {"layer_type": layer_type}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_rope_utils, "torch", _Float64Torch("torch"))
        init = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope["rope_type"]]
        inv_freq, scaling = init(config, **by_type)
    assert inv_freq.dtype == torch.float64
    return inv_freq, float(scaling)


def rotary_float64(
    self: Any, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
) -> Any:
    """LlamaRotaryEmbedding.forward (GPTNeoXRotaryEmbedding's is the same) with its angles
    in float64: the default rope type's inverse frequencies written here, over the
    int(head_dim · partial_rotary_factor) columns turned, a scaled type's by HF's own
    function (hf_rope_init), cos and sin times its attention scaling as forward does;
    with `layer_type`, that type's RoPE (Gemma3RotaryEmbedding.forward's argument)."""
    c = self.config
    rope = c.rope_parameters if layer_type is None else c.rope_parameters[layer_type]
    if rope["rope_type"] == "default":
        head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        d = int(head * rope.get("partial_rotary_factor", 1.0))
        base = rope["rope_theta"]
        inv_freq, scaling = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    else:
        inv_freq, scaling = hf_rope_init(c, layer_type)
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def eager_float64(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """eager_attention_forward with its softmax in the model's dtype; each K/V head
    repeated for the query heads of its group (HF's repeat_kv; GPT-NeoX has no groups);
    the scaled scores soft-capped before the mask if `softcap` (Gemma 2's, as its own)."""
    groups = getattr(module, "num_key_value_groups", 1)
    keys = key.repeat_interleave(groups, dim=1)
    values = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


@contextmanager
def float64_hf(
    modeling: ModuleType,
    prefix: str,
    rms_norm: Callable[..., torch.Tensor] = rms_norm_float64,
) -> Iterator[pytest.MonkeyPatch]:
    """A LLaMA-family `modeling` module (modeling_llama with prefix "Llama", ...) with its
    three float32 computations done in float64: its <prefix>RMSNorm's forward `rms_norm`
    (Gemma's multiplies by 1 + weight), its rotary angles and its eager softmax; the
    patch yielded for more."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(getattr(modeling, f"{prefix}RMSNorm"), "forward", rms_norm)
        mp.setattr(getattr(modeling, f"{prefix}RotaryEmbedding"), "forward", rotary_float64)
        mp.setattr(modeling, "eager_attention_forward", eager_float64)
        yield mp


@torch.no_grad()
def hf_outputs(model: Any, prompt: list[int], final_norm: Any = None) -> dict[str, np.ndarray]:
    """A decoder-only model's values under the trace-tf step each one is, for `prompt`
    (batch of one); the input of `final_norm` (default: a LLaMA-shaped model's
    `model.norm`; GPT-2's is `transformer.ln_f`) is the last layer's residual."""
    seen: list[torch.Tensor] = []
    norm = model.model.norm if final_norm is None else final_norm
    hook = norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        out = model(torch.tensor([prompt]), output_hidden_states=True, output_attentions=True)
    finally:
        hook.remove()
    n, H = model.config.num_hidden_layers, model.config.num_attention_heads
    hidden = out.hidden_states
    assert len(hidden) == n + 1 and len(out.attentions) == n
    values = {
        "decoder.input": hidden[0][0],
        "decoder.output": hidden[n][0],
        "logits": out.logits[0],
    }
    values |= {f"decoder.{l}.ffn.residual": hidden[l + 1][0] for l in range(n - 1)}
    values[f"decoder.{n - 1}.ffn.residual"] = seen[0][0]
    for l, a in enumerate(out.attentions):
        assert a.shape == (1, H, len(prompt), len(prompt))
        values |= {f"decoder.{l}.self_attn.h{h}.softmax": a[0, h] for h in range(H)}
    return {k: v.numpy() for k, v in values.items()}


def largest_error(expected: dict[str, np.ndarray], value: Callable[[str], np.ndarray]) -> float:
    """The largest |trace-tf − HF| / (1 + |HF|) over every compared value."""
    return max(
        float(np.max(np.abs(value(path) - want) / (1 + np.abs(want))))
        for path, want in expected.items()
    )


def assert_recipe_runs(
    section: str,
    name: str,
    float64: Callable[[], AbstractContextManager[Any]],
    outputs: Callable[[Any, list[int]], dict[str, np.ndarray]] = hf_outputs,
    after: dict[str, Any] | None = None,
    eos: int | None = None,
) -> dict[str, Any]:
    """README's `section` run as printed (in the current directory; `after`, the names an
    earlier section's code defined), writing `name`.yaml and `name`.npz for its `model`
    and `prompt`: every value as HF computes it (`outputs`, a LLaMA-shaped model's by
    default, under `float64`), and greedy generate as HF's (stopping at `eos`). -> the
    names the code defined"""
    scope = run_readme(section, 0, after)
    assert os.path.exists(f"{name}.yaml") and os.path.exists(f"{name}.npz")
    model, prompt, vocab = scope["model"], scope["prompt"], scope["vocab"]
    with float64():
        assert_matches(outputs(model, prompt), decode_json(f"{name}.yaml"))
        greedy = hf_greedy(model, prompt, 8, eos)
    out = invoke_json("generate", f"{name}.yaml", "--greedy", "--max-tokens", "8")
    assert out["generated"] == [vocab[i] for i in greedy]
    return scope
