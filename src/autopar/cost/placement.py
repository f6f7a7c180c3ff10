"""Where the ranks of a TP and a DP group sit: consecutive TP (Megatron's order) or strided (Galvatron).

Megatron-LM orders ranks ``tp-cp-dp-pp`` with tp innermost: a TP group is ``tp`` consecutive
ranks (stride 1) and a DP group steps over them (stride ``tp * cp``), so TP stays on NVLink while
``tp`` fits in a node. Galvatron's ``tp_consecutive_flags`` 0 (``core/runtime/comm_groups.py``
``gen_tp_group_dist`` / ``gen_dp_group_dist`` with ``consecutive=False``; its cost model swaps the
``%d_1`` / ``%d_0`` communication coefficients of the two groups, ``core/search_engine/cost_model.py``)
turns this around inside a pipeline stage: the DP group is ``dp`` consecutive ranks and a TP group
steps over them (stride ``dp``). Where ``tp * dp`` spans several nodes this moves the TP
collectives onto the network and the DP ones onto NVLink; elsewhere both groups stay inside a node
and nothing changes. Only defined for ``cp = 1`` (rule ``tp_consecutive_needs_cp1``).
"""

from __future__ import annotations

import numpy as np

from autopar.layout_batch import LayoutBatch


def tp_stride(batch: LayoutBatch) -> np.ndarray:
    """Rank distance between consecutive members of a TP group, ``(n,)``: 1, or ``dp`` where
    ``tp_consecutive`` is False. Example: tp 8, dp 2, not consecutive -> 2."""
    return np.where(batch.tp_consecutive, 1, batch.dp * batch.cp)


def dp_stride(batch: LayoutBatch) -> np.ndarray:
    """Rank distance between consecutive members of a DP (x CP) group, ``(n,)``: ``tp``, or 1
    where ``tp_consecutive`` is False. Example: tp 8, dp 2, consecutive -> 8."""
    return np.where(batch.tp_consecutive, batch.tp, 1)
