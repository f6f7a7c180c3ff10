"""Context-parallel algorithms (``Strategy.cp_comm_type``): ring sizes, the all-to-all and all-gather
costs (autopar.cost.cp_comm), the head rules, the script readers and the exports."""

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import attention as attn
from autopar.cost import comm, cp_comm
from autopar.errors import AutoparError, LayoutError
from autopar.export import WRITERS
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import make_problem

runner = CliRunner()


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=1, cp=2), **over}), 64)


@pytest.mark.parametrize("layout, steps", [
    (dict(dp=1, cp=8), 8), (dict(dp=1, cp=8, cp_comm_type="a2a"), 1), (dict(dp=1, cp=8, cp_comm_type="allgather"), 1),
    (dict(dp=1, cp=8, cp_comm_type="a2a+p2p", cp_a2a=2), 4),
])
def test_ring_steps(layout, steps):
    assert attn.ring_steps(_batch(**layout))[0] == steps


def test_ulysses_all_to_all_by_hand():
    # Llama-3-8B (32 heads, 8 kv heads of 128), seq 8192, mbs 1, tp 1, cp 2 in one node: each rank holds
    # 4096 tokens; Q+K+V = 4096 x (4096 + 2 x 1024) x 2 B, O = 4096 x 4096 x 2 B; each all-to-all sends
    # half of it over NVLink (one share stays) plus one latency step (log2 2).
    p = make_problem("llama3-8b", seq=8192)
    intra, alpha, _, _ = comm.link_params(p, "all_to_all")
    qkv, out = 4096 * (4096 + 2 * 1024) * 2, 4096 * 4096 * 2
    fwd, bwd = cp_comm.a2a_exposed_s(p, _batch(cp_comm_type="a2a"))
    assert fwd[0] == pytest.approx(qkv / 2 / intra + alpha + out / 2 / intra + alpha)
    assert bwd[0] == pytest.approx(fwd[0])  # dO, then dQ + dK + dV: the same volumes
    assert cp_comm.a2a_exposed_s(p, _batch())[0][0] == 0  # the ring has no all-to-all


def test_allgather_gathers_kv_forward_and_again_backward():
    # K/V of the whole sequence: 8192 x 2 x 1024 x 2 B gathered over cp 2 in one node (ring all-gather).
    p = make_problem("llama3-8b", seq=8192)
    gather = float(comm.all_gather_s(p, 8192 * 2 * 1024 * 2, 2, 1))
    fwd, bwd = cp_comm.allgather_exposed_s(p, _batch(cp_comm_type="allgather"))
    assert (fwd[0], bwd[0]) == pytest.approx((gather, 2 * gather))
    total_fwd, _ = cp_comm.exposed_s(p, _batch(cp_comm_type="allgather"), attention_fwd_s=1.0)
    assert total_fwd[0] == pytest.approx(gather)  # no ring part left


def test_hierarchical_ring_runs_between_the_all_to_all_groups():
    # cp 8 = a2a 2 x p2p 4: the ring has 4 steps whose members are tp * 2 ranks apart.
    p = make_problem("llama3-8b", nodes=2, seq=32768)
    hier = _batch(cp=8, cp_comm_type="a2a+p2p", cp_a2a=2)
    ring = _batch(cp=4)
    assert attn.ring_exposed_s(p, hier, 1e-3)[1][0] > 0
    a2a_fwd, _ = cp_comm.a2a_exposed_s(p, hier)
    assert a2a_fwd[0] > 0 and cp_comm.a2a_exposed_s(p, ring)[0][0] == 0


def test_ulysses_needs_heads_divisible_by_the_group():
    check_strategy(make_problem("llama3-8b", nodes=4, seq=8192),  # 32 heads / tp 8 = 4 heads on 4 ranks
                   Strategy(dp=1, tp=8, cp=4, sp=True, cp_comm_type="a2a"))
    p = make_problem("llama3-8b", nodes=8, seq=8192)
    with pytest.raises(LayoutError, match="cp_a2a_divides_heads: .* num_attention_heads/tp = 32/8 must be divisible"):
        check_strategy(p, Strategy(dp=1, tp=8, cp=8, sp=True, cp_comm_type="a2a"))


def test_megatron_writer_refuses_kv_heads_te_cannot_scatter():
    # 8 kv heads / tp 4 = 2 per rank over an all-to-all of 4: TE asserts num_heads_kv % cp_size == 0.
    p = make_problem("llama3-8b", nodes=2, seq=8192)
    s = Strategy(dp=1, tp=4, cp=4, sp=True, cp_comm_type="a2a")
    with pytest.raises(AutoparError, match="num_key_value_heads/tp = 2 is not divisible"):
        WRITERS["megatron"](p, s)


