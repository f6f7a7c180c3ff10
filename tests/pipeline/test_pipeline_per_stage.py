"""Recompute per pipeline stage: validation, per-stage costing, search ranking, fast makespan.

The hand-checkable case: Llama-3-8B (32 layers), pp=4, dp=2, seq 4096, gbs 64 on 8 A100-40GB.
Without recompute stage 0 holds 4 micro-batches in flight and needs 44.4 GiB (stages 1-3:
34.3, 30.0, 33.6), so no layout without recompute fits under the 36 GiB (90%) limit; full
recompute everywhere fits but recomputes every layer on every stage. Full on stage 0 only fits
(its memory is the all-full stage 0, the others the no-recompute ones) and is faster.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.stage import all_stages
from autopar.cost.stage_time import stage_time
from autopar.estimate import estimate
from autopar.pipeline.balance import _plan_cost, _uniform_counts, balance
from autopar.pipeline.chunk_costs import chunk_costs
from autopar.pipeline.folded import fold
from autopar.pipeline.layers import layer_table
from autopar.pipeline.makespan import static_makespan_s
from autopar.pipeline.rebalance import TableCache, per_stage_candidates
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.pipeline.split import dp_split
from autopar.search import search
from autopar.space import SpaceOptions
from autopar.strategy import Strategy

GIB = 2**30
BASE = ["--model", "llama3-8b", "--device", "a100-40gb", "--nodes", "1", "--gbs", "64", "--seq-len", "4096"]
PIPELINED = SpaceOptions(tp=(1,), pp=(4,), cp=(1,), mbs=(1,), zero=(1,), max_vpp=1)


@pytest.fixture(scope="module")
def p():
    return make_problem("llama3-8b", device="a100-40gb", gbs=64, seq=4096)


def test_per_stage_field_is_validated_and_normalised():
    s = Strategy(dp=2, pp=4, recompute_per_stage=("full", "selective", "none", "none"))
    assert s.recompute == "full" and s.stage_recompute == ("full", "selective", "none", "none")
    same = Strategy(dp=2, pp=2, recompute_per_stage=("selective", "selective"))
    assert same.recompute_per_stage is None and same.recompute == "selective"
    for bad, why in [(dict(pp=3), "one per pipeline stage"), (dict(pp=4, recompute_layers=2), "recompute_layers"),
                     (dict(pp=4, recompute="none"), "heaviest")]:
        with pytest.raises(ValueError, match=why):
            Strategy(dp=2, recompute_per_stage=("full", "none", "none", "none"), **bad)


def test_each_stage_is_costed_with_its_own_option(p):
    none = estimate(p, Strategy(dp=2, pp=4, recompute="none"))
    full = estimate(p, Strategy(dp=2, pp=4, recompute="full"))
    mixed = estimate(p, Strategy(dp=2, pp=4, recompute_per_stage=("full", "none", "none", "none")))
    limit = 0.9 * p.cluster.device.memory_bytes
    assert none.memory_per_stage[0].total_bytes > limit  # stage 0 cannot go without recompute
    assert [m.total_bytes for m in mixed.memory_per_stage] == pytest.approx(
        [full.memory_per_stage[0].total_bytes] + [m.total_bytes for m in none.memory_per_stage[1:]], rel=1e-12)
    assert [m.recompute for m in mixed.memory_per_stage] == ["full", "none", "none", "none"]
    assert mixed.fits and not mixed.marginal
    # Per-micro-batch stage times: stage 0 as in all-full, stages 1-3 as without recompute.
    t_full, t_none = (stage_time(p, *all_stages(p, e.strategy)) for e in (full, none))
    per_stage = np.concatenate([t_full.total_s[:1], t_none.total_s[1:]])
    bottleneck, m = int(np.argmax(per_stage)), mixed.num_microbatches
    compute = np.concatenate([t_full.compute_s[:1], t_none.compute_s[1:]])
    assert m == 32 and bottleneck == 0
    assert mixed.time_breakdown_s["compute"] == pytest.approx(m * compute[bottleneck], rel=1e-12)
    assert mixed.step_time_s >= m * per_stage.max()  # the slowest stage runs every micro-batch
    assert full.step_time_s > mixed.step_time_s > none.step_time_s
    assert sum(mixed.time_breakdown_s.values()) == pytest.approx(mixed.step_time_s, rel=1e-12)
    assert mixed.to_dict(64)["strategy"]["recompute_per_stage"] == ["full", "none", "none", "none"]


def test_search_ranks_per_stage_recompute_only_for_targets_that_can_write_it(p):
    uniform = search(p, top_k=5, options=PIPELINED)  # megatron: one recompute for all stages
    mixed = search(p, top_k=5, options=PIPELINED, target="sapp")
    assert all(e.strategy.recompute_per_stage is None for e in uniform.layouts)
    best = mixed.layouts[0]
    assert best.strategy.recompute_per_stage is not None and best.strategy.recompute_per_stage[0] == "full"
    assert "none" in best.strategy.recompute_per_stage
    assert best.step_time_s < min(e.step_time_s for e in uniform.layouts)  # beats every uniform layout
    assert best.peak_memory_bytes <= 0.9 * p.cluster.device.memory_bytes
    again = estimate(p, best.strategy)
    assert again.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    # Galvatron has no distributed optimizer (zero=1) and no selective recompute: the search
    # skips what it cannot write and keeps per-stage none/full.
    ddp_or_zero1 = SpaceOptions(tp=(2,), pp=(2,), cp=(1,), mbs=(1,), zero=(0, 1), max_vpp=1)
    galvatron = search(p, top_k=5, options=ddp_or_zero1, target="galvatron")
    assert galvatron.not_writable > 0
    assert all(e.strategy.zero == 0 and set(e.strategy.stage_recompute) <= {"none", "full"}
               for e in galvatron.layouts)


def test_recompute_counts_beat_one_option_per_stage(p):
    """The search's DP candidate (exact min-max split, fastest fitting option per stage) is
    (7, 8, 9, 8) with full on stage 0; recomputing only some layers of a stage (the balancer's
    counts, SAPP-PPB's ``recompute`` arrays) fits a faster split in the same memory."""
    limit = 0.9 * p.cluster.device.memory_bytes
    s = Strategy(dp=2, pp=4, recompute="full")
    table = layer_table(p, s, limit)
    plan = balance(table, 1, 32, "1f1b")
    assert plan.solver == "highs" and plan.optimal
    uniform, mixed = per_stage_candidates(p, s, limit, ("none", "selective", "full"), use_ilp=False)
    assert uniform.recompute_per_stage is None and uniform.recompute == "full"
    assert (mixed.layers_per_stage, mixed.recompute_per_stage) == ((7, 8, 9, 8), ("full", "none", "none", "none"))
    assert sum(plan.best.layers_per_stage) == 32 and max(plan.best.stage_memory_bytes) <= limit
    costs = chunk_costs(table, 1, "1f1b", 32)
    per_stage = _uniform_counts(costs, np.array([[7], [8], [9], [8]]), np.array([2, 0, 0, 0]))
    assert plan.best.makespan_s < 0.95 * _plan_cost(table, costs, per_stage, 32, "1f1b").makespan_s


def test_no_integer_program_when_the_fastest_option_fits_everywhere():
    """llama3-8b pp4 on H100-80GB: no recompute fits on every stage, so the memory-free DP
    split with no recompute is the answer (a lower bound that is reached)."""
    q = make_problem("llama3-8b", gbs=64, seq=4096)
    s = Strategy(dp=2, pp=4, recompute="selective")
    cache = TableCache()
    got = per_stage_candidates(q, s, 0.9 * q.cluster.device.memory_bytes, ("none", "selective", "full"), cache)
    table = cache.get(q, s.model_copy(update={"recompute": "full"}), 0.9 * q.cluster.device.memory_bytes)
    folded = fold(table, 1, in_flight_chunks("1f1b", 4, 1, 16) / 1)
    bounds = dp_split(folded, 0)
    assert len(got) == 1 and got[0].recompute == "none" and got[0].recompute_per_stage is None
    assert list(got[0].layers_per_stage) == list(np.diff(bounds))
    assert len(cache) == 1  # selective and full layouts of one shape share the table


@pytest.mark.parametrize("seed", range(6))
def test_extrapolated_makespan_equals_the_event_simulation(seed):
    """m > 4 pp uses the steady-state extrapolation; it must match the full event simulation."""
    rng = np.random.default_rng(seed)
    pp, vpp = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    times = PipelineTimes(rng.random((pp, vpp)) + 0.1, 2 * rng.random((pp, vpp)) + 0.1,
                          rng.random((pp, vpp)) * (seed % 2), float(rng.random() * 0.05))
    schedule = "interleaved" if vpp > 1 else "1f1b"
    m = pp * int(rng.integers(5, 12))
    assert static_makespan_s(times, m, schedule) == pytest.approx(simulate(times, m, schedule).makespan_s, rel=1e-9)


def test_cli_estimate_and_search_show_per_stage_recompute():
    runner = CliRunner()
    out = runner.invoke(app, ["estimate", *BASE, "--pp", "4", "--recompute-per-stage", "full,none,none,none",
                              "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["strategy"]["recompute"] == "full"
    assert [m["recompute"] for m in doc["memory_per_stage"]] == ["full", "none", "none", "none"]
    bad = runner.invoke(app, ["estimate", *BASE, "--pp", "4", "--recompute-per-stage", "full,none"])
    assert bad.exit_code == 2 and "one per pipeline stage (pp=4)" in bad.output and "Traceback" not in bad.output
    bad = runner.invoke(app, ["search", *BASE, "--target", "nemo"])
    assert bad.exit_code == 2 and "target='nemo'" in bad.output
