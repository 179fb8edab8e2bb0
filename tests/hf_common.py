"""What the Hugging Face comparisons (tests/test_hf_gpt2.py, tests/test_hf_llama.py,
tests/test_hf_bert.py) share: how a model's values are compared with trace-tf's, and how each is run."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from conftest import config_from, readme_python
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


def listed(x: Any) -> Any:
    """Arrays as the nested lists a YAML file holds."""
    if isinstance(x, dict):
        return {k: listed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [listed(v) for v in x]
    return x.tolist() if isinstance(x, np.ndarray) else x


def run_readme(section: str, seed: int | None = None) -> dict[str, Any]:
    """The Python code of README's `section` run as printed, in the current directory
    (torch seeded with `seed` first, if given): the names it defines."""
    if seed is not None:
        torch.manual_seed(seed)
    scope: dict[str, Any] = {}
    exec(compile(readme_python(section), "README.md", "exec"), scope)  # our own README
    return scope
