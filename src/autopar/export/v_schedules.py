"""Refuse torchtitan's V schedules (ZB-V, DualPipeV) in the writers of the other frameworks.

``Strategy.schedule`` ``zbv`` / ``dualpipev`` (:mod:`autopar.pipeline.schedules_v`) is written by
the torchtitan export (``pipeline_parallel_schedule = "ZBVZeroBubble"`` / ``"DualPipeV"``). Each
other writer refuses it with its framework's reason (:data:`REASONS`), checked against the
framework's source where it is on this machine:

* Megatron-LM main (``megatron/core/pipeline_parallel/schedules.py`` ``get_forward_backward_func``):
  no pipelining, 1F1B, interleaved 1F1B; ``combined_1f1b.py`` overlaps one micro-batch's MoE
  all-to-all with another's compute inside 1F1B (DualPipe's idea, not its V placement or order).
  Megatron-Bridge runs Megatron-Core's schedules.
* MindSpeed-LLM: ``--schedules-method dualpipev`` exists
  (``mindspeed/features_manager/pipeline_parallel/dualpipev_feature.py``: pp > 1, no cp, no
  virtual pipeline flag, untied embeddings, ``m >= 2 pp - 1``), ZB-V does not; autopar's
  MindSpeed writer does not write it yet.
* DeepSpeed (Megatron-DeepSpeed): ``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule`` is 1F1B
  with one stage per rank.
* Galvatron 2.4.0: ``pipeline_type`` gpipe or pipedream_flush (1F1B).
* SAPP (MindSpore): MindSpore's pipeline scheduler lists ``zero_bubble_v``
  (``AutoParallel.pipeline(scheduler=...)``, gpipe / 1f1b / seqpipe / seqvpp / seqsmartvpp /
  zero_bubble_v), no DualPipeV; autopar's SAPP writer writes the 1F1B / interleaved config only.
"""

from __future__ import annotations

from typing import Callable

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.strategy import V_SCHEDULE_NAMES, Strategy

REASONS: dict[str, str] = {
    "megatron": "Megatron-LM main runs no-pipelining, 1F1B and interleaved 1F1B only "
                "(megatron/core/pipeline_parallel/schedules.py get_forward_backward_func)",
    "megatron-bridge": "Megatron-Bridge runs Megatron-Core's schedules: 1F1B and interleaved 1F1B only",
    "mindspeed": "MindSpeed-LLM has no ZB-V, and its --schedules-method dualpipev is not written by autopar's "
                 "MindSpeed export",
    "deepspeed": "DeepSpeed's pipeline engine runs its 1F1B TrainSchedule with one stage per rank "
                 "(deepspeed/runtime/pipe/schedule.py)",
    "galvatron": "Galvatron 2.4.0's pipeline_type is gpipe or pipedream_flush (1F1B)",
    "sapp": "MindSpore has no DualPipeV, and its zero_bubble_v scheduler is not written by autopar's SAPP export",
}


def refusing_v_schedules(fmt: str, write: Callable[[Problem, Strategy], str]) -> Callable[[Problem, Strategy], str]:
    """``write`` that first refuses a layout run with a V schedule (module docstring).

    Raises:
        AutoparError: ``s.schedule`` is ``zbv`` or ``dualpipev`` (one line with ``fmt``'s reason
            and ``--format torchtitan``).
    """
    def checked(p: Problem, s: Strategy) -> str:
        if s.schedule in V_SCHEDULE_NAMES:
            raise AutoparError(f"export --format {fmt} cannot express schedule={s.schedule}: {REASONS[fmt]}; write it "
                               f"with --format torchtitan, or search with --target {fmt} for one it runs")
        return write(p, s)
    return checked
