#!/usr/bin/env python3
"""Galvatron's own search and cost model on its shipped Llama profile, run in Galvatron's interpreter.

Usage (a Python where ``pip install hetu-galvatron==2.4.0`` and a CPU torch are installed):
  PY galvatron_driver.py search OUTDIR --settle_bsz 64 [any galvatron_search_args option]
      writes the profile files into OUTDIR, runs GalvatronSearchEngine.parallelism_optimization()
      and prints ``SEARCH_SECONDS <s>`` (CPU seconds of the process, all threads:
      ``time.process_time``), ``SEARCH_WALL_SECONDS <s>`` and ``PLAN <path of the JSON it wrote>``
  PY galvatron_driver.py cost OUTDIR PLAN.json[,PLAN2.json,...] [same options]
      Galvatron's cost model on each JSON plan (its own or autopar's): prints one line per plan,
      ``COST {"plan": path, "step_s": ..., "stage_memory_mb": [...], "fits": bool, ...}`` (seconds
      per step: Galvatron prints throughput = global_bsz / this), with per stage and micro-batch
      the layers' seconds in its makespan, the ZeRO-3 all-gathers among them and the embedding and
      head's (:func:`breakdown`)

The inputs are the ones Galvatron's own search tests build (hetu-galvatron 2.4.0,
``tests/utils/search_configs.py``: ``create_static_time_config``, ``create_static_memory_config``,
profiled on Llama-7B layers at sequence 4096, bf16) with the hardware profile the package ships for
one node of 8 GPUs (``galvatron/profile_hardware/hardware_configs/*_1nodes_8gpus_per_node.json``).
The model is Llama-7B from ``galvatron/models/llama_hf/meta_configs/llama-7b.json`` (hidden 4096,
32 layers) at sequence 4096. The profile JSONs the package ships in ``models/llama_hf/configs`` are
in the pre-2.4 layout (no per-sequence key) that 2.4.0's reader raises KeyError on, so the test
suite's profiles are used. The test data is copied here verbatim (Galvatron's ``tests`` package
imports its model zoo, which needs a GPU build).

The cost of a plan is what Galvatron's search ranks plans by (``dynamic_programming.py``
``_build_dp_and_run_multi_layer_type``, with ``use_pipeline_costmodel`` on, its default):
``pipeline_costmodel`` over the stages of the per-layer ``TimeCostModel`` at micro-batch
``bsz / chunks`` with ``OtherTimeCostModel`` for the embedding and head (the inter-layer
re-sharding term is used only inside the per-stage DP, not in this total);
memory is ``MemoryCostModel`` per layer summed per stage plus the 'other' memory of the plan's vtp,
against ``memory_constraint`` less Galvatron's 20% cache reserve.
"""
import argparse
import json
import os
import sys
import time
import types

import numpy as np

TIME = {"layertype_0_bsz8_seq4096": 11.219752883911134, "layertype_other_bsz8_seq4096": 27.296485137939456}
MEMORY = {
    "layertype_0": {"4096": {"parameter_size": 772.1259765625, "tp_activation_per_bsz_dict": {
        "1": 604.5634765625, "2": 382.31298828125, "4": 255.187744140625, "8": 191.6251220703125, "checkpoint": 32.0}}},
    "other_memory_pp_off": {"4096": {
        "model_states": {"1": 4130.3203125, "2": 2065.564453125, "4": 1033.0634765625, "8": 517.25048828125},
        "activation": {"1": 624.5078125, "2": 266.447509765625, "4": 149.4473876953125, "8": 107.530517578125}}},
    "other_memory_pp_on_first": {"4096": {
        "model_states": {"1": 2033.0009765625, "2": 1016.75048828125, "4": 520.6875},
        "activation": {"1": 259.7415771484375, "2": 114.40594482421875, "4": 89.09954833984375}}},
    "other_memory_pp_on_last": {"4096": {
        "model_states": {"1": 2033.0634765625, "2": 1016.81298828125, "4": 521.75},
        "activation": {"1": 464.6575927734375, "2": 248.91180419921875, "4": 156.47845458984375}}},
}
MODEL = "llama7b_seq4096"
LAYERS = [{"hidden_size": 4096, "seq_len": 4096, "layer_num": 32}]


