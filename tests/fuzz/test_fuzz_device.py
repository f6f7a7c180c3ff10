"""Fuzz the device overrides: ``--device-file`` (a preset's fields written out, with or without
``base:``, one or two fields dropped or given odd values, or an unknown field added) and
``--device-set KEY=VALUE`` (any field, ``peak_flops.<dtype>`` included, with odd value text),
through ``autopar estimate --json`` and ``autopar search --json``. The run must give valid JSON or
one ``error:`` line naming the field changed (see :mod:`fuzz_support`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.specs.cluster import DeviceSpec
from conftest import DATA
from fuzz_support import (ODD_OPTION_TEXT, ODD_VALUES, check_outcome, dump_json, fuzz_settings, key_needles,
                          module_workdir, run_cli)

pytestmark = pytest.mark.fuzz

# a preset's DeviceSpec fields (devices.json's "aliases" are names for --device, not device-file fields)
PRESETS = {k: {f: x for f, x in v.items() if f != "aliases"}
           for k, v in json.loads((DATA / "devices.json").read_text()).items() if not k.startswith("_")}
FIELDS = sorted(DeviceSpec.model_fields)
_DROP = object()


@st.composite
def mutated_device_file(draw) -> tuple[str, list[str]]:
    """(file text, needles): a preset's fields, or ``base: <preset>`` plus some, then mutated."""
    name = draw(st.sampled_from(sorted(PRESETS)))
    if draw(st.booleans()):
        doc = {"name": name, **json.loads(json.dumps(PRESETS[name]))}
    else:
        doc = {"base": name, **{k: PRESETS[name][k] for k in draw(st.sets(st.sampled_from(sorted(PRESETS[name]))))}}
    keys = draw(st.lists(st.sampled_from([*doc, "peak_flops.bf16", "unknown_field", *FIELDS]), min_size=1,
                         max_size=2, unique=True))
    needles: list = []
    for key in keys:
        value = draw(st.one_of(st.just(_DROP), ODD_VALUES))
        if key == "peak_flops.bf16":
            if isinstance(doc.get("peak_flops"), dict):
                doc["peak_flops"] = dict(doc["peak_flops"])
                if value is _DROP:
                    doc["peak_flops"].pop("bf16", None)
                else:
                    doc["peak_flops"]["bf16"] = value
            needles += key_needles("peak_flops")
            continue
        if value is _DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
        needles += key_needles(key)
        if key == "base":  # the file alone must then give every required field
            needles.append("missing (required)")
    return dump_json(doc), needles


workdir = module_workdir("fuzz_device")


@fuzz_settings(80)
@given(case=mutated_device_file())
def test_mutated_device_file(workdir, case):
    text, needles = case
    path = workdir / "dev.yaml"
    path.write_text(text)
    out = run_cli(["estimate", "-m", "llama3-8b", "--device-file", path, "--devices-per-node", "8", "--json"])
    check_outcome(out, needles, json_stdout=True)


@fuzz_settings(60)
@given(overrides=st.lists(st.tuples(st.sampled_from([*FIELDS, "peak_flops.bf16", "peak_flops.fp8", "peak_flops",
                                                     "peak_flops.", "nope"]), ODD_OPTION_TEXT),
                          min_size=1, max_size=2),
       command=st.sampled_from(["estimate", "search"]))
def test_device_set(overrides, command):
    args = [a for key, value in overrides for a in ("--device-set", f"{key}={value}")]
    extra = ["--top", "1"] if command == "search" else []
    # --devices-per-node fixed: default_devices_per_node would change the world size and the default dp
    out = run_cli([command, "-m", "llama3-8b", "--device", "h100-80gb", "--devices-per-node", "8", *args, *extra,
                   "--json"])
    needles = [n for key, _ in overrides for n in [*key_needles(key), f"--device-set={key}"]]
    if command == "search":  # a slower or smaller device may leave no layout
        needles += ["no layout fits", "no valid layout"]
    check_outcome(out, needles, json_stdout=True)
