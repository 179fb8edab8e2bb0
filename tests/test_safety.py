"""Safety (issue 5, SPEC section 6): nothing in a file runs, nothing hangs, nothing is
allocated beyond the size limit, and nothing the user gave is modified or overwritten."""

from __future__ import annotations

import hashlib
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, config_from
from random_configs import random_config
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config, load
from trace_tf.errors import InputError
from trace_tf.runner import run

runner = CliRunner()

GOOD = "model: {d_model: 4, n_heads: 2, decoder_layers: 1}\nvocab: [a, b, S]\ntokens: {bos: S}\nsource: [a, b]\n"

# Each payload would create (or write) the marker file if a loader constructed it.
PAYLOADS = [
    "!!python/object/apply:builtins.open ['{marker}', 'w']",
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:builtins.open ['{marker}', 'w']",
    "!!python/object/apply:subprocess.call [[touch, '{marker}']]",
]


def test_the_payloads_are_live_under_an_unsafe_loader(tmp_path: Path) -> None:
    # Shows the test below can fail: PyYAML's unsafe loader does run the first payload.
    marker = tmp_path / "marker"
    handle = yaml.unsafe_load(PAYLOADS[0].format(marker=marker))
    handle.close()
    assert marker.exists()


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("where", ["file", "set", "variant"])
def test_python_tags_are_refused_and_never_run(payload: str, where: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    tag = payload.format(marker=marker)
    config = tmp_path / "c.yaml"
    args = ["encode", str(config)]
    if where == "file":
        config.write_text(f"model: {{d_model: 4}}\ntitle: {tag}\nsource: [[1, 2, 3, 4]]\n")
    elif where == "set":
        config.write_text("model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\n")
        args += ["--set", f"title={tag}"]
    else:
        config.write_text(
            f"model: {{d_model: 4}}\nsource: [[1, 2, 3, 4]]\nvariants: {{v: {{title: {tag}}}}}\n"
        )
        args += ["--variant", "v"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "is not allowed" in result.stderr
    assert not marker.exists()


def test_alias_bomb_is_refused_within_a_second_or_two(tmp_path: Path) -> None:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]  # 10^12
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nmodel: {d_model: 4}\n")
    start = time.perf_counter()
    result = runner.invoke(app, ["encode", str(bomb)])
    assert time.perf_counter() - start < 2.0  # a bound on a hang, not a benchmark
    assert result.exit_code == 2 and "alias bomb" in result.stderr


ABSURD = "model: {d_model: 100000, n_heads: 10, encoder_layers: 1000}\nsource: [[1]]\n"


def test_size_limit_is_checked_before_anything_is_allocated(tmp_path: Path) -> None:
    path = tmp_path / "absurd.yaml"
    path.write_text(ABSURD)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="too large"):
            load(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000  # bytes; the model would need about 10^14 numbers


@pytest.mark.parametrize(
    "shape",
    [
        {"d_model": 4, "n_heads": 2},
        {"d_model": 6, "n_heads": 3, "d_v": 4, "d_ff": 5, "decoder_layers": 2},
        {"d_model": 4, "n_heads": 1, "encoder_layers": 0, "decoder_layers": 2, "src_len": 1},
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "positional": "learned", "pad": True},
        {"d_model": 8, "n_heads": 2, "norm_position": "pre", "src_len": 9, "tgt_len": 7},
    ],
)
def test_the_size_estimate_bounds_what_a_run_holds(shape: dict[str, object]) -> None:
    # The limit counts every array of the config and of its trace; one number less than
    # what a run really holds must be refused, so the estimate is never an underestimate.
    cfg_dict = random_config(np.random.default_rng(0), **shape)  # type: ignore[arg-type]
    cfg = config_from(cfg_dict)
    assert isinstance(cfg, Config)
    held = sum(a.size for a in cfg.named_arrays().values()) + sum(s.value.size for s in run(cfg))
    with pytest.raises(InputError, match="too large"):
        config_from(cfg_dict, max_elements=held - 1)


def test_max_elements_raises_and_lowers_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{d_model: 64, encoder_layers: 2}}\nsource: {[[0.5] * 64]}\n")
    assert runner.invoke(app, ["encode", str(path), "--format", "json"]).exit_code == 0
    result = runner.invoke(app, ["encode", str(path), "--max-elements", "1000"])
    assert result.exit_code == 2 and "--max-elements" in result.stderr
    absurd = tmp_path / "absurd.yaml"
    # 6000 layers of 49,408 numbers each: about 3 * 10^8, over the default 2^28.
    absurd.write_text("model: {d_model: 64, encoder_layers: 6000}\nsource: [[1]]\n")
    assert runner.invoke(app, ["encode", str(absurd)]).exit_code == 2
    # Raised past the default: the same file gets past the limit (to the next check).
    result = runner.invoke(app, ["encode", str(absurd), "--max-elements", str(2**40)])
    assert result.exit_code == 2 and "too large" not in result.stderr
    assert "source" in result.stderr and "expected shape L x 64" in result.stderr