def engine(outdir, argv):
    import galvatron
    root = os.path.dirname(galvatron.__file__)
    core = types.ModuleType("galvatron.core")  # its __init__ pulls the GPU runtime; the search needs none of it
    core.__path__ = [os.path.join(root, "core")]
    sys.modules["galvatron.core"] = core
    from galvatron.core.search_engine.arguments import galvatron_search_args
    from galvatron.core.search_engine.search_engine import GalvatronSearchEngine
    os.makedirs(outdir, exist_ok=True)
    for name, doc in ((f"computation_profiling_bf16_{MODEL}.json", TIME), (f"memory_profiling_bf16_{MODEL}.json", MEMORY)):
        with open(os.path.join(outdir, name), "w") as f:
            json.dump(doc, f)
    hw = os.path.join(root, "profile_hardware", "hardware_configs")
    parser = galvatron_search_args(argparse.ArgumentParser())
    args = parser.parse_args(["--num_nodes", "1", "--num_gpus_per_node", "8", "--mixed_precision", "bf16",
                              "--time_profiling_path", outdir, "--memory_profiling_path", outdir,
                              "--allreduce_bandwidth_config_path", hw, "--p2p_bandwidth_config_path", hw,
                              "--overlap_coe_path", hw, "--sp_time_path", hw, "--output_config_path", outdir,
                              "--log_dir", os.path.join(outdir, "logs")] + argv)
    args.hidden_size = LAYERS[0]["hidden_size"]  # what overwrite_model_args sets in search_dist.py
    eng = GalvatronSearchEngine(args)
    eng.set_search_engine_info(outdir, LAYERS, MODEL)
    eng.set_model_type("gpt")
    return eng, args


def search(outdir, argv):
    eng, args = engine(outdir, argv)
    t0, c0 = time.perf_counter(), time.process_time()
    eng.initialize_search_engine()
    eng.parallelism_optimization()
    seconds, wall = time.process_time() - c0, time.perf_counter() - t0
    plans = [f for f in os.listdir(outdir) if f.startswith("galvatron_config_")]
    print(f"SEARCH_SECONDS {seconds:.3f}")
    print(f"SEARCH_WALL_SECONDS {wall:.3f}")
    for f in plans:
        print(f"PLAN {os.path.join(outdir, f)}")


def cost(outdir, plan_paths, argv):
    """Galvatron's time and memory of each plan (comma-separated paths), as its DP computes them
    (see the module docstring)."""
    eng, args = engine(outdir, argv)  # stubs galvatron.core first
    eng.initialize_search_engine()
    for plan_path in plan_paths.split(","):
        cost_one(eng, args, plan_path)


