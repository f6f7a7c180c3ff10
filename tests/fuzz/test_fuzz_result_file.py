"""Fuzz ``autopar export --from RESULT.json``: a real search result (``autopar search --json``)
with a key of the document, of a layout or of a layout's ``strategy`` dropped or given an odd
value, exported to every format at a random ``--rank``. The run must write the config or give one
``error:`` line naming the key changed (or ``--rank``) (see :mod:`fuzz_support`)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_support import ODD_VALUES, check_outcome, dump_json, fuzz_settings, key_needles, module_workdir, run_cli

pytestmark = pytest.mark.fuzz

PROBLEMS = {  # search options -> the same options given to export
    "dense": ["-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64"],
    "pipelined": ["-m", "llama3-70b", "--device", "ascend-910b", "--nodes", "4", "--gbs", "64", "--seq-len", "2048"],
}
#: The formats that run on each problem's device (the others are refused by vendor, before the layout is read).
FORMATS = {"dense": ["megatron", "torchtitan", "deepspeed", "galvatron"], "pipelined": ["mindspeed", "sapp"]}
_DROP = object()
#: Keys whose change makes the layout another cluster's: the message then gives the world size.
_WORLD = {"dp", "tp", "pp", "cp", "gbs"}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    docs = {}
    for name, args in PROBLEMS.items():
        extra = ["--target", "sapp"] if name == "pipelined" else []
        out = run_cli(["search", *args, "--top", "4", *extra, "--json"])
        assert out.exit_code == 0, out.stderr
        docs[name] = json.loads(out.stdout)
    return docs


@st.composite
def edits(draw) -> tuple[str, list[tuple[str, str, object]]]:
    """(problem, [(where, key, value or _DROP)]) with where in document / layout / strategy."""
    problem = draw(st.sampled_from(sorted(PROBLEMS)))
    where = st.sampled_from(["document", "layout", "strategy", "strategy", "strategy"])
    keys = {"document": ["layouts", "problem", "not_writable", "extra"],
            "layout": ["strategy", "gbs", "step_time_s", "memory", "extra"],
            "strategy": ["dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "sp", "recompute",
                         "recompute_layers", "schedule", "layers_per_stage", "recompute_per_stage",
                         "recompute_modules", "account_for_embedding", "account_for_loss", "extra"]}
    out = []
    for _ in range(draw(st.integers(1, 2))):
        w = draw(where)
        out.append((w, draw(st.sampled_from(keys[w])), draw(st.one_of(st.just(_DROP), ODD_VALUES))))
    return problem, out


def _apply(doc: dict, changes) -> None:
    for where, key, value in changes:
        layout = doc["layouts"][0] if isinstance(doc.get("layouts"), list) and doc["layouts"] else None
        target = {"document": doc, "layout": layout,
                  "strategy": layout.get("strategy") if isinstance(layout, dict) else None}[where]
        if not isinstance(target, dict):
            continue
        if value is _DROP:
            target.pop(key, None)
        else:
            target[key] = value


workdir = module_workdir("fuzz_result")


@fuzz_settings(100)
@given(case=edits(), fmt_index=st.integers(0, 3), rank=st.sampled_from(["1", "1", "2", "4", "5", "0", "-1"]))
def test_mutated_search_result(workdir, results, case, fmt_index, rank):
    problem, changes = case
    fmt = FORMATS[problem][fmt_index % len(FORMATS[problem])]
    doc = copy.deepcopy(results[problem])
    _apply(doc, changes)
    path = workdir / "result.json"
    path.write_text(dump_json(doc))
    out = run_cli(["export", "--format", fmt, "--from", path, "--rank", rank, *PROBLEMS[problem]])
    needles: list = ["--rank", fmt]  # a format's refusal of a valid layout names the format
    for _, key, _ in changes:
        needles += key_needles(key)
        if key in _WORLD:
            needles.append("devices and gbs")  # the layout is for another cluster or batch
        if key == "layouts":
            needles += ["holds no layouts", "layouts["]
        if key in ("strategy", "layouts"):
            needles.append("'strategy'")
    check_outcome(out, needles)
    if out.exit_code == 0:
        assert out.stdout.strip(), "export printed nothing"
