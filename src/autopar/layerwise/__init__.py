"""Layer-wise parallel strategies: per decoder layer its own tp degree, data-parallel type and
checkpointing, chosen by dynamic programming over the layers of each pipeline stage under the
stage's memory budget, as Galvatron does (Miao et al., "Galvatron: Efficient Transformer Training
over Multiple GPUs Using Automatic Parallelism", VLDB 2023, sec. 4; Wang et al., Galvatron-BMW,
TPDS 2024, sec. 4).

Modules: :mod:`.plan` (the plan and its checks), :mod:`.tables` (per-layer costs of every
candidate, read off autopar's cost model), :mod:`.dp` (the dynamic programme of one stage),
:mod:`.evaluate` (step time and memory of a plan), :mod:`.splits` (balanced pipeline splits),
:mod:`.search` (the search over pp, splits, micro-batches, default data-parallel type and
vocabulary tp around the dynamic programme).
"""

from autopar.layerwise.evaluate import PlanCost, evaluate_plan, uniform_plan
from autopar.layerwise.plan import LayerwisePlan
from autopar.layerwise.search import LayerwiseResult, search_layerwise

__all__ = ["LayerwisePlan", "LayerwiseResult", "PlanCost", "evaluate_plan", "search_layerwise", "uniform_plan"]
