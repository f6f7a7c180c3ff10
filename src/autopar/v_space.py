"""torchtitan's V schedules added to an enumerated space (``search --target torchtitan``).

torchtitan 0.2.2 runs PyTorch's ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``
(``pipeline_parallel_schedule = "ZBVZeroBubble"`` / ``"DualPipeV"``) on exactly two stages per
rank in the V placement (:mod:`autopar.pipeline.placement`). :func:`add_v_variants` copies every
vpp-2 pipelined row once per V schedule (``LayoutBatch.v_schedule``) where torchtitan can run it:
no async TP (it compiles the model and PyTorch's V schedules refuse compiled stage modules,
``_check_torch_compile_compatibility``), and for DualPipeV at least ``2 pp`` micro-batches
(``ScheduleDualPipeV``). The rules (:mod:`autopar.rules`) drop the copies whose layers do not split
into ``2 pp`` equal chunks. Each copy differs from its interleaved row only in its schedule, so
the ranking shows a V schedule where its bubble or memory beats interleaved 1F1B.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.strategy import V_SCHEDULE_NAMES


def add_v_variants(batch: LayoutBatch) -> LayoutBatch:
    """``batch`` followed by its ZB-V and DualPipeV copies (module docstring)."""
    base = (batch.vpp == 2) & (batch.pp > 1) & ~batch.tp_comm_overlap & (batch.v_schedule == 0)
    out = [batch]
    for code, name in enumerate(V_SCHEDULE_NAMES, start=1):
        rows = base & ((batch.num_microbatches >= 2 * batch.pp) if name == "dualpipev" else True)
        copy = batch.take(np.flatnonzero(rows))
        out.append(LayoutBatch(**{f.name: getattr(copy, f.name) for f in fields(LayoutBatch) if f.name != "v_schedule"},
                               v_schedule=np.full(len(copy), code, dtype=np.int64)))
    return LayoutBatch.concat(out)
