"""Galvatron's own layout choices added to an enumerated space (``search --target galvatron``).

Galvatron's search (``hetu-galvatron`` 2.4.0, ``core/search_engine/search_engine.py``) also
chooses the vocabulary layers' tensor parallelism (``vtp``, or sequence-split ``vsp``; its
``disable_vtp`` switches it off), the pipeline schedule (``pipeline_type``: ``gpipe`` or
``pipedream_flush``, i.e. 1F1B) and, per layer, whether a TP group takes consecutive ranks
(``tp_consecutive_flags``). :func:`add_variants` copies each row Galvatron can run (cp 1, vpp 1, no
ZeRO-1, no selective recompute, no TP overlap: what :mod:`autopar.export.galvatron` writes) once
per choice:

* ``vocab_tp``: every power of two dividing the stage's ``tp*dp`` ranks up to the fast domain
  (vocabulary TP across nodes is never worth it), other than tp; ``vocab_sp`` once, over the
  largest of them (its group size changes no cost in :mod:`autopar.cost.vocab`);
* GPipe where pp > 1 (same bubble as 1F1B, every micro-batch in flight: it only ever costs memory,
  so the ranking shows it where 1F1B is the same layout);
* non-consecutive TP where tp > 1, dp > 1 and ``tp * dp`` exceeds the fast domain (elsewhere both
  groups stay inside a node and the copy would cost the same: :mod:`autopar.cost.placement`).

Each choice varies alone (the others at their defaults), so the space grows by their sum, not
their product.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.strategy import RECOMPUTE_CODES


def _runs_on_galvatron(batch: LayoutBatch) -> np.ndarray:
    """Rows Galvatron 2.4.0 can run (bool ``(n,)``; :mod:`autopar.export.galvatron`'s refusals)."""
    return ((batch.cp == 1) & (batch.vpp == 1) & (batch.zero != 1) & (batch.recompute != RECOMPUTE_CODES["selective"])
            & ~batch.tp_comm_overlap & (batch.ep == 1))


def _copy(batch: LayoutBatch, rows: np.ndarray, **columns: np.ndarray) -> LayoutBatch:
    """``batch``'s ``rows`` with ``columns`` replaced (arrays of ``len(rows)``)."""
    out = batch.take(rows)
    return LayoutBatch(**{f.name: columns.get(f.name, getattr(out, f.name)) for f in fields(LayoutBatch)})


def add_variants(p: Problem, batch: LayoutBatch) -> LayoutBatch:
    """``batch`` followed by its Galvatron variants (module docstring)."""
    base = np.flatnonzero(_runs_on_galvatron(batch))
    stage = batch.tp[base] * batch.dp[base]
    domain = p.cluster.fast_domain_size
    out = [batch]
    v = 1
    while v <= min(int(stage.max(initial=1)), domain):
        rows = base[(stage % v == 0) & (batch.tp[base] != v)]
        out.append(_copy(batch, rows, vocab_tp=np.full(len(rows), v, dtype=np.int64)))
        v *= 2
    # vsp: the sequence split over the largest such group (autopar.cost.vocab: its size changes no cost)
    sp_size = np.gcd(stage, 1 << int(np.log2(max(domain, 1))))
    rows = np.flatnonzero(sp_size > 1)
    out.append(_copy(batch, base[rows], vocab_tp=sp_size[rows], vocab_sp=np.ones(len(rows), dtype=bool)))
    rows = base[batch.pp[base] > 1]
    out.append(_copy(batch, rows, gpipe=np.ones(len(rows), dtype=bool)))
    rows = base[(batch.tp[base] > 1) & (batch.dp[base] > 1) & (stage > domain)]
    out.append(_copy(batch, rows, tp_consecutive=np.zeros(len(rows), dtype=bool)))
    return LayoutBatch.concat(out)
