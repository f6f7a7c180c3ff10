"""One-GPU calibration run (H100/H200, under 8 minutes): profile, then measure real steps.

1. ``autopar profile ops`` for the shards of llama3-8b (tp 1, 2, 8) and llama3-70b (tp 8);
2. ``autopar profile layer`` for the same shards (none/selective/full recompute);
3. training steps (forward, backward, AdamW) of a small real Llama-style model at a few
   (mbs, seq, recompute) points, timing the step and reading ``torch.cuda.max_memory_allocated``,
   next to autopar's analytic step time and peak (minus its fixed framework overhead, which
   ``max_memory_allocated`` does not see).

Writes ``data/profiles/<device>.db`` and ``benchmarks/gpu_profile_results.md``. ``--tiny``
runs the same steps with toy shapes on CPU (the test suite does), writing under ``--out``.

    python benchmarks/gpu_profile.py                 # on the GPU machine
    python benchmarks/gpu_profile.py --tiny --out /tmp/p
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
              "hidden_act": "silu", "max_position_embeddings": 8192, "tie_word_embeddings": False}
SMALL_MODEL = {**TINY_MODEL, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8,
               "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000}


def autopar(*args: str) -> None:
    """Run ``autopar`` in a subprocess (one CUDA context per step, like a user would)."""
    subprocess.run([sys.executable, "-m", "autopar.profile", *args], check=True)


def train_step_point(raw: dict, mbs: int, seq: int, recompute: str, steps: int) -> tuple[float, float | None]:
    """(median step seconds, CUDA peak bytes or None) of real training steps of ``raw``."""
    import statistics

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from autopar.profile import kernels

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    config = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.bfloat16)
    kernels.install(model)  # Megatron-equivalent norm and SwiGLU (what autopar models)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, raw["vocab_size"], (mbs, seq), device=device)
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(steps + 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    peak = float(torch.cuda.max_memory_allocated()) if cuda else None
    del model, opt
    return statistics.median(times), peak


def analytic_point(raw: dict, device: str, mbs: int, seq: int, recompute: str) -> tuple[float, float]:
    """(step seconds, peak bytes without the framework overhead) that autopar predicts."""
    from autopar.estimate import estimate
    from autopar.problem import Problem
    from autopar.specs import TrainSpec, load_device, make_cluster, model_from_hf_dict
    from autopar.strategy import Strategy

    p = Problem(model_from_hf_dict(raw, name="small-llama"), make_cluster(load_device(device), 1, 1),
                TrainSpec(global_batch_size=mbs, seq_len=seq, make_vocab_size_divisible_by=1))
    e = estimate(p, Strategy(dp=1, mbs=mbs, zero=0, recompute=recompute))
    return e.step_time_s, e.peak_memory_bytes - p.cluster.device.framework_overhead_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy shapes on CPU (for the test suite)")
    parser.add_argument("--out", default=None, help="output folder (default: data/profiles and benchmarks)")
    parser.add_argument("--device", default="h200", help="autopar device preset for the analytic column")
    args = parser.parse_args()
    from autopar.profile.ops import local_device

    name = local_device()[1].replace(" ", "_").replace(":", "_")
    out = Path(args.out) if args.out else None
    db = (out or ROOT / "data" / "profiles") / f"{name}.db"
    table = (out or ROOT / "benchmarks") / "gpu_profile_results.md"
    db.parent.mkdir(parents=True, exist_ok=True)
    table.parent.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        tiny = db.parent / "tiny.json"
        tiny.write_text(json.dumps(TINY_MODEL))
        shards, seq = [(str(tiny), 2)], 64
        points, raw, steps = [(1, 64, "none"), (2, 64, "full")], TINY_MODEL, 1
    else:
        shards, seq = [("llama3-8b", 1), ("llama3-8b", 2), ("llama3-8b", 8), ("llama3-70b", 8)], 4096
        points = [(1, 2048, "none"), (2, 2048, "none"), (1, 4096, "none"), (2, 4096, "full"), (4, 4096, "full")]
        raw, steps = SMALL_MODEL, 5
    repeats = "1" if args.tiny else "5"
    for model, tp in shards:
        autopar("ops", "--db", str(db), "--model", model, "--device", args.device, "--devices-per-node", "8",
                "--gbs", "64", "--seq-len", str(seq), "--tp", str(tp), "--sp", "--repeats", repeats)
        autopar("layer", "--db", str(db), "--model", model, "--tp", str(tp), "--seq-len", str(seq),
                "--hf", "--repeats", "1" if args.tiny else "3")
    rows = ["| mbs | seq | recompute | step s (measured) | step s (autopar) | peak GiB (measured) | "
            "peak GiB (autopar, no overhead) |", "|---|---|---|---|---|---|---|"]
    for mbs, s, recompute in points:
        step, peak = train_step_point(raw, mbs, s, recompute, steps)
        a_step, a_peak = analytic_point(raw, args.device, mbs, s, recompute)
        measured_peak = f"{peak / 2**30:.2f}" if peak is not None else "n/a (CPU)"
        rows.append(f"| {mbs} | {s} | {recompute} | {step:.4f} | {a_step:.4f} | {measured_peak} | {a_peak / 2**30:.2f} |")
    header = f"# Measured vs analytic on {local_device()[1]} (autopar device preset {args.device})\n\n"
    table.write_text(header + "\n".join(rows) + "\n")
    print(table.read_text())


if __name__ == "__main__":
    main()
