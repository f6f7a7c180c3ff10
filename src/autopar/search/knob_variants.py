"""``search --search-knobs``: CUDA graphs and activation CPU offloading searched as choices of the
whole plan. They are ``TrainSpec`` settings (every layout of one search shares them), so the search
runs once per setting the target can run and keeps the setting whose best layout is fastest; a
setting is chosen only when it is strictly faster than the plan without it (CUDA graphs never slow
a layer in the cost model, so they are chosen only where the host launch time sets the pace, and
their static buffers can make the fast layouts not fit; offloading only where it lets a pp 1 layout
without recompute fit or beat one that recomputes).

Settings tried (each knob the command line and the script leave at its default; knobs given stay fixed):

* ``--cuda-graph-impl transformer_engine`` (whole decoder layers, Megatron-Bridge's usual CUDA-graph
  form; :mod:`autopar.cost.cuda_graph`);
* ``--activation-offload-layers N`` for N = L // 2 and L - 1 of the model's L layers, on devices
  with a host link bandwidth (:mod:`autopar.cost.activation_offload`).

Targets: Megatron-LM and Megatron-Bridge, which run both (the other formats refuse them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autopar.errors import AutoparError
from autopar.problem import Problem

KNOB_TARGETS = ("megatron", "megatron-bridge")


@dataclass
class KnobChoice:
    """One setting tried: its command-line ``label`` (empty for the plan as given), the problem with
    it, and the search's #1 step time (None: nothing fits or no layout passes the rules)."""

    label: str
    problem: Problem
    best_step_s: float | None = None


def variants(p: Problem, target: str) -> list[KnobChoice]:
    """The settings to try for ``p`` (module docstring), the plan as given first.

    Raises:
        AutoparError: a ``target`` that runs neither knob.
    """
    if target not in KNOB_TARGETS:
        raise AutoparError(f"--search-knobs with --target {target}: CUDA graphs and activation offloading are "
                           f"Megatron-LM's and Megatron-Bridge's; use --target {' or '.join(KNOB_TARGETS)}")
    out = [KnobChoice("", p)]
    t, layers = p.train, p.model.num_layers
    if t.cuda_graph_impl == "none":
        train = t.model_copy(update={"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ()})
        out.append(KnobChoice("--cuda-graph-impl transformer_engine", Problem(p.model, p.cluster, train)))
    if t.activation_offload_layers == 0 and p.cluster.device.host_bandwidth_bytes_per_s and layers > 1:
        for n in sorted({max(layers // 2, 1), layers - 1}):
            train = t.model_copy(update={"activation_offload_layers": n})
            out.append(KnobChoice(f"--activation-offload-layers {n}", Problem(p.model, p.cluster, train)))
    return out


def choose(p: Problem, target: str, run: Callable[[Problem], object]) -> tuple[KnobChoice, object, list[KnobChoice]]:
    """Run ``run`` (a search of one problem, returning a ``SearchResult``) for every setting of
    :func:`variants` and keep the fastest #1; the plan as given wins ties.

    Returns:
        (the chosen setting, its search result, every setting tried with its #1 time).
    Raises:
        AutoparError: the plan as given's own error when no setting finds a layout.
    """
    tried, results, first_error = variants(p, target), {}, None
    for choice in tried:
        try:
            result = run(choice.problem)
        except AutoparError as err:
            first_error = first_error or err
            continue
        choice.best_step_s = result.layouts[0].step_time_s
        results[choice.label] = result
    found = [c for c in tried if c.best_step_s is not None]
    if not found:
        raise first_error
    best = min(found, key=lambda c: (c.best_step_s, c.label != ""))
    return best, results[best.label], tried


def summary(chosen: KnobChoice, tried: list[KnobChoice]) -> str:
    """One line: the setting kept and each setting's #1 step time."""
    times = "; ".join(f"{c.label or 'as given'}: " + (f"{c.best_step_s:.2f} s" if c.best_step_s is not None
                                                       else "nothing fits") for c in tried)
    return f"--search-knobs: kept {chosen.label or 'the plan as given'} (#1 step time {times})"
