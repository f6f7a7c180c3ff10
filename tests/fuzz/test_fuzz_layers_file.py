"""Fuzz ``autopar balance --layers FILE``: a per-layer cost table (the README's format) with a
top-level key, a layer's key or an entry of a layer's ``activation_bytes`` / ``recompute_s``
dropped or given an odd value, as JSON or YAML. The run must print the balanced plan (and write
``--plot``) or give one ``error:`` line naming the key changed (see :mod:`fuzz_support`)."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz_support import ODD_VALUES, check_outcome, dump_json, fuzz_settings, key_needles, module_workdir, run_cli

pytestmark = pytest.mark.fuzz

LAYER = {"forward_s": 0.01, "backward_s": 0.02, "static_bytes": 1e9,
         "activation_bytes": {"none": 2e9, "selective": 8e8, "full": 1e8}, "recompute_s": {"selective": 0.002}}
DOC = {"pp": 4, "vpp": 1, "num_microbatches": 16, "memory_limit_bytes": 80e9, "schedule": "1f1b", "p2p_s": 0.0,
       "layers": [LAYER] * 16}
_DROP = object()


@st.composite
def mutated_layers(draw) -> tuple[dict, list[str]]:
    """(document, keys changed)."""
    doc = copy.deepcopy(DOC)
    keys = []
    for _ in range(draw(st.integers(1, 2))):
        value = draw(st.one_of(st.just(_DROP), ODD_VALUES))
        where = draw(st.sampled_from(["top", "layer", "activation_bytes", "recompute_s"]))
        if where == "top":
            target, key = doc, draw(st.sampled_from(sorted(DOC)))
        else:
            i = draw(st.sampled_from([0, 1, 15]))
            if not isinstance(doc.get("layers"), list) or len(doc["layers"]) <= i:
                continue
            target = doc["layers"][i]
            if where != "layer":
                target = target.get(where) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                continue
            key = draw(st.sampled_from(sorted({**LAYER, **LAYER["activation_bytes"]}) if where != "layer" else
                                       sorted(LAYER)))
        if value is _DROP:
            target.pop(key, None)
        else:
            target[key] = value
        keys.append(key)
    return doc, keys


workdir = module_workdir("fuzz_layers")


def _text(doc: dict, as_yaml: bool) -> str:
    if not as_yaml:
        return dump_json(doc)
    try:
        return yaml.safe_dump(doc)
    except yaml.representer.RepresenterError:  # a Huge() placeholder: YAML via JSON text (YAML reads JSON)
        return dump_json(doc)


@fuzz_settings(80)
@given(case=mutated_layers(), as_yaml=st.booleans(), plot=st.booleans())
def test_mutated_layers_file(workdir, case, as_yaml, plot):
    doc, keys = case
    path, figure = workdir / ("layers.yaml" if as_yaml else "layers.json"), workdir / "plan.png"
    path.write_text(_text(doc, as_yaml))
    figure.unlink(missing_ok=True)
    out = run_cli(["balance", "--layers", path, *(["--plot", figure] if plot else [])])
    needles = [n for key in keys for n in key_needles(key)]
    if {"none", "selective", "full"} & set(keys) or "activation_bytes" in keys:
        needles.append("activation_bytes")  # the options are activation_bytes' keys, checked layer by layer
    if {"pp", "vpp", "layers"} & set(keys):
        needles.append("layers")
    check_outcome(out, needles, files=[figure] if plot else [])




#: balance's model, cluster and layout options: the --layers file replaces all of them.
MODEL_OPTIONS = {"--model": "llama3-8b", "--device": "h100-80gb", "--nodes": "2", "--devices-per-node": "4",
                 "--gbs": "64", "--seq-len": "2048", "--precision": "junk", "--vocab-size": "-1",
                 "--make-vocab-size-divisible-by": "64", "--device-set": "memory_bytes=1", "--tp": "2", "--pp": "2",
                 "--mbs": "2", "--zero": "1", "--recompute": "full", "--moe-token-imbalance": "2",
                 "--recompute-modules": "core_attn"}
MODEL_SWITCHES = ["--no-flash-attention", "--flash-attention", "--sp", "--fp8-param-storage"]


@fuzz_settings(25)
@given(options=st.lists(st.sampled_from([*MODEL_OPTIONS, *MODEL_SWITCHES]), min_size=1, max_size=3, unique=True))
def test_layers_file_refuses_model_options(workdir, options):
    """An option the layer file overrides is refused, not ignored (``--precision junk``,
    ``--devices-per-node 0``, ``--vocab-size -1``, ``--device-set``, ``--no-flash-attention`` were
    accepted and ignored)."""
    path = workdir / "layers.json"
    path.write_text(dump_json(DOC))
    args = [a for o in options for a in ([o] if o in MODEL_SWITCHES else [o, MODEL_OPTIONS[o]])]
    out = run_cli(["balance", "--layers", path, *args])
    assert out.exit_code == 2, f"balance --layers accepted {args}"
    check_outcome(out, [*options, *(o.replace("--no-", "--") for o in options)])
