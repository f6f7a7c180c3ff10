"""Combinations of modelled knobs that Megatron-LM's main branch refuses: the script never runs as
written, so it is refused with Megatron's message instead of being costed.

Sources: Megatron-LM main (d98e8a6, 2026-08-22) ``megatron/core/transformer/transformer_config.py``
``TransformerConfig.__post_init__`` and ``megatron/training/arguments.py`` ``validate_args``:

* CUDA graphs with full recompute: ``if self.recompute_granularity != "selective": assert
  self.cuda_graph_impl == "full_iteration", "full recompute is only supported with full iteration CUDA
  graph."`` (``--enable-cuda-graph`` is ``local``, ``--external-cuda-graph`` ``transformer_engine``; the
  older ``--cuda-graph-impl local --cuda-graph-scope full_iteration`` is main's ``full_iteration``);
* ``--moe-shared-expert-overlap`` with shared experts and the allgather dispatcher: ``raise
  ValueError("moe_shared_expert_overlap only works with alltoall or flex token dispatcher.")``;
* ``--delay-wgrad-compute`` without ``--overlap-moe-expert-parallel-comm``: ``assert
  self.overlap_moe_expert_parallel_comm, 'overlap_moe_expert_parallel_comm must be enabled when
  enabling delay_wgrad_compute'`` (dense models too: the assert does not look at the experts);
* ``--overlap-moe-expert-parallel-comm`` on a model without experts: ``assert
  self.expert_model_parallel_size > 1, 'overlap_moe_expert_parallel_comm is only supported with expert
  model parallelism'``;
* ``--attention-backend local``: ``assert args.spec[0] == 'local', '--attention-backend local is only
  supported with --spec local'`` (arguments.py); ``--spec`` itself is refused (a custom layer spec),
  so the backend is refused in every script.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

_MAIN = "Megatron-LM main"
_CONFIG = "megatron/core/transformer/transformer_config.py"


def check_knob_asserts(a: Args, model: dict[str, Any], layout: dict[str, Any], train: dict[str, Any]) -> None:
    """Refuse the combinations of the module docstring.

    ``model``, ``layout`` and ``train``: the field dicts the reader built (ModelSpec, Strategy and
    TrainSpec fields).

    Raises:
        AutoparError: the first combination the script has, naming its flags, Megatron-LM's message
            and what would run.
    """
    impl, scope = train.get("cuda_graph_impl", "none"), train.get("cuda_graph_scope", ())
    if impl != "none" and "full_iteration" not in scope and layout.get("recompute") == "full":
        raise AutoparError(f"{a.source}: --cuda-graph-impl {impl} (or --enable-cuda-graph / --external-cuda-graph) "
                           f"with --recompute-granularity full: {_MAIN} asserts 'full recompute is only supported "
                           f"with full iteration CUDA graph.' ({_CONFIG}); use --recompute-granularity selective, "
                           "or drop the CUDA graphs")
    experts = bool(model.get("num_experts"))
    if a.has("--moe-shared-expert-overlap") and experts and model.get("shared_expert_ffn_hidden_size") \
            and layout.get("moe_dispatcher") == "allgather":
        given = "" if a.has("--moe-token-dispatcher-type") else " (Megatron-LM's default dispatcher)"
        raise AutoparError(f"{a.source}: --moe-shared-expert-overlap with the allgather token dispatcher{given}: "
                           f"{_MAIN} raises 'moe_shared_expert_overlap only works with alltoall or flex token "
                           f"dispatcher.' ({_CONFIG}); add --moe-token-dispatcher-type alltoall or drop "
                           "--moe-shared-expert-overlap")
    if a.has("--delay-wgrad-compute") and not a.has("--overlap-moe-expert-parallel-comm"):
        raise AutoparError(f"{a.source}: --delay-wgrad-compute without --overlap-moe-expert-parallel-comm: {_MAIN} "
                           "asserts 'overlap_moe_expert_parallel_comm must be enabled when enabling "
                           f"delay_wgrad_compute' ({_CONFIG}), for dense models too; drop --delay-wgrad-compute")
    if a.has("--overlap-moe-expert-parallel-comm") and not experts:
        raise AutoparError(f"{a.source}: --overlap-moe-expert-parallel-comm on a model without experts (no "
                           f"--num-experts): {_MAIN} asserts 'overlap_moe_expert_parallel_comm is only supported "
                           f"with expert model parallelism' ({_CONFIG}); drop it")
    if a.text("--attention-backend") == "local":
        raise AutoparError(f"{a.source}: --attention-backend local: {_MAIN} asserts '--attention-backend local is "
                           "only supported with --spec local' (megatron/training/arguments.py), and the local spec "
                           "(Megatron's own unfused layers, no Transformer Engine fusions) is not what autopar "
                           "costs; use --attention-backend unfused for attention without a fused kernel")
