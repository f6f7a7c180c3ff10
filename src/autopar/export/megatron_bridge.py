"""Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge): a library recipe and the ConfigContainer
overrides that make it run the planned layout, as its recipe runner takes them.

The runner, ``scripts/training/run_recipe.py`` (Megatron-Bridge 0.3 to main), is started as
``torchrun ... scripts/training/run_recipe.py --recipe NAME KEY=VALUE ...``: it builds the
recipe's ``ConfigContainer`` (``src/megatron/bridge/training/config.py``), applies the trailing
Hydra-style overrides with ``process_config_with_overrides``
(``src/megatron/bridge/training/utils/omegaconf_utils.py``: OmegaConf in struct mode, so every key
must be an existing field), and runs ``runtime_config_update`` -> ``ConfigContainer.validate()``.

Recipes (:data:`RECIPES`) are the ``<model>_pretrain_config`` names exported by
``src/megatron/bridge/recipes/{llama,qwen,deepseek,gpt,gemma}/`` (in 0.3 the functions
themselves, on main aliases of the ``.../h100/*.py`` benchmark recipes). A recipe is picked only
when the problem's model is exactly a shipped preset whose Hugging Face config the recipe builds
(:func:`~autopar.problem_record.model_sha256` equal): a recipe's model is not editable through
overrides in a way that keeps it the checkpoint's.

What the overrides set (field names from Megatron-Core ``TransformerConfig`` /
``ModelParallelConfig``, Megatron-Bridge ``GPTModelProvider``, ``TrainingConfig``,
``DistributedDataParallelConfig``, ``OptimizerConfig``, ``CheckpointConfig``), see :func:`overrides`.
Everything else (data, tokenizer, optimizer schedule, checkpoint paths, run length) stays the
recipe's; the recipe's mock data set and ``checkpoint.save``/``load`` directories are to replace.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import Any

from autopar.errors import AutoparError
from autopar.export.comm_knobs import te_a2a_heads_reason
from autopar.export.layout_flags import FSDP_STRATEGY
from autopar.export.per_stage import require_uniform_recompute
from autopar.pipeline.layout import layout_of
from autopar.problem import Problem
from autopar.specs.script_attention import dropout_rates
from autopar.strategy import Strategy

RUNNER = "scripts/training/run_recipe.py"

#: autopar preset -> Megatron-Bridge recipe function (``megatron.bridge.recipes``). Mixtral and
#: Llama-2-13B/70B have no Megatron-Bridge pretrain recipe. The MoE recipes' dispatcher and recompute
#: defaults: :mod:`autopar.export.bridge_moe_recipes`.
RECIPES: dict[str, str] = {
    "llama2-7b": "llama2_7b_pretrain_config",
    "llama3-8b": "llama3_8b_pretrain_config",
    "llama3-70b": "llama3_70b_pretrain_config",
    "llama3.1-405b": "llama31_405b_pretrain_config",
    "qwen2.5-7b": "qwen25_7b_pretrain_config",
    "qwen2.5-72b": "qwen25_72b_pretrain_config",
    "qwen3-8b": "qwen3_8b_pretrain_config",
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",
    "gpt-oss-120b": "gpt_oss_120b_pretrain_config",
    "gpt-oss-20b": "gpt_oss_20b_pretrain_config",
    "deepseek-v3": "deepseek_v3_pretrain_config",
    "gpt3-175b": "gpt3_175b_pretrain_config",
    "gemma2-9b": "gemma2_9b_pretrain_config",
}

#: Precision -> Megatron-Bridge mixed-precision recipe (``src/megatron/bridge/training/mixed_precision.py``,
#: registered by name; the runner's ``mixed_precision=NAME`` is resolved by ``get_mixed_precision_config``
#: in ``runtime_config_update``).
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed"}
#: fp8 recipe (``TrainSpec.fp8_recipe``) -> (Megatron-Bridge recipe, its ``fp8_param_gather``). The
#: current-scaling recipe ``bf16_with_fp8_current_scaling_mixed`` also keeps the first and last decoder
#: layers in bf16 (``first_last_layers_bf16``, :data:`RECIPE_BF16_LAYERS`; autopar.cost.fp8_bf16_layers).
FP8_MIXED_PRECISION = {
    "delayed": ("bf16_with_fp8_delayed_scaling_mixed", True),
    "tensorwise": ("bf16_with_fp8_current_scaling_mixed", True),
    "mxfp8": ("bf16_with_mxfp8_mixed", True),
    "blockwise": ("bf16_with_fp8_subchannel_scaling_mixed", False),
    "nvfp4": ("bf16_with_nvfp4_mixed", False),
}


#: Megatron-Bridge mixed-precision recipe -> (first, last) layers it keeps in bf16
#: (``src/megatron/bridge/training/mixed_precision.py`` at 067f987: ``bf16_with_fp8_current_scaling_mixed``
#: sets ``first_last_layers_bf16=True``, ``num_layers_at_start_in_bf16=1``, ``num_layers_at_end_in_bf16=1``).
RECIPE_BF16_LAYERS = {"bf16_with_fp8_current_scaling_mixed": (1, 1)}


def mixed_precision(p: Problem) -> str:
    """The Megatron-Bridge mixed-precision recipe of the plan's precision and fp8 recipe.

    Raises:
        AutoparError: bf16 first/last layers other than the recipe's (tensorwise: 1,1,
            :data:`RECIPE_BF16_LAYERS`; the others none), or fp8 parameter storage other than the recipe's.
    """
    if p.train.precision != "fp8":
        return MIXED_PRECISION[p.train.precision]
    name, gathers = FP8_MIXED_PRECISION[p.train.effective_fp8_recipe]
    want = RECIPE_BF16_LAYERS.get(name, (0, 0))
    if p.train.bf16_end_layers != want:
        have = "{},{}".format(*p.train.bf16_end_layers)
        raise AutoparError(f"Megatron-Bridge: {name} (mixed_precision.py) keeps {want[0]},{want[1]} first,last layers in "
                           f"bf16, the plan {have}; plan with --fp8-bf16-layers {want[0]},{want[1]}, or export "
                           "--format megatron")
    if p.train.fp8_param_storage != gathers:
        raise AutoparError(f"Megatron-Bridge: {name} (mixed_precision.py) sets fp8_param_gather={gathers}; plan "
                           f"with {'--fp8-param-storage' if gathers else '--no-fp8-param-storage'}, or export --format "
                           "megatron")
    return name


#: Adam state and main-gradient dtypes (Megatron-Core ``OptimizerConfig``): fp32, the 4 + 12 bytes per
#: parameter autopar costs; DeepSeek-V3's recipe keeps bf16 moments and gradients through the
#: precision-aware optimizer, which the overrides turn off (``float32`` is read back to
#: ``torch.float32`` by ``omegaconf_utils._apply_overrides``).
OPTIMIZER_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


@lru_cache(maxsize=1)
def _preset_hashes() -> dict[str, str]:
    from autopar.problem_record import model_sha256
    from autopar.specs import load_model

    return {model_sha256(load_model(name)): name for name in RECIPES}


def recipe_for(p: Problem) -> str:
    """The recipe that builds ``p``'s model (see the module docstring).

    Raises:
        AutoparError: the model is none of the presets of :data:`RECIPES` (e.g. Mixtral, or a
            preset with another ``--vocab-size``), naming the models Megatron-Bridge has recipes for.
    """
    from autopar.problem_record import model_sha256

    name = _preset_hashes().get(model_sha256(p.model))
    if name is None:
        raise AutoparError(f"Megatron-Bridge: no pretrain recipe builds model {p.model.name} (recipes exist for "
                           f"{', '.join(RECIPES)}, as their Hugging Face configs; megatron.bridge.recipes); write it "
                           "for Megatron-LM instead (format megatron)")
    return RECIPES[name]


def _check(p: Problem, s: Strategy) -> None:
    """Refuse what a named recipe plus overrides cannot run as planned.

    Raises:
        AutoparError: recompute per stage (one ``model.recompute_granularity``); an fp8 recipe or fp8
            parameter storage Megatron-Bridge's recipes do not run (:func:`mixed_precision`;
            ``MixedPrecisionConfig.setup`` copies ``fp8_param_gather`` onto the model and DDP config),
            fp8 parameter gathering with zero 0 (Megatron-LM: it needs the distributed optimizer); fp16 with fp32 gradients (``fp16_mixed``
            reduces gradients in fp16, ``grad_reduce_in_fp32=False``); non-fused attention;
            TP communication overlap (``CommOverlapConfig`` needs a userbuffers config per shape).
    """
    require_uniform_recompute("Megatron-Bridge", s)
    mixed_precision(p)
    if p.train.precision == "fp8" and p.train.fp8_param_storage and s.zero == 0:
        raise AutoparError("Megatron-Bridge: fp8 parameter gathering needs the distributed optimizer (zero >= 1)")
    if p.train.precision == "fp16" and p.train.grad_dtype == "fp32":
        raise AutoparError("Megatron-Bridge: fp16_mixed (mixed_precision.py) reduces gradients in fp16 "
                           "(grad_reduce_in_fp32=False), the plan keeps fp32 gradients; use bf16")
    if not p.train.flash_attention:
        raise AutoparError("Megatron-Bridge: its recipes run fused attention; plan with --flash-attention")
    if s.tp_comm_overlap:
        raise AutoparError("Megatron-Bridge: TP communication overlap needs a CommOverlapConfig userbuffers "
                           "config for this shape (training/comm_overlap.py); not written (--no-tp-comm-overlap)")
    why = te_a2a_heads_reason(p, s)
    if why:
        raise AutoparError(f"Megatron-Bridge: {why}")


def overrides(p: Problem, s: Strategy) -> dict[str, Any]:
    """The ConfigContainer overrides for layout ``s``: dotted field -> value (None is ``null``).

    * parallel sizes: ``model.tensor_model_parallel_size`` (tp), ``pipeline_model_parallel_size``
      (pp), ``virtual_pipeline_model_parallel_size`` (vpp, null for 1), ``context_parallel_size``
      (cp, with the layout's ``cp_comm_type`` and, for a2a+p2p, ``hierarchical_context_parallel_sizes``),
      ``expert_model_parallel_size`` (ep),
      ``expert_tensor_parallel_size`` (etp; null = tp for dense models), ``sequence_parallel``;
      dp is what remains of the launcher's world (``ConfigContainer.get_data_parallel_size``:
      world / (tp * pp * cp));
    * split: ``num_layers_in_first/last_pipeline_stage`` for an uneven split,
      ``account_for_embedding/loss_in_pipeline_split``, or ``pipeline_model_parallel_layout`` for
      any other :class:`~autopar.pipeline.layout.PipelineLayout` (unequal middle stages or chunks;
      null otherwise, replacing the one DeepSeek-V3's recipe sets per (pp, vpp));
    * batch and sequence: ``train.micro_batch_size``, ``train.global_batch_size``,
      ``dataset.seq_length`` and ``model.seq_length`` (``validate`` asserts they agree; ``++``: in
      Megatron-Bridge 0.3 the dataset field is Megatron-Core's ``sequence_length`` and
      ``seq_length`` a read-only property, on main ``seq_length`` is the field copied into
      ``sequence_length`` by ``GPTDatasetConfig.finalize``, so both are written, each added if absent),
      ``model.make_vocab_size_divisible_by``;
    * recompute: ``model.recompute_granularity`` (null/full/selective), ``recompute_method``
      (``block`` N for ``recompute_layers`` N, else ``uniform`` 1), ``recompute_num_layers``,
      ``recompute_modules``;
    * ZeRO: ``ddp.use_distributed_optimizer`` and ``optimizer.use_distributed_optimizer`` (zero >= 1;
      ``_validate_and_sync_distributed_optimizer_settings`` turns both on if either is), Megatron-FSDP
      for zero 2/3 (``ddp.use_megatron_fsdp``, ``ddp.data_parallel_sharding_strategy``
      optim_grads/optim_grads_params, ``checkpoint.ckpt_format=fsdp_dtensor``,
      ``model.gradient_accumulation_fusion=false``), ``no_shard`` otherwise; DP overlap
      (``ddp.overlap_grad_reduce`` as planned, with or without the distributed optimizer, as the
      Megatron export's ``--overlap-grad-reduce``; ``ddp``/``optimizer`` ``overlap_param_gather``
      with the distributed optimizer);
    * dropout: ``model.attention_dropout`` and ``model.hidden_dropout`` (with ``ModelSpec.dropout``
      the script's rates, ``ModelSpec.dropout_rates``, else 0.1 each; 0.0 without: the recipes' own
      values are replaced);
    * precision: ``mixed_precision`` = :data:`MIXED_PRECISION` of the plan; fp32 optimizer
      states and main gradients (:data:`OPTIMIZER_DTYPES`, ``use_precision_aware_optimizer=false``);
    * overlap: ``comm_overlap=null`` and ``model.tp_comm_overlap=false`` (the recipes' userbuffers
      TP overlap is tuned to their own tp and sequence; autopar costs TP collectives and pipeline
      sends without it);
    * MoE: the layout's dispatcher (``moe_token_dispatcher_type`` alltoall/allgather/flex with
      ``moe_flex_dispatcher_backend`` deepep/hybridep) and EP overlap
      (``overlap_moe_expert_parallel_comm``), the plan's ``TrainSpec.moe`` switches
      (``delay_wgrad_compute``, permute and router fusion, shared-expert overlap, forced balance,
      capacity), grouped GEMM and the fp32 router, as the Megatron-LM export writes them.

    Raises:
        AutoparError: no recipe for the model (:func:`recipe_for`), or what :func:`_check` refuses.
    """
    recipe_for(p)
    _check(p, s)
    layout = layout_of(p, s)
    split = layout.layers_per_stage
    accounted = s.account_for_embedding or s.account_for_loss
    # what num_layers_in_first/last_pipeline_stage cannot say (unequal middle stages or chunks) is a layout
    flexible = not accounted and s.pp > 1 and layout.first_last() is None
    uneven = len(set(split)) > 1 and not accounted and not flexible
    full = s.recompute == "full"
    sharded, fsdp = s.zero >= 1, s.zero >= 2
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": s.tp,
        "model.pipeline_model_parallel_size": s.pp,
        "model.virtual_pipeline_model_parallel_size": s.vpp if s.vpp > 1 else None,
        "model.context_parallel_size": s.cp,
        "model.expert_model_parallel_size": s.ep if p.model.is_moe else 1,
        "model.expert_tensor_parallel_size": s.expert_tp if p.model.is_moe else None,
        "model.sequence_parallel": s.sp,
        "model.pipeline_model_parallel_layout": layout.megatron() if flexible else None,
        "model.num_layers_in_first_pipeline_stage": split[0] if uneven else None,
        "model.num_layers_in_last_pipeline_stage": split[-1] if uneven else None,
        "model.account_for_embedding_in_pipeline_split": s.account_for_embedding,
        "model.account_for_loss_in_pipeline_split": s.account_for_loss,
        "train.micro_batch_size": s.mbs,
        "train.global_batch_size": p.train.global_batch_size,
        "++dataset.seq_length": p.train.seq_len,
        "++dataset.sequence_length": p.train.seq_len,
        "model.seq_length": p.train.seq_len,
        "model.make_vocab_size_divisible_by": p.train.make_vocab_size_divisible_by,
        # ModelSpec.dropout is both masks, at the script's rates (autopar.specs.script_attention.dropout_rates)
        "model.attention_dropout": dropout_rates(p.model)[0],
        "model.hidden_dropout": dropout_rates(p.model)[1],
        "model.recompute_granularity": None if s.recompute == "none" else s.recompute,
        "model.recompute_method": ("block" if s.recompute_layers else "uniform") if full else None,
        "model.recompute_num_layers": (s.recompute_layers or 1) if full else None,
        "model.recompute_modules": list(s.recompute_modules),
        "ddp.use_distributed_optimizer": sharded,
        "optimizer.use_distributed_optimizer": sharded,
        "ddp.use_megatron_fsdp": fsdp,
        "ddp.data_parallel_sharding_strategy": FSDP_STRATEGY.get(s.zero, "no_shard"),
        # as the Megatron export's --overlap-grad-reduce, with or without the distributed optimizer (Megatron-Core
        # DistributedDataParallelConfig.overlap_grad_reduce); the estimate costs the reduce overlapped when set
        "ddp.overlap_grad_reduce": p.train.overlap_grad_reduce,
        "ddp.overlap_param_gather": sharded and p.train.overlap_grad_reduce,
        "optimizer.overlap_param_gather": sharded and p.train.overlap_grad_reduce,
        "optimizer.use_precision_aware_optimizer": False,
        **{f"optimizer.{name}": "float32" for name in OPTIMIZER_DTYPES},
        "mixed_precision": mixed_precision(p),
        "comm_overlap": None,
        "model.tp_comm_overlap": False,
    }
    if p.train.activation_offload_layers:  # autopar.cost.activation_offload; TransformerConfig fields
        out.update({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": p.train.activation_offload_layers,
                    "model.cpu_offloading_activations": True, "model.cpu_offloading_weights": False})
    if p.train.cuda_graph_impl != "none":  # autopar.cost.cuda_graph; TransformerConfig fields
        out["model.cuda_graph_impl"] = p.train.cuda_graph_impl
        out["model.cuda_graph_scope"] = list(p.train.cuda_graph_scope)
        if "full_iteration" in p.train.cuda_graph_scope:  # ConfigContainer.validate asserts it is off then
            out["rerun_state_machine.check_for_nan_in_loss"] = False
    if s.cp > 1:  # the layout's CP algorithm (autopar.cost.cp_comm), Megatron-Core TransformerConfig fields
        out["model.cp_comm_type"] = s.cp_comm_type
        if s.cp_comm_type == "a2a+p2p":
            out["model.hierarchical_context_parallel_sizes"] = [s.cp_a2a_size, s.cp // s.cp_a2a_size]
    if fsdp:
        out["checkpoint.ckpt_format"] = "fsdp_dtensor"
    if fsdp or not p.train.grad_accumulation_fusion:  # as costed (autopar.cost.wgrad_accumulation)
        out["model.gradient_accumulation_fusion"] = False
    if p.model.is_moe:
        moe, flex = p.train.moe, s.moe_dispatcher in ("deepep", "hybridep")
        out.update({"model.moe_token_dispatcher_type": "flex" if flex else s.moe_dispatcher,
                    "model.moe_flex_dispatcher_backend": s.moe_dispatcher if flex else None,
                    "model.overlap_moe_expert_parallel_comm": s.moe_ep_overlap,
                    "model.delay_wgrad_compute": moe.delay_wgrad,
                    "model.moe_grouped_gemm": True, "model.moe_permute_fusion": moe.permute_fusion,
                    "model.moe_router_fusion": moe.router_fusion,
                    "model.moe_shared_expert_overlap": moe.shared_expert_overlap,
                    "model.moe_router_force_load_balancing": moe.force_balance,
                    "model.moe_router_padding_for_fp8": moe.router_padding_for_fp8,
                    "model.moe_expert_capacity_factor": moe.capacity_factor,
                    "model.moe_pad_expert_input_to_capacity": moe.pad_to_capacity,
                    "model.moe_router_dtype": "fp32"})
    return out


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: ``true``/``false``, ``null``, numbers, bare names
    and ``[a,b]`` lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return str(value)


def write(p: Problem, s: Strategy) -> str:
    """A bash script that runs the recipe of ``p``'s model with :func:`overrides` for ``s``
    from a Megatron-Bridge checkout.

    Raises:
        AutoparError: as :func:`overrides`.
    """
    recipe, table = recipe_for(p), overrides(p, s)
    lines = [f"torchrun --nnodes {p.cluster.num_nodes} --nproc_per_node {p.cluster.devices_per_node} {RUNNER}",
             f"--recipe {recipe}"]
    lines += [shlex.quote(f"{key}={hydra_value(value)}") for key, value in table.items()]
    from autopar.export.bridge_moe_recipes import note

    assumed = note(p)
    return ("#!/bin/bash\n"
            + (f"# {assumed}\n" if assumed else "")
            + f"# Megatron-Bridge recipe {recipe} with autopar's layout (dp {s.dp} = world / (tp*pp*cp)) as\n"
            "# ConfigContainer overrides; run from a Megatron-Bridge checkout. Data, tokenizer, checkpoint\n"
            "# paths and run length are the recipe's (mock data): override them too (dataset.*, checkpoint.*).\n"
            + " \\\n    ".join(lines) + "\n")