def test_exports_write_each_algorithm():
    p = make_problem("llama3-8b", nodes=2, seq=8192)
    hier = Strategy(dp=1, tp=2, cp=8, sp=True, cp_comm_type="a2a+p2p", cp_a2a=2)
    assert "--cp-comm-type a2a+p2p" in WRITERS["megatron"](p, hier)
    assert "--hierarchical-context-parallel-sizes 2 4" in WRITERS["megatron"](p, hier)
    mindspeed = WRITERS["mindspeed"](p, hier)
    assert "--context-parallel-algo hybrid_cp_algo" in mindspeed and "--ulysses-degree-in-cp 2" in mindspeed
    ulysses = Strategy(dp=4, tp=2, cp=2, sp=True, cp_comm_type="a2a")
    assert "--context-parallel-algo ulysses_cp_algo" in WRITERS["mindspeed"](p, ulysses)
    with pytest.raises(AutoparError, match="MindSpeed-LLM cannot express this layout: context parallelism "
                                           "cp_comm_type=allgather"):
        WRITERS["mindspeed"](p, ulysses.model_copy(update={"cp_comm_type": "allgather"}))
    with pytest.raises(AutoparError, match="torchtitan cannot express this layout: context parallelism cp_comm_type=a2a"):
        WRITERS["torchtitan"](p, ulysses.model_copy(update={"zero": 3}))


def _script(tmp_path, extra: str, name: str) -> str:
    path = tmp_path / name
    path.write_text("torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                    "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                    "--swiglu --normalization RMSNorm --seq-length 32768 --max-position-embeddings 32768 "
                    "--vocab-size 128256 --bf16 --micro-batch-size 1 --global-batch-size 16 "
                    f"--tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size 8 {extra}\n")
    return str(path)


@pytest.mark.parametrize("flags, kind, a2a", [
    ("", "p2p", 1),
    ("--cp-comm-type a2a", "a2a", 8),
    ("--cp-comm-type allgather", "allgather", 1),
    ("--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4", "a2a+p2p", 2),
    ("--use-fused-rmsnorm --context-parallel-algo ulysses_cp_algo", "a2a", 8),
    ("--use-fused-rmsnorm --context-parallel-algo megatron_cp_algo", "p2p", 1),
    ("--use-fused-rmsnorm --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 4", "a2a+p2p", 4),
])
def test_scripts_name_their_algorithm(tmp_path, flags, kind, a2a):
    plan = read_script(_script(tmp_path, flags, "run.sh"))
    s = plan.strategy(16, 32)
    assert (s.cp_comm_type, s.cp_a2a_size) == (kind, a2a)


@pytest.mark.parametrize("flags, needle", [
    ("--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2", "whose product is --context-parallel-size=8"),
    ("--use-fused-rmsnorm --context-parallel-algo hybrid_cp_algo", "needs --ulysses-degree-in-cp U"),
    ("--use-fused-rmsnorm --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 8", "cp/U >= 2 (got 8)"),
    ("--use-fused-rmsnorm --context-parallel-algo adaptive_cp_algo", "adaptive algorithms are not modelled"),
])
def test_bad_algorithm_flags_are_one_error_line(tmp_path, flags, needle):
    res = runner.invoke(app, ["estimate", "--script", _script(tmp_path, flags, "bad.sh"), "--device", "h100-80gb"])
    err = res.stderr.strip()
    assert res.exit_code == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_mindspeed_ulysses_is_no_longer_costed_as_the_ring(tmp_path):
    # issue 15: --context-parallel-algo ulysses_cp_algo gave the ring's step time (the same 15.255 s).
    def step(flags, name):
        res = runner.invoke(app, ["estimate", "--script", _script(tmp_path, flags, name), "--device", "h100-80gb",
                                  "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)
    ring = step("--use-fused-rmsnorm --context-parallel-algo megatron_cp_algo", "ring.sh")
    ulysses = step("--use-fused-rmsnorm --context-parallel-algo ulysses_cp_algo", "ulysses.sh")
    assert ulysses["strategy"]["cp_comm_type"] == "a2a" and ring["strategy"]["cp_comm_type"] == "p2p"
    assert ulysses["time_breakdown_s"]["cp_comm"] != ring["time_breakdown_s"]["cp_comm"]
    assert ulysses["step_time_s"] != ring["step_time_s"]


def test_deepspeed_ulysses_is_written_as_ds_sequence_parallel():
    # Megatron-DeepSpeed: --ds-sequence-parallel-size N (Ulysses), not with --sequence-parallel; the K/V
    # heads are scattered too (8 kv heads / tp 1 over cp 4: 2 each); Ulysses only with tp = pp = 1
    # (Megatron-DeepSpeed megatron/core/parallel_state.py initialize_model_parallel asserts it).
    from autopar.export.megatron_deepspeed import write

    p = make_problem("llama3-8b", nodes=2, seq=8192)
    text = write(p, Strategy(dp=4, cp=4, cp_comm_type="a2a", zero=1))
    assert "--ds-sequence-parallel-size 4" in text and "--sequence-parallel " not in text
    for layout, needle in ((dict(dp=4, cp=4), "DeepSpeed's sequence parallelism is Ulysses"),
                           (dict(dp=2, tp=2, sp=True, cp=4, cp_comm_type="a2a"), "cannot be combined with "
                                                                                  "--sequence-parallel"),
                           (dict(dp=1, tp=2, cp=8, cp_comm_type="a2a"), "does not work with tensor parallel"),
                           (dict(dp=1, cp=16, cp_comm_type="a2a"), "num_key_value_heads/tp = 8 is not divisible")):
        with pytest.raises(AutoparError, match=needle):
            write(p, Strategy(**layout, zero=1))
