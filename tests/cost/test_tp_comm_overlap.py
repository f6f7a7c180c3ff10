"""TP communication overlap as a layout knob (``Strategy.tp_comm_overlap``): its time and memory
(autopar.cost.tp_overlap), its rule, the defaults per target, the script reader and the exports."""

import json

import numpy as np
import pytest
from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import tp_overlap
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron_deepspeed import config_json
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.specs.script import read_script
from autopar.specs.script_cli import layout_defaults
from autopar.specs.userbuffers import TE2_DEFAULTS, UbGemm, Userbuffers
from autopar.strategy import Strategy

runner = CliRunner()
GIB = 2**30


def _batch(**over) -> LayoutBatch:
    s = Strategy(**{**dict(dp=2, tp=4, sp=True), **over})
    return LayoutBatch.from_strategy(s, 64)


def test_overlapped_collectives_leave_first_chunk_and_excess():
    # tp 4: 10 ms of collectives under 40 ms of GEMMs leave 10/4 = 2.5 ms; under 4 ms: 6 + 2.5 ms.
    b = _batch()
    assert tp_overlap.comm_overlap_tp_s(b, np.array([10e-3]), np.array([40e-3]))[0] == pytest.approx(2.5e-3)
    assert tp_overlap.comm_overlap_tp_s(b, np.array([10e-3]), np.array([4e-3]))[0] == pytest.approx(8.5e-3)


def test_userbuffers_are_ten_activation_sized_bf16_buffers():
    # TE initialize_ub: 10 buffers of [seq * mbs / cp, hidden]: Llama-3-70B seq 8192 = 10 x 8192 x 8192 x 2 B.
    p = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192)
    on = tp_overlap.userbuffer_bytes(p, _batch(tp_comm_overlap=True))[0]
    assert on == 10 * 8192 * 8192 * 2 == 1.25 * GIB
    assert tp_overlap.userbuffer_bytes(p, _batch(tp_comm_overlap=True, cp=2, mbs=2))[0] == on  # mbs 2, cp 2
    assert tp_overlap.userbuffer_bytes(p, _batch())[0] == 0
    titan = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192, framework="torchtitan")
    assert tp_overlap.userbuffer_bytes(titan, _batch(tp_comm_overlap=True))[0] == 0  # symmetric memory: not modelled


def test_overlap_changes_the_estimate_in_time_and_memory():
    # NVIDIA's Llama-3-70B FP8 recipe (tp 4, pp 8, vpp 5): faster with overlap, by the exposed TP time
    # less what the userbuffers kernels' SMs cost the GEMMs (autopar.cost.userbuffers_sm), and
    # 1.25 GiB heavier on every stage. With kernels that take no SM the GEMMs are unchanged.
    no_sms = Userbuffers(**{name: UbGemm(method="ring_exchange", num_sm=0, set_sm_margin=False)
                            for name in Userbuffers.model_fields})
    base = dict(dp=2, tp=4, pp=8, vpp=5, sp=True, schedule="interleaved")
    for userbuffers in (no_sms, TE2_DEFAULTS):
        p = make_problem("llama3-70b", nodes=8, gbs=128, seq=8192, precision="fp8", userbuffers=userbuffers)
        on, off = estimate(p, Strategy(**base, tp_comm_overlap=True)), estimate(p, Strategy(**base))
        assert on.step_time_s < off.step_time_s
        diff = {k: off.time_breakdown_s[k] - on.time_breakdown_s[k] for k in on.time_breakdown_s}
        assert diff["tp_comm"] > 0  # the TP time shrinks
        assert diff["compute"] == 0 if userbuffers is no_sms else diff["compute"] < 0
        assert off.step_time_s - on.step_time_s == pytest.approx(sum(diff.values()))
        assert on.peak_memory_bytes - off.peak_memory_bytes == pytest.approx(1.25 * GIB)


def test_overlap_needs_sequence_parallelism():
    p = make_problem("llama3-8b")
    with pytest.raises(LayoutError, match="tp_comm_overlap_needs_sp: TP communication overlap .* needs sequence "
                                          "parallelism with tp > 1 \\(got tp=4, sp=off\\)"):
        check_strategy(p, Strategy(dp=2, tp=4, sp=False, tp_comm_overlap=True))


def test_default_is_each_targets_recipe():
    keys = dict(tp=4, sp=None, tp_comm_overlap=None)
    assert layout_defaults(None, keys)["tp_comm_overlap"] is True  # Megatron-Bridge llama3 70B H100 recipe
    assert layout_defaults(None, dict(keys, sp=False))["tp_comm_overlap"] is False  # needs SP
    assert layout_defaults(None, dict(keys, tp=1))["tp_comm_overlap"] is False
    for target in ("torchtitan", "mindspeed", "deepspeed", "galvatron", "sapp"):
        assert layout_defaults(None, keys, target)["tp_comm_overlap"] is False, target
    assert layout_defaults(None, dict(keys, tp_comm_overlap=False))["tp_comm_overlap"] is False  # option wins


def _script(tmp_path, extra: str, name: str = "run.sh") -> str:
    path = tmp_path / name
    path.write_text("torchrun --nnodes 8 --nproc_per_node 8 pretrain_gpt.py --num-layers 80 --hidden-size 8192 "
                    "--ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 "
                    "--swiglu --normalization RMSNorm --seq-length 8192 --vocab-size 128256 --bf16 "
                    "--micro-batch-size 1 --global-batch-size 128 --tensor-model-parallel-size 4 "
                    f"--pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 2 {extra}\n")
    return str(path)


