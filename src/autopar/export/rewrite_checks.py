"""What ``autopar search --script X.sh --write-script OUT.sh`` checks before rewriting a script:
the predicted gain over the script's own layout (:func:`script_gain`, refused below
:func:`default_min_gain_pct`) and the checkpoint the script loads (:func:`checkpoint_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.specs.script import ScriptPlan
from autopar.strategy import Strategy

GIB = 2**30

#: Default ``--min-gain-pct``: autopar's own step-time error on rows like the problem, so a rewrite
#: is only proposed when its predicted gain is larger than the model's typical error there. The
#: numbers are the "step time / throughput" MAPE % of the target sets of ``autopar validate`` on the
#: shipped ``autopar/data/validation/measurements.csv`` (the
#: :data:`autopar.validate.report.TARGET_SETS` table the README quotes; the MoE one is mostly the
#: Megatron-Bridge 25.x rows). This dict is the one place the numbers live: ``search --help``
#: builds its ``--min-gain-pct`` text from it, and ``tests/export/test_write_script_checks.py``
#: recomputes them from the CSV.
MIN_GAIN_PCT = {"bf16/fp16 dense": 4.3, "MoE (any precision)": 16.3, "fp8 dense": 5.7}

#: Megatron-LM's ``--ckpt-format`` default (``megatron/training/arguments.py``, ``torch_dist`` since core 0.8).
MEGATRON_DEFAULT_CKPT_FORMAT = "torch_dist"


def target_set(p: Problem) -> str:
    """The :data:`MIN_GAIN_PCT` key of ``p``: MoE (any precision), else fp8 or bf16/fp16 dense,
    as :func:`autopar.validate.report.in_moe_target` / ``in_fp8_target`` / ``in_target`` group rows."""
    if p.model.is_moe:
        return "MoE (any precision)"
    return "fp8 dense" if p.train.precision == "fp8" else "bf16/fp16 dense"


def default_min_gain_pct(p: Problem) -> float:
    """The smallest predicted gain (%) worth a rewrite by default: :data:`MIN_GAIN_PCT` of ``p``'s set."""
    return MIN_GAIN_PCT[target_set(p)]


@dataclass(frozen=True)
class Baseline:
    """The script's own layout on the problem: its step time (s), or why it cannot run
    (``reason``: a rule it breaks, or its predicted peak above the device memory)."""

    strategy: Strategy | None
    step_time_s: float | None
    reason: str = ""


def script_baseline(plan: ScriptPlan, p: Problem) -> Baseline:
    """Estimate the script's own layout on ``p`` (the searched cluster, batch and sequence)."""
    from autopar.estimate import estimate
    from autopar.rules import check_strategy

    try:
        s = plan.strategy(p.world_size, p.model.num_layers)
        check_strategy(p, s)
        e = estimate(p, s)
    except AutoparError as err:
        return Baseline(None, None, f"the script's own layout cannot run here ({err})")
    if not e.fits:
        return Baseline(s, None, f"the script's own layout does not fit ({e.peak_memory_bytes / GIB:.1f} GiB > "
                                 f"{p.cluster.device.memory_bytes / GIB:.1f} GiB)")
    return Baseline(s, e.step_time_s)


def gain_pct(baseline: Baseline, step_time_s: float) -> float | None:
    """Predicted gain (%) of a layout taking ``step_time_s`` over the script's layout:
    ``100 (t_script - t_new) / t_script``; None when the script's layout cannot run."""
    if baseline.step_time_s is None:
        return None
    return 100.0 * (baseline.step_time_s - step_time_s) / baseline.step_time_s


def checkpoint_warning(plan: ScriptPlan, new_layout: dict[str, int], new_format: str) -> str | None:
    """One line when the script's ``--load`` checkpoint was saved under another tp/pp/ep or
    ``--ckpt-format`` than the rewritten script runs, with how to convert it; else None.

    The script's own layout and format are taken as what saved the checkpoint. Conversions:
    ``--ckpt-format torch`` (legacy, per-rank files) needs Megatron-LM's
    ``tools/checkpoint/convert.py`` (``--target-tensor-parallel-size``,
    ``--target-pipeline-parallel-size``); ``torch_dist`` -> ``fsdp_dtensor`` (Megatron-FSDP)
    Megatron-LM's ``checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor`` (Megatron-FSDP
    user guide, "Checkpoint Conversion from 3D-Parallel to Megatron-FSDP"); ``torch_dist`` to
    ``torch_dist`` reshards the weights on load (Megatron-Core ``dist_checkpointing``).

    Args:
        plan: the script read (its ``--load``, ``--ckpt-format`` and layout).
        new_layout: ``{"tp": .., "pp": .., "ep": ..}`` of the rewritten script.
        new_format: the rewritten script's ``--ckpt-format``.
    """
    load = plan.args.text("--load")
    if not load:
        return None
    old_format = plan.args.text("--ckpt-format") or MEGATRON_DEFAULT_CKPT_FORMAT
    old = {k: int(plan.layout.get(k) or 1) for k in new_layout}
    changed = [f"{k} {old[k]} -> {new_layout[k]}" for k in new_layout if old[k] != new_layout[k]]
    if old_format != new_format:
        changed.append(f"--ckpt-format {old_format} -> {new_format}")
    if not changed:
        return None
    if old_format == "torch":
        how = ("convert it first with Megatron-LM's tools/checkpoint/convert.py (--target-tensor-parallel-size / "
               "--target-pipeline-parallel-size)")
    elif new_format == "fsdp_dtensor" and old_format != "fsdp_dtensor":
        how = ("convert it first with Megatron-LM's checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor "
               "(Megatron-FSDP user guide)")
    elif old_format != new_format:
        how = f"convert it to {new_format} first (Megatron-LM tools/checkpoint)"
    else:
        how = ("dist-checkpointing reshards its weights on load; if its optimizer state does not reshard, load with "
               "--no-load-optim or convert it (Megatron-LM tools/checkpoint)")
    return (f"--load {load} holds a checkpoint saved by the script's layout ({', '.join(changed)} in the rewritten "
            f"script): {how}")
