"""``estimate --target``: one layout costed as the named export format runs it (the mechanism of
``search --target``, :func:`autopar.search.grid.for_target`), refused where the format cannot run it."""

from __future__ import annotations

import json

import pytest
from json_schema_support import assert_valid
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
# Llama-2-7B on 8 GPUs, ZeRO-3 with pp 2 (Galvatron's sdp with pipelining); TP overlap off on both
# sides, so that Galvatron's missing TP-overlap switch is not what differs.
ZERO3_PP = ["estimate", "--model", "llama2-7b", "--device", "a100-40gb", "--nodes", "1", "--devices-per-node", "8",
            "--gbs", "64", "--seq-len", "4096", "--tp", "2", "--pp", "2", "--mbs", "1", "--zero", "3",
            "--no-tp-comm-overlap"]


def _json(*extra: str) -> dict:
    res = runner.invoke(app, [*ZERO3_PP, *extra, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_galvatron_keeps_the_unsharded_zero3_gradient_through_the_microbatches():
    """Galvatron reduces the gradient once per step (FSDP ``no_sync``), so with 32 micro-batches a
    ZeRO-3 stage keeps its full bf16 gradient, 2 bytes per parameter, on top of Megatron's sharded
    one (:mod:`autopar.cost.grad_accumulation`; Galvatron's ``cost_model.py`` zero3_ratio): the
    grads of stage 0 grow by exactly 2 x its parameters, the other parts stay."""
    megatron, galvatron = _json("--target", "megatron"), _json("--target", "galvatron")
    assert (megatron["target"], galvatron["target"]) == ("megatron", "galvatron")
    for a, b in zip(megatron["memory_per_stage"], galvatron["memory_per_stage"]):
        assert b["grads_bytes"] - a["grads_bytes"] == pytest.approx(2 * a["params"], rel=1e-12)
        for part in ("weights_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
            assert b[part] == a[part]
    assert galvatron["peak_memory_bytes"] > megatron["peak_memory_bytes"]
    # the once-per-step reduce-scatter is exposed beyond the pipeline drain: never cheaper
    assert galvatron["time_breakdown_s"]["dp_comm"] >= megatron["time_breakdown_s"]["dp_comm"]
    assert_valid("estimate", galvatron)


def test_default_target_is_megatron_on_nvidia():
    assert _json()["target"] == "megatron"


@pytest.mark.parametrize("extra, words", [
    (["--target", "foo"], ["--target=foo", "not an export format", "galvatron"]),
    (["--target", "mindspeed"], ["--target=mindspeed", "does not run on a100-40gb"]),
    (["--target", "galvatron", "--zero", "1"], ["--target=galvatron cannot run this layout", "zero=1"]),
])
def test_bad_target_is_one_error_line(extra, words):
    i = ZERO3_PP.index("--zero")
    base = [*ZERO3_PP[:i], *ZERO3_PP[i + 2:]] if "--zero" in extra else ZERO3_PP  # each option given once
    res = runner.invoke(app, [*base, *extra])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("error:") and "\n" not in line and "Traceback" not in res.output
    assert all(w in line for w in words), line
