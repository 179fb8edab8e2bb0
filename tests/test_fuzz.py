"""Generated bad input in CI: a seeded run of tests/fuzz_configs.py's cases through its
oracle (exit 0 or 2, one clear line naming the file or option, no traceback or Python
repr, inputs unchanged, no hang, JSON that parses), and the minimised reproducers of
every bug its campaigns found, each run through the same oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fuzz_configs import Case, check_case, example_data, make_case

SEED = 20_260_101
CASES = 160  # about 10 s; one in 80 through the real entry point, in a subprocess


def test_generated_inputs_are_run_or_refused_clearly(tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    sources = example_data()
    failures = []
    for n in range(CASES):
        case = make_case(rng, sources)
        _, found = check_case(case, tmp_path, sub=n % 80 == 79)
        if found:
            failures.append((n, case.what, case.args, found))
    assert not failures, failures


# What campaigns found (`python tests/fuzz_configs.py`), minimised; each was a bug.
SMALL = "model: {d_model: 2}\nvocab: [a]\nsource: [a]\n"
DECODER = "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a]\ntarget: [a]\n"
FOUND = [
    # numpy's RuntimeWarning (overflow in multiply) from drawing N(0, 1e308²)
    ("init-std-overflow", SMALL.replace("2}", "2, init_std: 1.0e+308}"), ["encode", "{file}"]),
    # the records of a million iterations: ran for hours
    ("max-tokens-huge", DECODER, ["generate", "{file}", "--max-tokens", "1000000"]),
]


@pytest.mark.parametrize("text, args", [f[1:] for f in FOUND], ids=[f[0] for f in FOUND])
def test_what_fuzzing_found_stays_fixed(text: str, args: list[str], tmp_path: Path) -> None:
    _, found = check_case(Case(text, args), tmp_path)
    assert not found