# ---------------------------------------------------------------------------
# --output and the input file
# ---------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_output_is_created_and_never_overwritten_without_force(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert runner.invoke(app, ["encode", "--format", "json", "--output", str(out)]).exit_code == 0
    first = out.read_bytes()
    assert json.loads(first)["steps"]
    result = runner.invoke(app, ["decode", "--format", "json", "--output", str(out)])
    assert result.exit_code == 2 and "exists; pass --force" in result.stderr
    assert out.read_bytes() == first
    result = runner.invoke(app, ["decode", "--format", "json", "--output", str(out), "--force"])
    assert result.exit_code == 0 and out.read_bytes() != first
    assert json.loads(out.read_bytes())["steps"][-1]["path"] == "probs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # no temporary left


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("command", [["encode", "C"], ["diff", "C", "C"], ["check", "C"]])
@pytest.mark.parametrize("name", ["c.yaml", "link.yaml", "hard.yaml"])
def test_output_never_replaces_a_file_the_command_reads(
    tmp_path: Path, command: list[str], name: str, force: list[str]
) -> None:
    """Not even with --force (which allows replacing an output): through a symbolic
    or a hard link too."""
    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    (tmp_path / "link.yaml").symlink_to(config)
    (tmp_path / "hard.yaml").hardlink_to(config)
    before = _digest(config)
    args = [str(config) if a == "C" else a for a in command]
    result = runner.invoke(app, [*args, "--output", str(tmp_path / name), *force])
    assert result.exit_code == 2, result.output
    assert f"--output {tmp_path / name} is a file this command reads" in result.stderr
    assert _digest(config) == before and (tmp_path / "link.yaml").is_symlink()


def test_output_never_replaces_the_file_read_as_standard_input(tmp_path: Path) -> None:
    """`trace-tf encode - < c.yaml --output c.yaml --force`: the config read through
    `-` is the file too (it was replaced by the command's JSON)."""
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    before = _digest(config)
    with open(config, "rb") as stdin:
        proc = subprocess.run(
            [sys.executable, "-m", "trace_tf", "encode", "-", "--output", str(config), "--force"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"--output {config} is a file this command reads" in proc.stderr
    assert _digest(config) == before


def test_output_may_replace_a_file_an_earlier_command_read(tmp_path: Path) -> None:
    """The files read are the running command's: in one process (as here), a file
    an earlier command read is an ordinary output for the next."""
    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    assert runner.invoke(app, ["encode", str(config)]).exit_code == 0
    result = runner.invoke(app, ["encode", "--output", str(config), "--force"])
    assert result.exit_code == 0 and "input" in config.read_text()


def test_output_to_a_directory_or_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["encode", "--output", str(tmp_path), "--force"])
    assert result.exit_code == 2 and "is a directory" in result.stderr
    result = runner.invoke(app, ["encode", "--output", str(tmp_path / "no" / "x.txt")])
    assert result.exit_code == 2 and "cannot write --output" in result.stderr


@pytest.mark.parametrize(
    "name, says",
    [
        ("f.txt/", "--output {d}/f.txt/ names a directory"),
        ("f.txt/.", "names a directory; expected a file name, found '.' as its last part"),
        ("new/", "--output {d}/new/ names a directory"),
        ("f.txt/../y.txt", "cannot write --output {d}/f.txt/../y.txt: {d}/f.txt/..: Not a dir"),
        ("gone/../y.txt", "cannot write --output {d}/gone/../y.txt: {d}/gone/..: No such file"),
    ],
)
def test_an_output_name_that_is_no_file_name_is_refused_as_a_shell_would(
    name: str, says: str, tmp_path: Path
) -> None:
    # Path() and realpath() tidied these into the files f.txt, new and y.txt: `--output
    # f.txt/ --force` overwrote f.txt, where a shell's `> f.txt/` writes nothing.
    (tmp_path / "f.txt").write_text("keep")
    result = runner.invoke(
        app, ["pe", "--length", "1", "--d-model", "2", "--output", f"{tmp_path}/{name}", "--force"]
    )
    assert result.exit_code == 2, result.stderr
    assert says.format(d=tmp_path) in result.stderr and result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    assert (tmp_path / "f.txt").read_text() == "keep"


@pytest.mark.parametrize("command", [("encode",), ("check",), ("cost",)])
def test_an_empty_output_is_named_as_given_not_as_the_current_directory(
    command: tuple[str, ...],
) -> None:
    # typer read `--output ""` as Path(""), which is ".": "--output . is a directory".
    result = runner.invoke(app, [*command, "--output", "", "--force"])
    assert result.exit_code == 2
    assert result.stderr == (
        "trace-tf: error: --output is empty; expected a file name, or - for stdout\n"
    )


def test_output_dash_is_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["encode", "--format", "json", "--output", "-"])
    assert result.exit_code == 0 and json.loads(result.stdout)["steps"]
    assert list(tmp_path.iterdir()) == []  # no file named "-"


