"""``search --moe-dispatcher`` / ``--moe-ep-overlap`` (issue 19 item 1: the MoE layout fields
``estimate`` takes are search constraints too): a cluster without DeepEP/HybridEP can keep the
search to the dispatchers it runs, on the command line and in ``--config``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.search.constraints import parse_constraints, widen_space
from autopar.space import SpaceOptions

runner = CliRunner()
# Mixtral-8x7B (8 experts) on 4 x 8 H100: --target megatron offers alltoall and deepep (an 8-GPU
# NVLink domain, autopar.export.comm_knobs.flex_backend), the EP overlap with the last (deepep).
MIXTRAL = ["search", "--model", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "4", "--gbs", "256",
           "--seq-len", "4096", "--top", "5", "--json"]


def _layouts(*extra: str) -> tuple[dict, list[dict]]:
    out = runner.invoke(app, [*MIXTRAL, *extra])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    return doc, [x["strategy"] for x in doc["layouts"]]


def test_moe_dispatcher_keeps_the_pinned_dispatcher():
    """Unconstrained, #1 on this cluster is deepep (what the user's cluster cannot run);
    ``--moe-dispatcher alltoall`` leaves only alltoall layouts, the EP overlap still searched
    (alltoall is then the only, so the last, dispatcher offered)."""
    _, free = _layouts()
    assert free[0]["moe_dispatcher"] == "deepep"
    doc, pinned = _layouts("--moe-dispatcher", "alltoall")
    assert {s["moe_dispatcher"] for s in pinned} == {"alltoall"}
    assert any(s["moe_ep_overlap"] for s in pinned)
    assert "--moe-dispatcher alltoall" in doc["constraints"]


def test_moe_dispatcher_set_and_ep_overlap_off():
    doc, pinned = _layouts("--moe-dispatcher", "alltoall,allgather", "--no-moe-ep-overlap")
    assert {s["moe_dispatcher"] for s in pinned} <= {"alltoall", "allgather"}
    assert not any(s["moe_ep_overlap"] for s in pinned)
    assert set(doc["constraints"]) == {"--moe-dispatcher alltoall,allgather", "--no-moe-ep-overlap"}


def test_moe_dispatcher_in_a_config_file(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("search: {moe_dispatcher: alltoall}\n")
    _, pinned = _layouts("--config", str(cfg))
    assert {s["moe_dispatcher"] for s in pinned} == {"alltoall"}


def test_widen_space_offers_the_pinned_dispatchers_target_preferred_last():
    """Target megatron on H100 offers (alltoall, deepep); pinning hybridep,deepep offers hybridep
    (not offered by the target) first, then deepep (the target's), which keeps the EP overlap."""
    offered = SpaceOptions(moe_dispatchers=("alltoall", "deepep"), moe_ep_overlap=True)
    pins = parse_constraints({"--moe-dispatcher": "hybridep,deepep"}, {})
    assert widen_space(offered, pins).moe_dispatchers == ("hybridep", "deepep")
    # a target without MoE choices (alltoall only, no overlap) is left as it is
    assert widen_space(SpaceOptions(), pins).moe_dispatchers == ("alltoall",)


def test_moe_ep_overlap_is_an_on_off_constraint():
    (on,) = parse_constraints({"--moe-ep-overlap": "on"}, {})
    (off,) = parse_constraints({"--moe-ep-overlap": "off"}, {})
    assert (on.text, on.allowed, off.text, off.allowed) == ("--moe-ep-overlap", {1}, "--no-moe-ep-overlap", {0})


@pytest.mark.parametrize("args, message", [
    (["--moe-dispatcher", "nccl"], "--moe-dispatcher='nccl': allowed alltoall, allgather, deepep, hybridep"),
])
def test_bad_moe_dispatcher_gets_one_error_line(args, message):
    out = runner.invoke(app, [*MIXTRAL, *args])
    assert out.exit_code == 2 and message in out.output


def test_moe_options_refused_on_a_dense_model():
    out = runner.invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8",
                              "--moe-dispatcher", "deepep"])
    assert out.exit_code == 2
    assert "--moe-dispatcher=deepep: model llama3-8b has no routed experts" in out.output


def test_parse_constraints_rejects_an_unknown_dispatcher():
    with pytest.raises(AutoparError, match="allowed alltoall, allgather, deepep, hybridep"):
        parse_constraints({"--moe-dispatcher": "deepep,nvshmem"}, {})
