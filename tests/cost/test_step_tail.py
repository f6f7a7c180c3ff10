"""After the pipeline flush each stage reduces its gradients and steps its optimizer: the step ends
with the stage whose two together take longest, not with the largest of each taken from two
different stages (new-user report: layer-wise and uniform costs of one layout differed by this)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost.stage_time import StageTime
from autopar.cost.step import combine
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy


def test_step_tail_is_one_stages_dp_plus_optimizer():
    """Two equal stages of 0.3 s per micro-batch, 4 micro-batches (gbs 8, dp 2): 1F1B makespan
    2 x 0.3 + 3 x 0.3 = 1.5 s. Stage 0 leaves 2.0 s of data-parallel traffic exposed and steps
    its optimizer in 1.0 s (3.0 s), stage 1 hides its traffic and steps in 1.5 s (1.5 s): the tail
    is stage 0's 3.0 s (the largest of each, 2.0 + 1.5 = 3.5 s, was taken)."""
    p = make_problem("llama3-8b", per_node=4, gbs=8)
    batch = LayoutBatch.from_strategy(Strategy(dp=2, pp=2, mbs=1), 8)
    one = lambda x: np.array([x])  # noqa: E731
    t = StageTime(one(0.1), one(0.2), one(0.0), one(0.0), one(0.0), one(0.0))
    costs = combine(p, batch, [one(1.0), one(1.0)], [t, t], dp=[one(2.0), one(0.0)], opt=[one(1.0), one(1.5)],
                    peak=one(1.0), memories=[])
    b = {k: float(v[0]) for k, v in costs.time_breakdown_s.items()}
    assert (b["dp_comm"], b["optimizer"]) == (2.0, 1.0)
    assert b["pp_bubble"] == pytest.approx(0.3)  # makespan 1.5 s less 4 x 0.3 s
    assert float(costs.step_time_s[0]) == pytest.approx(1.5 + b["pp_comm"] + 3.0)
