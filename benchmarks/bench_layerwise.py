"""autopar's layer-wise search against Galvatron's own, on Galvatron's Llama inputs.

Run: ``python benchmarks/bench_layerwise.py [--galvatron-python PY] [--out DIR]``, where ``PY`` is
an interpreter with hetu-galvatron 2.4.0 and a CPU torch, e.g. the ``realclients-galvatron`` venv
that ``.ci/realclient_venvs.sh`` builds (default: ``$AUTOPAR_GALVATRON_PYTHON``; without one only
autopar's side runs). ``benchmarks/galvatron_driver.py`` runs in it.

The problem is the one Galvatron's own search tests build (``galvatron_driver.py``): Llama-7B
(Galvatron's ``llama_hf/meta_configs/llama-7b.json``; autopar's ``llama2-7b`` preset is the same
model: hidden 4096, 32 layers, FFN 11008, vocabulary 32000) at sequence 4096, global batch 64,
one node of 8 GPUs with 40 GB (Galvatron ``--memory_constraint 40``; autopar's ``a100-40gb``,
the GPU of the shipped hardware profile's ~154 GB/s all-reduce), bf16, tp at most 4 (the test
profile's pipelined 'other' memory has no tp 8, where Galvatron 2.4.0 raises KeyError), 1F1B
(``pipedream_flush``), Megatron sequence parallelism off (Galvatron's default).

What it prints: the search time of each (Galvatron's search once, as it takes a minute; autopar's
the best of 5 after one warm-up), each plan, and both plans costed under both cost models:
autopar's (:func:`autopar.layerwise.evaluate_plan`; autopar searches within 90% of the device's memory, its
``search`` default ``--memory-margin 0.10``) and Galvatron's
(``pipeline_costmodel`` and ``MemoryCostModel``, against its 40 GB less its 20% cache reserve).
``--out DIR`` also writes both plans as Galvatron JSON and the numbers as ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from autopar.export import galvatron_layerwise
from autopar.layerwise import LayerwisePlan, evaluate_plan, search_layerwise
from autopar.problem import Problem
from autopar.specs import TrainSpec, load_device, load_model, make_cluster

HERE = Path(__file__).resolve().parent
GBS, SEQ, MAX_TP = 64, 4096, 4
MARGIN = 0.10  # autopar search's default --memory-margin: plans within 90% of the device memory
GALVATRON_ARGS = ["--memory_constraint", "40", "--settle_bsz", str(GBS), "--max_tp_deg", str(MAX_TP),
                  "--pipeline_type", "pipedream_flush", "--default_dp_type", "zero2"]


def problem() -> Problem:
    """Llama-7B on one node of 8 x A100-40GB, gbs 64, sequence 4096, bf16."""
    return Problem(load_model("llama2-7b"), make_cluster(load_device("a100-40gb"), 1, 8),
                   TrainSpec(global_batch_size=GBS, seq_len=SEQ))


def galvatron(python: str, mode: str, workdir: Path, *extra: str) -> str:
    """Run ``galvatron_driver.py mode workdir extra... GALVATRON_ARGS``; its stdout."""
    res = subprocess.run([python, str(HERE / "galvatron_driver.py"), mode, str(workdir), *extra, *GALVATRON_ARGS],
                         capture_output=True, text=True, timeout=3600)
    if res.returncode:
        raise SystemExit(f"galvatron_driver.py {mode} failed:\n{res.stderr[-3000:]}")
    return res.stdout


def describe(plan: LayerwisePlan) -> str:
    """One line: pp, micro-batches, per-layer tp / ZeRO-3 / checkpoint counts, vocabulary."""
    tps = ",".join(f"tp{t}x{plan.tp.count(t)}" for t in sorted(set(plan.tp)))
    return (f"pp{plan.pp} chunks {plan.num_microbatches} {tps} zero3 {sum(plan.zero3)}/{plan.num_layers} "
            f"ckpt {sum(plan.recompute)}/{plan.num_layers} default {'ddp' if plan.default_zero == 0 else 'zero2'} "
            f"vtp {plan.vocab_tp}{' sdp' if plan.vocab_zero3 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--galvatron-python", default=os.environ.get("AUTOPAR_GALVATRON_PYTHON"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    p = problem()
    limit = (1 - MARGIN) * p.cluster.device.memory_bytes
    search_layerwise(p, max_tp=MAX_TP, memory_limit_bytes=limit)  # warm-up (imports, numpy first calls)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        ours = search_layerwise(p, max_tp=MAX_TP, memory_limit_bytes=limit)
        times.append(time.perf_counter() - start)
    out = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / "bench_layerwise"
    out.mkdir(parents=True, exist_ok=True)
    plans = {"autopar": ours.plan}
    sources = {}  # plan name -> the JSON Galvatron's cost model reads (Galvatron's own file for its plan)
    result = {"autopar_search_s": min(times), "autopar_cells": ours.cells, "autopar_cells_solved": ours.cells_solved}
    print(f"autopar layer-wise search: best of 5 {min(times):.3f} s ({ours.cells} cells, {ours.cells_solved} solved "
          f"by DP, {ours.plans_costed} plans costed)")
    if args.galvatron_python:
        stdout = galvatron(args.galvatron_python, "search", out / "galvatron")
        seconds = float(next(x for x in stdout.splitlines() if x.startswith("SEARCH_SECONDS")).split()[1])
        path = next(x for x in stdout.splitlines() if x.startswith("PLAN ")).split(" ", 1)[1]
        plans["galvatron"] = galvatron_layerwise.read(json.loads(Path(path).read_text()), path)
        sources["galvatron"] = Path(path)  # keeps its tp_consecutive_flags, which autopar's reader drops
        result["galvatron_search_s"] = seconds
        print(f"Galvatron 2.4.0 search (settle_bsz {GBS}, CPU): {seconds:.1f} s; autopar is "
              f"{seconds / min(times):.0f}x faster")
    for name, plan in plans.items():
        path = out / f"{name}_plan.json"
        path.write_text(galvatron_layerwise.write(p, plan))
        path = sources.get(name, path)
        ours_cost = evaluate_plan(p, plan)
        row = {"plan": describe(plan), "autopar_step_s": ours_cost.step_time_s,
               "autopar_peak_gib": ours_cost.peak_memory_bytes / 2 ** 30, "autopar_fits": ours_cost.fits}
        if args.galvatron_python:
            line = next(x for x in galvatron(args.galvatron_python, "cost", out / "cost", str(path)).splitlines()
                        if x.startswith("COST "))
            theirs = json.loads(line[5:])
            row.update(galvatron_step_s=theirs["step_s"], galvatron_peak_mb=max(theirs["stage_memory_mb"]),
                       galvatron_fits=theirs["fits"])
        result[name] = row
        print(f"{name:9s} {row['plan']}")
        print(f"          autopar model {row['autopar_step_s']:.3f} s/step, peak {row['autopar_peak_gib']:.1f} GiB "
              f"{'fits' if row['autopar_fits'] else 'OUT OF MEMORY'}" +
              (f"; Galvatron model {row['galvatron_step_s']:.3f} s/step, peak {row['galvatron_peak_mb']:.0f} MB of "
               f"{theirs['memory_budget_mb']:.0f} {'fits' if row['galvatron_fits'] else 'OUT OF MEMORY'}"
               if args.galvatron_python else ""))
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"plans and results.json in {out}")


if __name__ == "__main__":
    main()