def test_npz_to_stdout_with_output_dash() -> None:
    import io
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "trace_tf", "decode", "--format", "npz", "--output", "-"],
        capture_output=True,
        check=True,
    )
    with np.load(io.BytesIO(proc.stdout)) as steps:
        assert steps["probs"].shape == (1, 10)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_output_into_a_named_pipe_is_written_straight_and_the_pipe_kept(tmp_path: Path) -> None:
    # Through a temporary file, the pipe would have been replaced by a regular file
    # (and so, run as root, would /dev/null).
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = runner.invoke(app, ["encode", "--format", "json", "--output", str(fifo)])
    reader.join(timeout=30)
    assert result.exit_code == 0, result.stderr
    assert json.loads(received[0])["steps"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a pipe, no --force needed


def test_a_character_device_is_written_straight() -> None:
    import os
    import stat

    from trace_tf.cli import _is_stream

    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        pytest.skip("no character device for os.devnull here")
    assert _is_stream(Path(os.devnull))  # (checked, not written: never risk /dev/null)


def test_npz_into_a_character_device_is_written() -> None:
    # /dev/null is seekable but its position stays 0: zipfile, seeking and telling as
    # on a file, computed negative offsets (struct.error, exit 3). Written straight, as
    # into a pipe, it is an archive like any other.
    import os
    import stat

    from trace_tf.cli import _is_stream

    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        pytest.skip("no character device for os.devnull here")
    assert _is_stream(Path(os.devnull))  # so written into, never replaced
    for args in (["pe", "--length", "2", "--d-model", "2"], ["encode"]):
        result = runner.invoke(app, [*args, "--format", "npz", "--output", os.devnull])
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "" and result.stderr == ""
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="no symbolic links here")
def test_output_through_a_symbolic_link_writes_its_target(tmp_path: Path) -> None:
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("before\n")
    link.symlink_to(real.name)
    result = runner.invoke(app, ["encode", "--format", "json", "--output", str(link)])
    assert result.exit_code == 2 and f"--output {link} exists" in result.stderr
    assert real.read_text() == "before\n"
    result = runner.invoke(app, ["encode", "--format", "json", "--output", str(link), "--force"])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and json.loads(real.read_text())["steps"]  # as `>` would
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


class FailingConsole:
    """Stands in for cli.console: writes half a table, then raises its `error`."""

    error: Exception = RuntimeError("renderer bug")

    def __init__(self, file: Any, width: int) -> None:
        self.file = file
        self.width = width

    def print(self, *args: object, **kw: object) -> None:
        self.file.write("half a table")
        raise self.error


def failing(error: Exception) -> type[FailingConsole]:
    return type("Failing", (FailingConsole,), {"error": error})


def test_a_failure_while_writing_leaves_the_existing_output_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trace_tf.cli

    monkeypatch.setattr(trace_tf.cli, "console", failing(RuntimeError("renderer bug")))
    out = tmp_path / "trace.txt"
    out.write_text("precious\n")
    result = runner.invoke(app, ["encode", "--output", str(out), "--force"])
    assert result.exit_code == 3 and "(RuntimeError: renderer bug)" in result.stderr
    assert out.read_text() == "precious\n"
    new = tmp_path / "new.txt"
    assert runner.invoke(app, ["encode", "--output", str(new)]).exit_code == 3
    assert not new.exists()  # no half-written file either


def test_a_full_disk_is_one_line_exit_2_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import trace_tf.cli

    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(trace_tf.cli, "console", failing(full))
    out = tmp_path / "trace.txt"
    out.write_text("precious\n")
    for args in (["--output", str(out), "--force"], ["--output", str(tmp_path / "new.txt")]):
        result = runner.invoke(app, ["encode", *args])
        assert result.exit_code == 2
        assert result.stderr == (
            f"trace-tf: error: cannot write --output {args[1]}: No space left on device\n"
        )
    assert out.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.txt"]  # no temporary left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_standard_output_on_a_full_device_is_exit_2(fmt: str) -> None:
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "trace_tf", "decode", "--format", fmt],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert proc.returncode == 2
    assert proc.stderr == "trace-tf: error: cannot write standard output: No space left on device\n"


