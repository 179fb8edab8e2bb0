"""The stage registry cannot drift from the engine: every path recorded by runs of many
configs matches exactly one entry, every entry is recorded by some run, and every entry
can be explained. `trace-tf stages` prints it."""

from __future__ import annotations

import json

from conftest import config_from
from test_explain import CONFIGS
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.explain import EXPLAINERS
from trace_tf.runner import run
from trace_tf.stages import GROUP_MEANINGS, STAGES, stage_of
from trace_tf.trace import GROUPS


def _recorded_paths() -> set[str]:
    return {step.path for cfg in CONFIGS.values() for step in run(cfg)}


def test_every_recorded_step_is_in_the_registry_exactly_once() -> None:
    for path in _recorded_paths():
        owners = [s.key for s in STAGES if s.matches(path)]
        assert len(owners) == 1, (path, owners)


def test_every_registry_entry_is_recorded_by_some_run() -> None:
    keys = {stage_of(p).key for p in _recorded_paths()}  # type: ignore[union-attr]
    assert keys == {s.key for s in STAGES}


def test_registry_names_are_the_last_path_part_and_every_entry_is_explained() -> None:
    assert len({s.key for s in STAGES}) == len(STAGES)
    for s in STAGES:
        assert s.key in EXPLAINERS
        assert all(p.rsplit(".", 1)[-1] == s.name for p in s.paths)
    assert set(EXPLAINERS) == {s.key for s in STAGES}
    assert set(GROUP_MEANINGS) == set(GROUPS)


def test_generate_iteration_prefixes_are_understood() -> None:
    assert stage_of("t3.decoder.0.self_attn.h1.softmax").key == "softmax"  # type: ignore[union-attr]
    assert stage_of("encoder.0.nonsense") is None


def test_stages_command_lists_every_stage_and_group() -> None:
    result = CliRunner().invoke(app, ["stages", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [s["key"] for s in data["stages"]] == [s.key for s in STAGES]
    assert set(data["groups"]) == set(GROUPS)
    result = CliRunner().invoke(app, ["stages"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    for text in ("softmax", "PE[pos,2i] = sin(pos / base^(2i/d))", "embedding[token]", "add_norm"):
        assert text in result.stdout


def test_generate_traces_are_in_the_registry() -> None:
    import numpy as np
    from conftest import config_from
    from random_configs import random_config

    from trace_tf import generate
    from trace_tf.trace import Tracer

    data = random_config(np.random.default_rng(5), d_model=4, n_heads=2, decoder_layers=1)
    data["model"]["score"] = "additive"
    data["weights"]["output"]["b"][1] = -1e3  # never eos (t1): run to max_tokens
    cfg = config_from(data)
    for settings in (generate.Settings(max_tokens=3), generate.Settings("beam", 3, width=2)):
        tr = Tracer()
        generate.run(cfg, settings, tr)  # type: ignore[arg-type]
        paths = [s.path for s in tr.trace]
        assert any(p.startswith(("t1.decoder", "t1.b0.decoder")) for p in paths), paths[-3:]
        assert [p for p in paths if stage_of(p) is None] == []


def test_the_embedding_scale_is_named_in_the_formula_and_valued_after_it() -> None:
    # It read `X = E · sqrt(d_model) = 2 + PE`, an equation that is not one.
    model = {"d_model": 4, "n_heads": 1, "embed_scale": "sqrt_d_model"}
    cfg = config_from({"model": model, "vocab": ["a"], "source": ["a"]})
    step = run(cfg, "encode")["encoder.input"]
    assert step.formula == "X = E · sqrt(d_model) + PE,  sqrt(d_model) = 2"


def test_stages_table_keeps_the_words_of_each_shape_whole() -> None:
    # At 60 columns the shape column was 6 cells wide and "d_model" read "d_mode" / "l".
    for width in (40, 60, 80, 120):
        result = CliRunner().invoke(app, ["stages"], env={"COLUMNS": str(width)})
        assert result.exit_code == 0
        lines = result.stdout.splitlines()
        body = lines[lines.index(next(x for x in lines if x.startswith("┡"))) + 1 :]
        shapes: list[str] = []
        for line in body:
            if not line.startswith("│"):
                break
            name, _, shape = (c.strip() for c in line.strip("│").split("│"))
            if name:
                shapes.append(shape)
            elif shape:
                shapes[-1] += " " + shape
        assert [" ".join(x.split()) for x in shapes] == [" ".join(s.shape.split()) for s in STAGES]
