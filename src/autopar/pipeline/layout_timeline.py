"""The simulated pipeline step of one layout, op by op, for pictures (``search --report``).

``estimate`` costs a pipeline with closed forms or :func:`autopar.pipeline.makespan.static_makespans_s`,
which keep no timeline. :func:`layout_simulation` runs the event simulation
(:func:`autopar.pipeline.steady.simulate_bounded`) on the same per-chunk times
(:func:`autopar.pipeline.layers.chunk_op_times_s`: each stage's compute and tensor/context/expert
parallel communication per micro-batch, the embedding and output layer on the chunks that hold
them) and the same p2p time (:func:`autopar.cost.stage_time.p2p_time_s`), so its makespan is the
pipeline part of the estimate's step (without the data-parallel gradient reduction and the
optimizer step, which run after it).
"""

from __future__ import annotations

import numpy as np

from autopar.cost.stage import all_stages
from autopar.cost.stage_time import p2p_time_s
from autopar.pipeline.layers import chunk_op_times_s
from autopar.pipeline.simulate import PipelineTimes, SimulationResult
from autopar.pipeline.steady import simulate_bounded
from autopar.problem import Problem
from autopar.strategy import V_SCHEDULE_NAMES, Strategy


def layout_simulation(p: Problem, s: Strategy) -> tuple[SimulationResult, float]:
    """The simulated pipeline step of layout ``s`` (``pp > 1``) and its p2p seconds per transfer.

    The schedule is the layout's V schedule (ZB-V, DualPipeV) where it has one, else the one
    Megatron-LM runs for it: interleaved 1F1B when ``vpp > 1``, else 1F1B.

    Raises:
        AutoparError: what :func:`autopar.pipeline.steady.simulate_bounded` raises (sizes the
            schedule cannot run).
    """
    batch, stages = all_stages(p, s)
    forward_s, backward_s, recompute_s = chunk_op_times_s(p, s, batch, stages)
    p2p_s = float(p2p_time_s(p, batch.take(np.zeros(1, dtype=np.int64)))[0])
    times = PipelineTimes(forward_s, backward_s, recompute_s, p2p_s)
    schedule = s.schedule if s.schedule in V_SCHEDULE_NAMES else "interleaved" if s.vpp > 1 else "1f1b"
    return simulate_bounded(times, s.num_microbatches(p.train.global_batch_size), schedule), p2p_s
