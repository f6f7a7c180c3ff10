"""Fuzz the HF ``config.json`` reader through ``autopar estimate --model FILE --json``: each preset
config with one or two top-level keys dropped or replaced by an odd value (negative, zero, huge,
5,000-digit, float, string, null, nested list, unicode). The run must give valid JSON or one
``error:`` line that names a key the mutation touched (see :mod:`fuzz_support`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import MODELS
from fuzz_support import ODD_VALUES, check_outcome, dump_json, fuzz_settings, key_needles, module_workdir, run_cli

pytestmark = pytest.mark.fuzz

CONFIGS = {path.stem: json.loads(path.read_text()) for path in sorted(MODELS.glob("*.json"))}
_DROP = object()


@st.composite
def mutated_config(draw) -> tuple[str, dict, list[str]]:
    """(preset name, mutated config, keys mutated)."""
    name = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = dict(CONFIGS[name])
    keys = draw(st.lists(st.sampled_from(sorted(cfg)), min_size=1, max_size=2, unique=True))
    for key in keys:
        value = draw(st.one_of(st.just(_DROP), ODD_VALUES))
        if value is _DROP:
            del cfg[key]
        else:
            cfg[key] = value
    return name, cfg, keys


workdir = module_workdir("fuzz_hf")


@fuzz_settings(120)
@given(case=mutated_config())
def test_mutated_hf_config(workdir, case):
    name, cfg, keys = case
    path = workdir / "config.json"
    path.write_text(dump_json(cfg))
    out = run_cli(["estimate", "-m", path, "--device", "h100-80gb", "--json"])
    check_outcome(out, [n for k in keys for n in key_needles(k)], json_stdout=True)