def cost_one(eng, args, plan_path):
    """One ``COST`` line: Galvatron's step time and per-stage memory of the plan at ``plan_path``."""
    from galvatron.core.search_engine.cost_model import (
        MemoryCostModel,
        OtherTimeCostModel,
        TimeCostModel,
        pipeline_costmodel,
    )
    doc = json.load(open(plan_path))
    gpus = args.gpu_num
    pp = int(doc["pp_deg"])
    tps = [int(x) for x in str(doc["tp_sizes_enc"]).split(",")]
    fsdp = [int(x) for x in str(doc["dp_types_enc"]).split(",")]
    ckpt = [int(x) for x in str(doc["checkpoint"]).split(",")]
    consec = [int(x) for x in str(doc["tp_consecutive_flags"]).split(",")]
    use_sp = [int(x) for x in str(doc.get("use_sp", ",".join("0" * len(tps)))).split(",")]
    division = [int(x) for x in str(doc["pp_division"]).split(",")]
    bsz, chunks, vtp = int(doc["global_bsz"]), int(doc["chunks"]), int(doc["vtp"])
    embed_sdp = int(doc.get("embed_sdp", doc.get("vocab_sdp", 0)))
    strategies = []
    for t, f, c, k, u in zip(tps, fsdp, ckpt, consec, use_sp):
        info = {"fsdp": f}
        if t > 1 and u:  # Ulysses (Galvatron's strategy key 'sp'; needs --sp_space tp+sp to be costed as such)
            info["sp"] = 1
        if t > 1 and gpus // pp // t > 1:
            info["tp"] = k
        if c:
            info["cpt"] = 1
        strategies.append([pp, t, gpus // pp // t, info])
    min_tp = min(tps + [vtp])
    max_tp = max(tps + [vtp])
    mbsz = (bsz // (gpus // pp // min_tp) + chunks - 1) // chunks
    m = eng.model_args_list[0], eng.train_args_list[0], eng.parallel_args_list[0], eng.profile_model_args_list[0]
    hw = eng.profile_hardware_args_list[0]
    dp_size = gpus // pp
    chunk = eng.parallel_args_list[0].optimal_chunk_func(bsz * min_tp // dp_size, [pp, min_tp, dp_size], mbsz, min_tp)
    other = OtherTimeCostModel(mbsz, pp, gpus, int(doc.get("vsp", 0)), embed_sdp, min_tp, max_tp, eng.seqlen_list,
                               model_args=m[0], train_args=m[1], parallel_args=m[2], profile_model_args=m[3],
                               profile_hardware_args=hw).gen_result()
    step_s = pipeline_costmodel(TimeCostModel, eng.layernum_list, eng.model_args_list, eng.train_args_list,
                                 eng.parallel_args_list, eng.profile_model_args_list, eng.profile_hardware_args_list,
                                 strategies, division, [chunk], bsz, min_tp, other[1][vtp])
    stage_mb, start = [], 0
    max_mem = eng.memory_constraint * 0.8 if eng.memory_constraint // 1024 > 20 else eng.memory_constraint
    for i, n in enumerate(division):
        total = 0.0
        for s in strategies[start:start + n]:
            c = MemoryCostModel(s, bsz, mbsz=mbsz, min_tp=min_tp, max_tp=max_tp, stage_idx=i, vsp=int(doc.get("vsp", 0)),
                                embed_sdp=embed_sdp, model_args=m[0], train_args=m[1], parallel_args=m[2],
                                profile_model_args=m[3]).get_memory_cost()
            total += float(np.ceil(c["enc_total"]))
        total += float(np.ceil(c["other"][vtp][i]))
        stage_mb.append(total)
        start += n
    layers_s, gathers_s = breakdown(eng, strategies, division, bsz, min_tp, chunk)
    print("COST " + json.dumps({"plan": plan_path, "step_s": float(step_s), "stage_memory_mb": stage_mb,
                                "fits": bool(max(stage_mb) <= max_mem), "memory_budget_mb": max_mem,
                                "chunks_costed": int(chunk), "stage_layers_s": layers_s,
                                "stage_zero3_gathers_s": gathers_s, "stage_other_s": [float(x) for x in other[1][vtp]]}))


def breakdown(eng, strategies, division, bsz, min_tp, chunk):
    """Per stage, per micro-batch: the seconds of its layers that ``pipeline_costmodel`` puts in the
    makespan (``TimeCostModel(..., no_comm=True)``: compute, TP collectives and, for ZeRO-3 layers,
    one all-gather of the layer's weights), and of those the ZeRO-3 all-gathers alone (its
    ``gen_result``: ``fsdp_allgather_message_size * dc``, added without overlap: "TODO: add overlap
    when fsdp is used")."""
    from galvatron.core.search_engine.cost_model import TimeCostModel, get_real_chunk
    m = eng.model_args_list[0], eng.train_args_list[0], eng.parallel_args_list[0], eng.profile_model_args_list[0]
    hw = eng.profile_hardware_args_list[0]
    real = get_real_chunk(int(bsz / (strategies[0][1] * strategies[0][2] // min_tp)), chunk)
    layers, gathers, start = [], [], 0
    for n in division:
        total = gather = 0.0
        for s in strategies[start:start + n]:
            t = TimeCostModel(s, bsz / real, no_comm=True, model_args=m[0], train_args=m[1], parallel_args=m[2],
                              profile_model_args=m[3], profile_hardware_args=hw)
            total += float(t.gen_result())
            if t.fsdp:
                gather += float(t.fsdp_allgather_message_size * t.dc * 0.001 * t.args.costmodel_coe / t.layer_num)
        layers.append(total)
        gathers.append(gather)
        start += n
    return layers, gathers


if __name__ == "__main__":
    mode, outdir, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "search":
        search(outdir, rest)
    else:
        cost(outdir, rest[0], rest[1:])