def _step_s(script: str) -> float:
    res = runner.invoke(app, ["estimate", "--script", script, "--device", "h100-80gb", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["step_time_s"]


def test_script_flag_is_read_and_changes_the_estimate(tmp_path):
    # issue 15: a script's --tp-comm-overlap gave identical estimates with and without it.
    with_flag = _script(tmp_path, "--sequence-parallel --tp-comm-overlap", "on.sh")
    without = _script(tmp_path, "--sequence-parallel", "off.sh")
    assert read_script(with_flag).layout["tp_comm_overlap"] is True
    assert read_script(without).layout["tp_comm_overlap"] is False  # Megatron-LM's own default: off
    assert _step_s(with_flag) < _step_s(without)


def test_script_flag_without_sp_is_one_error_line(tmp_path):
    res = runner.invoke(app, ["estimate", "--script", _script(tmp_path, "--tp-comm-overlap"), "--device", "h100-80gb"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--tp-comm-overlap needs --sequence-parallel" in res.stderr


def test_mindspeed_overlap_is_mc2(tmp_path):
    # MindSpeed sets tp_comm_overlap = False itself (mindspeed/arguments.py): refused with that reason (it was
    # read as no overlap, silently); its overlap is MC2.
    with pytest.raises(AutoparError, match="--tp-comm-overlap in a MindSpeed-LLM script: MindSpeed switches it off"):
        read_script(_script(tmp_path, "--sequence-parallel --tp-comm-overlap --use-fused-rmsnorm", "a.sh"))
    mc2 = read_script(_script(tmp_path, "--sequence-parallel --use-ascend-mc2 --use-fused-rmsnorm", "b.sh"))
    old = read_script(_script(tmp_path, "--sequence-parallel --use-mc2", "c.sh"))
    assert mc2.framework == old.framework == "mindspeed"
    assert (mc2.layout["tp_comm_overlap"], old.layout["tp_comm_overlap"]) == (True, True)
    with pytest.raises(AutoparError, match="--use-ascend-mc2 needs --sequence-parallel"):
        read_script(_script(tmp_path, "--use-ascend-mc2", "d.sh"))


def test_exports_write_or_refuse_overlap():
    p = make_problem("llama3-8b", nodes=2, gbs=256, seq=4096)
    s = Strategy(dp=4, tp=4, sp=True, tp_comm_overlap=True)
    assert "--tp-comm-overlap" in WRITERS["megatron"](p, s)
    mindspeed = WRITERS["mindspeed"](p, s)
    assert "--use-ascend-mc2" in mindspeed and "--tp-comm-overlap" not in mindspeed
    titan = make_problem("llama3-8b", nodes=2, gbs=256, seq=4096, framework="torchtitan")
    toml = WRITERS["torchtitan"](titan, s.model_copy(update={"zero": 3}))
    assert "enable_async_tensor_parallel = true" in toml and "[compile]\nenable = true" in toml
    # torchtitan 0.2.2 raises "Async TP requires 'model' in --compile.components" (DeepSeek-V3's
    # own config compiles only the loss): the export names the model whatever the base config says
    assert 'components = [\n    "model",\n    "loss",\n]' in toml or 'components = ["model", "loss"]' in toml
    plain = WRITERS["torchtitan"](titan, Strategy(dp=4, tp=4, sp=True, zero=3))
    assert "enable_async_tensor_parallel = false" in plain and "[compile]\nenable = false" in plain
    for fmt, needle in (("galvatron", "Galvatron cannot express this layout: tp_comm_overlap"),
                        ("sapp", "SAPP cannot express this layout: TP communication overlap")):
        with pytest.raises(AutoparError, match=needle):
            WRITERS[fmt](p, s.model_copy(update={"zero": 0}))
    with pytest.raises(AutoparError, match="Megatron-DeepSpeed has no --tp-comm-overlap"):
        config_json(p, s)


def test_search_offers_overlap_only_where_the_target_writes_it():
    from autopar.search import search

    p = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192)
    assert any(e.strategy.tp_comm_overlap for e in search(p, top_k=5).layouts)
    assert not any(e.strategy.tp_comm_overlap for e in search(p, top_k=5, target="deepspeed").layouts)


def test_overlap_needs_tp_inside_one_nvlink_domain():
    # TE issue #1071: comm+GEMM overlap only with single-node tensor parallelism (H100: 8 per node).
    p = make_problem("llama3-70b", nodes=2, gbs=64, seq=8192)
    check_strategy(p, Strategy(dp=2, tp=8, sp=True, tp_comm_overlap=True))
    with pytest.raises(LayoutError, match="tp_comm_overlap_in_node: TP communication overlap with tp=16 spans more "
                                          "than one NVLink domain of 8 devices"):
        check_strategy(p, Strategy(dp=1, tp=16, sp=True, tp_comm_overlap=True))


def test_default_overlap_is_off_when_tp_leaves_the_node():
    # GPT-3 175B (96 heads) at tp 16 over two of the eight 8-GPU nodes: SP on, overlap off by default; asked for, refused.
    args = ["estimate", "--model", "gpt3-175b", "--device", "h100-80gb", "--nodes", "8", "--tp", "16", "--pp", "4",
            "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["strategy"]["sp"] is True and json.loads(res.stdout)["strategy"]["tp_comm_overlap"] is False
    res = runner.invoke(app, args + ["--tp-comm-overlap"])
    assert res.exit_code == 2 and "tp_comm_overlap_in_node" in res.stderr
