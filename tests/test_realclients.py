"""Exports run through the frameworks' own configuration code, field by field against the plan.

Marker ``realclients`` (``pytest -m realclients``). Each framework runs in its own interpreter:
``AUTOPAR_TORCHTITAN_PYTHON``, ``AUTOPAR_DEEPSPEED_PYTHON``, ``AUTOPAR_GALVATRON_PYTHON`` (default:
this interpreter), a Python where ``pip install -e '.[realclients-torchtitan]'`` (``-deepspeed``,
``-galvatron``) installed torchtitan 0.2.2, deepspeed 0.19.8 or hetu-galvatron 2.4.0 from PyPI
(``.ci/run`` builds the three). A test skips, saying which, where that import fails.

The drivers in ``tests/realclients/`` run the framework's code on each export and print what it
will run (``EFFECTIVE {json}``): torchtitan's ConfigManager on the export merged into the model's
train config (``tests/data/torchtitan``: the plan-relevant sections of the v0.2.2 configs, which
the wheel does not ship), ParallelDims + build_mesh on a fake process group, the model on the meta
device and its pipelining_fn / parallelize_fn; DeepSpeed's ``DeepSpeedConfig`` with the
data-parallel world Megatron-DeepSpeed's mpu reports; Galvatron's
``get_hybrid_parallel_configs_api``, ``check_hp_config`` and ``hp_config_whole_model``. The
layouts are the top 3 of ``search --target FORMAT`` on problems of the issue's campaign
(Llama-3-8B on 8 H100 at 8K, Llama-3-70B on 64 H100 at 8K, Qwen3-30B-A3B on 16 H100 at 4K).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_problem

from autopar.export import FILE_WRITERS, WRITERS, torchtitan
from autopar.search import search
from autopar.search.grid import for_target
from autopar.specs.hf import load_model
from autopar.strategy import Strategy

pytestmark = pytest.mark.realclients
HERE = Path(__file__).parent
DRIVERS = HERE / "realclients"
TT_CONFIGS = HERE / "data" / "torchtitan"
PROBLEMS = {  # name -> make_problem arguments (the campaign problems that these frameworks run)
    "llama3-8b": dict(nodes=1, gbs=128, seq=8192),
    "llama3-70b": dict(nodes=8, gbs=512, seq=8192),
    "qwen3-30b-a3b": dict(nodes=2, gbs=256, seq=4096),
}
TOP = 3


def _python(framework: str, module: str) -> str:
    """The interpreter for ``framework`` (env ``AUTOPAR_<FRAMEWORK>_PYTHON``), or skip the test."""
    python = os.environ.get(f"AUTOPAR_{framework.upper()}_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"{framework} is not installed for {python} (import {module} failed; pip install -e "
                    f"'.[realclients-{framework}]' or set AUTOPAR_{framework.upper()}_PYTHON)")
    return python


def _layouts(target: str, models=tuple(PROBLEMS)) -> list[tuple[str, object, Strategy]]:
    """(model, problem as the target costs it, layout) for the top layouts of each problem."""
    out = []
    for name in models:
        p = for_target(make_problem(name, **PROBLEMS[name]), target)
        out += [(name, p, e.strategy) for e in search(p, top_k=TOP, target=target).layouts]
    return out


def _effective(python: str, driver: str, jobs: list[list[str]], tmp_path: Path, env: dict | None = None) -> dict:
    """Run ``driver --batch`` over ``jobs``; {export path: (accepted?, message, effective dict)}."""
    listing = tmp_path / "jobs.txt"
    listing.write_text("".join(" ".join(job) + "\n" for job in jobs))
    res = subprocess.run([python, str(DRIVERS / driver), "--batch", str(listing)], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=1200)
    out: dict = {}
    for line in res.stdout.splitlines():
        kind, path, rest = (line.split(" ", 2) + [""])[:3]
        ok, msg, eff = out.get(path, (False, "", None))
        if kind == "OK":
            ok, msg = True, rest
        elif kind.startswith(("REJECTED", "ERROR")):
            msg = rest
        elif kind == "EFFECTIVE":
            eff = json.loads(rest)
        out[path] = (ok, msg, eff)
    assert len(out) == len(jobs), res.stderr[-2000:]
    return out


def _split(p, s: Strategy) -> list[int]:
    from autopar.export.layout_flags import stage_layers
    return list(stage_layers(p, s))


def _rank0_chunks(p, s: Strategy) -> list[int]:
    """Decoder layers of pipeline rank 0's model chunks in the plan: its first stage split into vpp
    equal chunks, or with the embedding counted as a layer (Megatron's embedding/loss-aware split)
    k = (L + e + l) / (pp * vpp) slots per chunk, the first holding the embedding and k - 1 layers."""
    if s.account_for_embedding or s.account_for_loss:
        k = (p.model.num_layers + s.account_for_embedding + s.account_for_loss) // (s.pp * s.vpp)
        return [k - s.account_for_embedding] + [k] * (s.vpp - 1)
    return [_split(p, s)[0] // s.vpp] * s.vpp


def test_torchtitan_runs_the_plan(tmp_path):
    python = _python("torchtitan", "torchtitan")
    jobs, plans = [], {}
    for i, (name, p, s) in enumerate(_layouts("torchtitan")):
        path = tmp_path / f"{name}.{i}.toml"
        path.write_text(WRITERS["torchtitan"](p, s))
        jobs.append([str(path), str(p.world_size)])
        plans[str(path)] = (p, s)
    results = _effective(python, "torchtitan_check.py", jobs, tmp_path, {"TT_CONFIGS": str(TT_CONFIGS)})
    for path, (ok, msg, e) in results.items():
        p, s = plans[path]
        assert ok, f"{path}: {msg}"
        m = s.num_microbatches(p.train.global_batch_size)
        want = dict(dp=s.dp, tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=s.expert_tp if s.ep > 1 else 1,
                    gbs=p.train.global_batch_size, mbs=s.mbs, num_microbatches=m, sp=s.tp > 1,
                    reshard={2: "never", 3: "always" if s.pp == 1 else "default"}.get(s.zero),
                    recompute=s.recompute, precision="bfloat16", converters=[],
                    async_tp=s.tp_comm_overlap, compile=s.tp_comm_overlap)  # async TP needs compile
        got = dict(dp=e["dp_replicate"] * e["dp_shard"], tp=e["tp"], pp=e["pp"], cp=e["cp"], ep=e["ep"], etp=e["etp"],
                   gbs=e["global_batch_size"],
                   mbs=e["pp_microbatch_size"] if s.pp > 1 else e["local_batch_size"],
                   num_microbatches=e["pp_n_microbatches"] if s.pp > 1 else e["grad_accum_steps"],
                   sp=e["tp"] > 1,  # torchtitan's TP always shards the sequence (SequenceParallel norms)
                   reshard=e["fsdp_reshard_after_forward"] if s.zero >= 2 else None,
                   recompute=e["ac_mode"], precision=e["mp_param"], converters=e["float8"],
                   async_tp=e["async_tp"], compile=e["compile"])
        assert got == want, path
        if s.pp > 1:
            assert e["pp_layers_per_stage"] == _rank0_chunks(p, s), path
            assert e["grad_accum_steps"] == 1 and e["pp_schedule"] == torchtitan.V_SCHEDULES.get(
                s.schedule, "Interleaved1F1B" if s.vpp > 1 else "1F1B")


@pytest.mark.parametrize("schedule,name", [("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_torchtitan_runs_the_v_schedules(tmp_path, schedule, name):
    """Llama-3-70B on 64 H100 with tp 8, pp 4 x 2 chunks: torchtitan builds the V schedule's class
    with 10 layers per stage on each of a rank's two stages and every micro-batch."""
    python = _python("torchtitan", "torchtitan")
    p = for_target(make_problem("llama3-70b", **PROBLEMS["llama3-70b"]), "torchtitan")
    s = Strategy(dp=2, tp=8, sp=True, pp=4, vpp=2, zero=3, schedule=schedule)
    path = tmp_path / f"{schedule}.toml"
    path.write_text(WRITERS["torchtitan"](p, s))
    (ok, msg, e), = _effective(python, "torchtitan_check.py", [[str(path), str(p.world_size)]], tmp_path,
                               {"TT_CONFIGS": str(TT_CONFIGS)}).values()
    assert ok, msg
    assert (e["pp_schedule"], e["pp_schedule_class"]) == (name, "Schedule" + name)
    assert e["pp_layers_per_stage"] == [10, 10] and e["pp_n_microbatches"] == 512 // 2


def test_torchtitan_refusals_are_what_torchtitan_raises(tmp_path):
    """The layouts autopar refuses for Qwen3 (pp) and DeepSeek-V3 (cp), written anyway by hand,
    make torchtitan raise the reason the refusal quotes."""
    python = _python("torchtitan", "torchtitan")
    cases = {"qwen3-30b-a3b": (make_problem("qwen3-30b-a3b", nodes=2, gbs=256), Strategy(dp=4, pp=2, tp=2, sp=True,
                                                                                        zero=3, ep=2, etp=1)),
             "deepseek-v3": (make_problem(load_model("deepseek-v3").model_copy(update={"mtp_num_layers": 0}),  # no MTP
                                          nodes=128, gbs=2048), Strategy(dp=512, cp=2, zero=3, ep=8))}
    jobs, reasons = [], {}
    for name, (p, s) in cases.items():
        reason = torchtitan.model_refusal(p, s)
        ok_s = s.model_copy(update={"pp": 1, "cp": 1, "dp": s.dp * s.pp * s.cp})  # what the writer accepts
        doc = torchtitan.config(p, ok_s)
        doc["parallelism"].update(pipeline_parallel_degree=s.pp, context_parallel_degree=s.cp,
                                  data_parallel_shard_degree=s.dp)
        if s.pp > 1:
            doc["parallelism"].update(pipeline_parallel_schedule="1F1B", pipeline_parallel_microbatch_size=1)
            doc["training"]["local_batch_size"] = p.train.global_batch_size // s.dp
        path = tmp_path / f"{name}.toml"
        path.write_text(torchtitan.HEADER.format(model=p.model.name) + torchtitan.to_toml(doc))
        jobs.append([str(path), str(p.world_size)])
        reasons[str(path)] = reason
    for path, (ok, msg, _) in _effective(python, "torchtitan_check.py", jobs, tmp_path,
                                         {"TT_CONFIGS": str(TT_CONFIGS)}).items():
        quoted = reasons[path].split("'")[1]
        assert not ok and quoted in msg, (path, msg)


def test_deepspeed_config_runs_the_plan(tmp_path):
    python = _python("deepspeed", "deepspeed")
    jobs, plans = [], {}
    for i, (name, p, s) in enumerate(_layouts("deepspeed", ("llama3-8b", "llama3-70b"))):
        out = tmp_path / f"{name.replace('.', '_')}_{i}"
        FILE_WRITERS["deepspeed"](p, s, out)
        jobs.append([str(out), str(p.world_size)])
        plans[str(out)] = (p, s)
    for path, (ok, msg, e) in _effective(python, "deepspeed_check.py", jobs, tmp_path).items():
        p, s = plans[path]
        assert ok, f"{path}: {msg}"
        full = s.recompute == "full"
        want = dict(dp=s.dp, tp=s.tp, pp=s.pp, gbs=p.train.global_batch_size, mbs=s.mbs,
                    num_microbatches=s.num_microbatches(p.train.global_batch_size), zero=s.zero, sp=s.sp,
                    bf16=True, product=p.train.global_batch_size, notes=[],
                    recompute=("block", s.recompute_layers) if full and s.recompute_layers else
                    ("uniform", 1) if full else s.recompute)
        argv = e["argv_recompute"]
        got_recompute = ((e["recompute_method"], int(e["recompute_num_layers"])) if e["recompute_method"] else
                         ("uniform", int(e["checkpoint_num_layers"])) if "--checkpoint-activations" in argv else
                         "selective" if "--recompute-granularity" in argv else "none")
        got = dict(dp=e["ds_world_size"], tp=e["tp"], pp=e["pp"], gbs=e["train_batch_size"], mbs=e["micro_batch"],
                   num_microbatches=e["grad_accum"], zero=e["zero_stage"], sp=e["sp"], bf16=e["bf16"],
                   product=e["product"], notes=e["notes"], recompute=got_recompute)
        assert got == want, path


# Layouts with Galvatron's own knobs (GPipe, vtp/vsp, non-consecutive TP) on Llama-3-8B, gbs 64: (nodes, layout).
GALVATRON_KNOBS = [
    (1, dict(dp=4, tp=1, pp=2, zero=3, vocab_tp=4, schedule="gpipe")),
    (2, dict(dp=2, tp=8, sp=True, zero=0, tp_consecutive=False, vocab_tp=8, vocab_sp=True)),
    (1, dict(dp=2, tp=4, sp=True, zero=2, vocab_tp=1, mbs=4)),
    (2, dict(dp=4, tp=2, pp=2, sp=True, zero=3, vocab_tp=8, vocab_sp=True, tp_consecutive=False)),
]


def _galvatron_layouts() -> list[tuple[str, object, Strategy]]:
    """The top layouts of --target galvatron plus :data:`GALVATRON_KNOBS`."""
    knobs = [("llama3-8b", for_target(make_problem("llama3-8b", nodes=n, gbs=64), "galvatron"), Strategy(**kw))
             for n, kw in GALVATRON_KNOBS]
    return _layouts("galvatron", ("llama3-8b", "llama3-70b")) + knobs


def test_galvatron_runs_the_plan(tmp_path):
    python = _python("galvatron", "galvatron")
    jobs, plans = [], {}
    for i, (name, p, s) in enumerate(_galvatron_layouts()):
        path = tmp_path / f"{name}.{i}.json"
        path.write_text(WRITERS["galvatron"](p, s))
        jobs.append([str(path), str(p.world_size), str(p.model.num_layers)])
        plans[str(path)] = (p, s)
    for path, (ok, msg, e) in _effective(python, "galvatron_check.py", jobs, tmp_path).items():
        p, s = plans[path]
        assert ok, f"{path}: {msg}"
        split = _split(p, s)
        stages = s.recompute_per_stage or (s.recompute,) * s.pp
        checkpointed = sum(min(n, s.recompute_layers or n) if o == "full" else 0 for n, o in zip(split, stages))
        # Galvatron's data loader splits the batch over the vocabulary layers' data parallelism, world/pp/vtp
        # ranks, so each sees mbs*vtp/tp sequences per micro-batch (rule vocab_tp_whole_samples).
        want = dict(pp=s.pp, tp=[s.tp], dp=[s.dp * s.cp], gbs=p.train.global_batch_size,
                    mbs=s.mbs * s.vocab_tp_size / s.tp, vocab=(s.vocab_tp_size, int(s.vocab_sp)),
                    pipeline_type="gpipe" if s.schedule == "gpipe" else "pipedream_flush",
                    tp_consecutive=[int(s.tp_consecutive)],
                    num_microbatches=s.num_microbatches(p.train.global_batch_size), split=split,
                    zero=({0: "ddp", 2: "zero2", 3: "zero2"}[s.zero], p.model.num_layers if s.zero == 3 else 0,
                          int(s.zero == 3)),
                    checkpoint_layers=checkpointed, ulysses=0, layer_mbs=[float(s.mbs)] * p.model.num_layers)
        got = dict(pp=e["pp"], tp=e["tp"], dp=e["dp_per_layer"], gbs=e["global_bsz"], mbs=e["micro_batch"],
                   vocab=(e["vocab_tp"], e["vocab_sp"]), pipeline_type=e["pipeline_type"],
                   tp_consecutive=e["tp_consecutive"],
                   num_microbatches=e["real_chunks"], split=e["pp_division"],
                   zero=(e["default_dp_type"], e["zero3_layers"], e["embed_sdp"]),
                   checkpoint_layers=e["checkpoint_layers"], ulysses=e["use_sp"], layer_mbs=e["micro_batch_per_layer"])
        assert got == want, path
        # keys 2.4.0 does not read carry only main's spelling of the same plan
        assert set(e["ignored_keys"]) <= {"cp_sizes_enc", "vcp", "vocab_sdp"}, path


def test_galvatron_runs_the_layerwise_plan(tmp_path):
    """Layer-wise plans (the search's best for Llama-7B on 8 x A100-40GB under a tight budget, and
    a hand-made one mixing tp 1/2/4, ZeRO-3 and checkpointing per layer) as Galvatron 2.4.0's
    reader builds them: every per-layer field, the split, chunks and the vocabulary options."""
    from autopar.export import galvatron_layerwise
    from autopar.layerwise import LayerwisePlan, search_layerwise

    python = _python("galvatron", "galvatron")
    p = make_problem("llama2-7b", device="a100-40gb", gbs=64, seq=4096)
    searched = search_layerwise(p, max_tp=4, memory_limit_bytes=0.75 * p.cluster.device.memory_bytes).plan
    mixed = LayerwisePlan(pp=2, num_microbatches=8, layers_per_stage=(16, 16),
                          tp=(1,) * 6 + (2,) * 10 + (4,) * 8 + (2,) * 8, zero3=tuple(i % 3 == 0 for i in range(32)),
                          recompute=tuple(i < 12 for i in range(32)), default_zero=2, vocab_tp=4, vocab_zero3=True)
    jobs, plans = [], {}
    vtp1 = mixed.model_copy(update={"vocab_tp": 1, "vocab_zero3": False})  # the embedding's dp 4 > most layers'
    ulysses = LayerwisePlan(**{**mixed.model_dump(), "ulysses": tuple(t > 1 and i % 2 == 0 for i, t in enumerate(mixed.tp)),
                               "sp": True})  # Galvatron's use_sp on every other tp > 1 layer
    for name, plan in (("searched", searched), ("mixed", mixed), ("vtp1", vtp1), ("ulysses", ulysses)):
        path = tmp_path / f"{name}.json"
        path.write_text(galvatron_layerwise.write(p, plan))
        jobs.append([str(path), str(p.world_size), str(p.model.num_layers)])
        plans[str(path)] = plan
    for path, (ok, msg, e) in _effective(python, "galvatron_check.py", jobs, tmp_path).items():
        plan = plans[path]
        assert ok, f"{path}: {msg}"
        want = dict(pp=plan.pp, pp_division=list(plan.layers_per_stage), chunks=plan.num_microbatches,
                    real_chunks=plan.num_microbatches, tp_per_layer=list(plan.tp),
                    zero3_per_layer=[int(z) for z in plan.zero3], checkpoint_per_layer=[int(c) for c in plan.recompute],
                    default_dp_type="ddp" if plan.default_zero == 0 else "zero2", vocab_tp=plan.vocab_tp,
                    embed_sdp=int(plan.vocab_zero3), use_sp=sum(plan.ulysses), pipeline_type="pipedream_flush",
                    dp_per_layer=sorted({8 // (plan.pp * t) for t in plan.tp}),
                    # each layer runs gbs / (its dp x chunks) sequences, whatever the vocabulary tp: Galvatron's
                    # loader batch is the embedding's (world/pp/vtp ranks), re-split and gathered between modules
                    micro_batch_per_layer=[float(plan.candidate(p, t, plan.default_zero, False).mbs) for t in plan.tp])
        assert {k: e[k] for k in want} == want, path