@pytest.mark.parametrize(
    "args, closes, says",
    [
        (("encode", "-"), "<&-", "<stdin>: standard input is closed; expected a config on "),
        (("decode",), ">&-", "cannot write standard output: Bad file descriptor"),
        (("decode", "--format", "json"), ">&-", "cannot write standard output: Bad file"),
        (("examples",), ">&-", "cannot write standard output: Bad file descriptor"),
    ],
)
def test_a_closed_standard_input_or_output_is_exit_2(
    args: tuple[str, ...], closes: str, says: str
) -> None:
    # Python leaves sys.stdin / sys.stdout None when the shell closed them: an internal
    # error (AttributeError on None), exit 3.
    import subprocess
    import sys

    script = f'exec "$0" -m trace_tf "$@" {closes}'
    proc = subprocess.run(
        ["sh", "-c", script, sys.executable, *args],
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("trace-tf: error: " + says) and proc.stderr.count("\n") == 1


def test_force_keeps_the_overwritten_files_permissions(tmp_path: Path) -> None:
    out = tmp_path / "trace.txt"
    out.write_text("old\n")
    out.chmod(0o640)
    assert runner.invoke(app, ["encode", "--output", str(out), "--force"]).exit_code == 0
    assert out.read_text() != "old\n" and (out.stat().st_mode & 0o777) == 0o640


COMMANDS = [
    ["encode", "{config}"],
    ["decode", "{config}", "--format", "json"],
    ["step", "{config}", "--stage", "qkv"],
    ["check", "{fixture}"],
    ["encode", "{config}", "--set", "model.scale=2", "--output", "{out}"],
    ["decode", "{config}", "--set", "source=[b, a]", "--strict"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a[:1] + a[2:3]))
def test_commands_never_modify_their_input(args: list[str], tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    fixture = tmp_path / "hello.yaml"
    fixture.write_bytes((FIXTURES / "hello.yaml").read_bytes())
    before = {p: _digest(p) for p in (config, fixture)}
    filled = [a.format(config=config, fixture=fixture, out=tmp_path / "out.txt") for a in args]
    result = runner.invoke(app, filled)
    assert result.exit_code == 0, result.stderr
    assert {p: _digest(p) for p in (config, fixture)} == before


def test_output_that_appears_while_rendering_is_not_clobbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trace_tf.cli

    out = tmp_path / "trace.txt"
    real_console = trace_tf.cli.console

    def racing_console(file: Any, width: int) -> Any:
        out.write_text("written meanwhile by someone else\n")  # after the check, before the end
        return real_console(file, width)

    monkeypatch.setattr(trace_tf.cli, "console", racing_console)
    result = runner.invoke(app, ["encode", "--output", str(out)])
    assert result.exit_code == 2 and "exists; pass --force" in result.stderr
    assert out.read_text() == "written meanwhile by someone else\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.txt"]


def test_npz_output_is_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "steps.npz"
    result = runner.invoke(app, ["encode", "--format", "npz", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    with np.load(out) as steps:
        assert "encoder.output" in steps.files
    result = runner.invoke(app, ["encode", "--format", "npz", "--output", str(out)])
    assert result.exit_code == 2 and "exists" in result.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize(
    "args, message",
    [
        (["examples"], "cannot write standard output: No space left on device"),
        (["--help"], "cannot write: No space left on device"),
        (["encode", "--help"], "cannot write: No space left on device"),
    ],
)
def test_a_full_device_outside_the_running_commands_is_exit_2(
    args: list[str], message: str
) -> None:
    # `examples > /dev/full` was exit 3 ("this is a bug"), `--help > /dev/full` a traceback
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "trace_tf", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert (proc.returncode, proc.stderr) == (2, f"trace-tf: error: {message}\n")


@pytest.mark.skipif(not hasattr(__import__("os"), "openpty"), reason="no terminals here")
def test_npz_to_a_terminal_named_as_output_is_refused_as_with_output_dash() -> None:
    # `--output -` on a terminal refused binary data, but `--output /dev/stdout` (or
    # /dev/tty) wrote the zip's bytes to the terminal as they were.
    import os

    main, secondary = os.openpty()
    try:
        tty = os.ttyname(secondary)
        args = ["pe", "--length", "2", "--d-model", "2", "--format", "npz", "--output", tty]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert f"--output {tty} would write binary data to the terminal" in result.stderr
        os.set_blocking(main, False)
        with pytest.raises(BlockingIOError):  # nothing reached the terminal
            os.read(main, 100)
    finally:
        os.close(main)
        os.close(secondary)
