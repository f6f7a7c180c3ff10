"""The defaults of every command's options, in one place: explicit options win, then a launch
script's values (``--script``), then autopar's own defaults below (:data:`CLI_FALLBACKS`,
:data:`LAYOUT_FALLBACKS`, per target :data:`TARGET_FALLBACKS` and :func:`sequence_parallel_default`),
which ``search``, ``estimate``, ``balance``, ``export`` and ``profile`` share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autopar.errors import AutoparError
from autopar.specs.model import MAX_SIZE, ModelSpec

if TYPE_CHECKING:  # the script reader is imported only where a --script is given
    from autopar.specs.script import ScriptPlan

# autopar's own defaults for options neither the command line nor a script sets.
CLI_FALLBACKS: dict[str, Any] = dict(nodes=1, devices_per_node=None, gbs=1024, seq_len=4096, precision="bf16",
                                     flash=True, vocab_pad=128)
# sp None: :func:`sequence_parallel_default`; tp_comm_overlap None: :func:`tp_comm_overlap_default` of the layout's tp and the target framework.
LAYOUT_FALLBACKS: dict[str, Any] = dict(tp=1, pp=1, cp=1, vpp=1, ep=1, etp=None, mbs=1, zero=1, sp=None,
                                        recompute="none", recompute_layers=None, layers_per_stage=None,
                                        pipeline_layout=None,
                                        account_for_embedding=False, account_for_loss=False,
                                        recompute_modules=("core_attn",), tp_comm_overlap=None, cp_comm_type="p2p",
                                        cp_a2a=None, moe_dispatcher="alltoall", moe_ep_overlap=False)
# Sequence parallelism with tp > 1 by target (``--format`` / ``--target``; ``estimate`` and ``balance``
# cost Megatron-LM): what each framework's own recipes run, so that ``estimate``, ``balance``, ``export``
# and the search's row for a layout agree when ``--sp/--no-sp`` is not given.
SP_WITH_TP: dict[str, bool] = {
    # Megatron-Bridge recipes set sequence_parallel=True with tp > 1 (recipes/llama/llama3_70b.py:
    # tp 4, pp 4, vpp 5, cp 2, sequence_parallelism=True); Megatron-Core MoE with tp > 1 requires it.
    "megatron": True,
    "megatron-bridge": True,
    # MindSpeed-LLM example scripts pass --sequence-parallel with TP (examples/mcore/deepseek3/
    # pretrain_deepseek3_671b_4k_ptd.sh: TP=4 ... --sequence-parallel).
    "mindspeed": True,
    # torchtitan's TP plan always shards the sequence (SequenceParallel on the norms; its writer
    # refuses tp > 1 without sp).
    "torchtitan": True,
    # MindFormers parallel_config use_seq_parallel: True (research/llama3/finetune_llama3_70b.yaml).
    "sapp": True,
    # Galvatron runs Megatron-Core layers; Megatron SP is its runtime --sequence-parallel
    # (autopar.export.galvatron), taken as Megatron's default.
    "galvatron": True,
    # Megatron-DeepSpeed's recipes leave it off (examples_deepspeed/pretrain_llama2_distributed.sh:
    # TP=2 without --sequence-parallel; BLOOM's runs too).
    "deepspeed": False,
}


# TP communication overlap (Strategy.tp_comm_overlap) with SP by target, as each framework's recipes set it.
TP_OVERLAP_WITH_SP: dict[str, bool] = {
    # Megatron-Bridge recipes (src/megatron/bridge/recipes/llama/h100/llama3.py at 067f987,
    # llama3_70b_pretrain_32gpu_h100_bf16_config: tp 4, pp 4, vpp 5, cp 2, SP,
    # CommOverlapConfig(tp_comm_overlap=True, userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192)).
    "megatron": True,
    # MindSpeed-LLM example scripts do not pass --use-ascend-mc2 (pretrain_deepseek3_671b_4k_ptd.sh).
    "mindspeed": False,
    # torchtitan's parallelism.enable_async_tensor_parallel defaults to false, as in its llama3 tomls.
    "torchtitan": False,
    # Megatron-Bridge's recipes run it, but with a userbuffers config tuned per shape, which its writer
    # does not write (autopar.export.megatron_bridge refuses tp_comm_overlap).
    "megatron-bridge": False,
    # No TP overlap switch in these (autopar.export.comm_knobs).
    "sapp": False, "galvatron": False, "deepspeed": False,
}


# Layout defaults that differ by target: torchtitan shards with FSDP2 by default
# (data_parallel_shard_degree -1, i.e. ZeRO-3) and has no optimizer-only sharding (ZeRO-1);
# Megatron-Bridge's MoE performance recipes all set expert_tensor_parallel_size=1
# (scripts/performance/configs/*/..._workload_base_configs.py; autopar.validate.moe_recipes).
TARGET_FALLBACKS: dict[str, dict[str, Any]] = {"torchtitan": {"zero": 3}, "megatron-bridge": {"etp": 1}}


def sequence_parallel_default(tp: int, target: str = "megatron") -> bool:
    """Sequence parallelism when neither ``--sp/--no-sp`` nor a script says: on with tp > 1
    where the ``target`` framework's recipes run it (:data:`SP_WITH_TP`), off at tp = 1
    (Megatron switches it off there).

    Raises:
        AutoparError: an unknown target.
    """
    if target not in SP_WITH_TP:
        raise AutoparError(f"--target={target!r}: allowed {', '.join(SP_WITH_TP)}")
    return tp > 1 and SP_WITH_TP[target]


def tp_comm_overlap_default(tp: int, sp: bool, target: str = "megatron") -> bool:
    """TP communication overlap when neither ``--tp-comm-overlap/--no-tp-comm-overlap`` nor a script
    says: on with SP and tp > 1 where the ``target``'s recipes run it (:data:`TP_OVERLAP_WITH_SP`).

    Raises:
        AutoparError: an unknown target.
    """
    if target not in TP_OVERLAP_WITH_SP:
        raise AutoparError(f"--target={target!r}: allowed {', '.join(TP_OVERLAP_WITH_SP)}")
    return tp > 1 and sp and TP_OVERLAP_WITH_SP[target]


# Embedding/loss split switches: from the script unless an explicit split replaces them.
_SCRIPT_ONLY = ("account_for_embedding", "account_for_loss")


#: Command-line option -> the launch-script flag that gives its default (see :func:`option_name`).
SCRIPT_FLAGS = {"--nodes": "--nnodes", "--devices-per-node": "--nproc_per_node", "--gbs": "--global-batch-size",
                "--seq-len": "--seq-length", "--make-vocab-size-divisible-by": "--make-vocab-size-divisible-by",
                "--tp": "--tensor-model-parallel-size", "--pp": "--pipeline-model-parallel-size",
                "--cp": "--context-parallel-size", "--vpp": "--num-virtual-stages-per-pipeline-rank",
                "--ep": "--expert-model-parallel-size", "--etp": "--expert-tensor-parallel-size",
                "--mbs": "--micro-batch-size", "--recompute-layers": "--recompute-num-layers"}


def option_name(option: str, given: Any, plan: ScriptPlan | None) -> str:
    """How an error names a value: ``option`` when the command line gave it (``given`` not None)
    or there is no script, else the script's flag it came from (``job.sh: --global-batch-size``),
    so a script's ``--global-batch-size -5`` is not reported as an ``--gbs`` the user never typed."""
    if given is not None or plan is None or option not in SCRIPT_FLAGS:
        return option
    return f"{plan.path.name}: {SCRIPT_FLAGS[option]}"


def cli_defaults(plan: ScriptPlan | None, values: dict[str, Any]) -> dict[str, Any]:
    """Fill the command-line ``values`` left None: from the script when there is one, else from
    :data:`CLI_FALLBACKS`. Explicit options always win over the script."""
    script: dict[str, Any] = {}
    if plan is not None:
        t = plan.train_fields
        script = dict(nodes=plan.num_nodes, devices_per_node=plan.devices_per_node, gbs=t["global_batch_size"],
                      seq_len=t["seq_len"], precision=t["precision"], flash=t["flash_attention"],
                      vocab_pad=t["make_vocab_size_divisible_by"])
    return {k: v if v is not None else script.get(k, CLI_FALLBACKS.get(k)) for k, v in values.items()}


def layout_defaults(plan: ScriptPlan | None, values: dict[str, Any], target: str = "megatron",
                    model_fallbacks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fill the layout options left None from the script's layout, else :data:`LAYOUT_FALLBACKS`
    with the ``target``'s :data:`TARGET_FALLBACKS` (``target``: the export format, or ``megatron``;
    ``sp``: :func:`sequence_parallel_default` of the filled tp and ``target``; ``tp_comm_overlap``:
    :func:`tp_comm_overlap_default` of the filled tp, sp and ``target``). The embedding/loss split switches come from the script too (also when
    ``values`` has no such option), except with an explicit ``layers_per_stage`` or ``pipeline_layout``,
    which replaces every split form of the script (and sets vpp from the layout string).
    ``model_fallbacks``: defaults of the target's recipe for this model, over the target's
    (Megatron-Bridge's MoE recipes: :func:`autopar.export.bridge_moe_recipes.layout_fallbacks`).

    Raises:
        AutoparError: an option that contradicts a script value it does not replace
            (:func:`script_conflicts`).
    """
    script = plan.layout if plan is not None else {}
    if plan is not None:
        script_conflicts(plan, values)
    fallbacks = {**LAYOUT_FALLBACKS, **TARGET_FALLBACKS.get(target, {}), **(model_fallbacks or {})}
    filled = {k: v if v is not None else script.get(k, fallbacks.get(k)) for k, v in values.items()}
    if "sp" in filled and filled["sp"] is None:
        filled["sp"] = sequence_parallel_default(filled.get("tp") or 1, target)
    if "tp_comm_overlap" in filled and filled["tp_comm_overlap"] is None:
        filled["tp_comm_overlap"] = tp_comm_overlap_default(filled.get("tp") or 1, bool(filled.get("sp")), target)
    if values.get("cp_comm_type") not in (None, "a2a+p2p") and values.get("cp_a2a") is None:
        filled["cp_a2a"] = None  # the script's hierarchical group size goes with its a2a+p2p only
    explicit_split = values.get("layers_per_stage") is not None or values.get("pipeline_layout") is not None
    for k in _SCRIPT_ONLY:
        if values.get(k) is None and (k in values or plan is not None):
            filled[k] = False if explicit_split else script.get(k, LAYOUT_FALLBACKS[k])
    if explicit_split:
        for k in ("layers_per_stage", "pipeline_layout"):
            if k in filled:
                filled[k] = values.get(k)
        if values.get("pipeline_layout") is not None and values.get("vpp") is None and "vpp" in filled:
            from autopar.pipeline.layout import PipelineLayout

            filled["vpp"] = PipelineLayout.parse(values["pipeline_layout"], filled.get("pp") or 1).vpp
    return filled


_SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--num-layer-list",
                "--noop-layers", "--pipeline-model-parallel-layout")


def script_conflicts(plan: ScriptPlan, values: dict[str, Any]) -> None:
    """Refuse a command-line layout option that contradicts a script value it leaves in place, naming
    the option and the script's flag (the layout check would otherwise name a field the user never
    gave, e.g. ``recompute_layers=1 needs --recompute full``):

    * ``--recompute`` none/selective with the script's ``--recompute-method block
      --recompute-num-layers N`` (a count of fully recomputed layers) and no ``--recompute-layers``;
    * ``--pp`` other than the script's with its explicit split (first/last stage counts, a layer
      list, noop layers or a layout string, all over the script's pp) and no ``--layers-per-stage``
      or ``--pipeline-layout``.

    Raises:
        AutoparError: one line naming both.
    """
    lay, name = plan.layout, plan.path.name
    recompute = values.get("recompute")
    if (recompute is not None and recompute != "full" and values.get("recompute_layers") is None
            and lay.get("recompute_layers") is not None):
        raise AutoparError(f"--recompute={recompute} conflicts with {name}: --recompute-method block "
                           f"--recompute-num-layers {lay['recompute_layers']} (a count of fully recomputed layers); "
                           "drop --recompute, or change the script's recompute flags")
    pp = values.get("pp")
    explicit = values.get("layers_per_stage") is not None or values.get("pipeline_layout") is not None
    if pp is not None and pp != lay.get("pp") and not explicit and (lay.get("layers_per_stage") or
                                                                    lay.get("pipeline_layout")):
        flags = " ".join(f"{f} {plan.args.text(f)}" for f in _SPLIT_FLAGS if plan.args.has(f))
        raise AutoparError(f"--pp={pp} conflicts with {name}: {flags} (a split over the script's "
                           f"--pipeline-model-parallel-size {lay['pp']}); give --layers-per-stage (or "
                           f"--pipeline-layout) for pp={pp}, or drop --pp")


def model_for(model: str | None, plan: ScriptPlan | None, vocab_size: int | None) -> ModelSpec:
    """The model: ``--model`` when given (it overrides the script's shape), else the script's.
    ``vocab_size`` (``--vocab-size``) replaces the vocabulary of either.

    Raises:
        AutoparError: neither given, the script's vocabulary is unknown, or ``vocab_size`` outside
            1..:data:`~autopar.specs.model.MAX_SIZE`.
    """
    from autopar.specs.hf import load_model

    if vocab_size is not None and not 1 <= vocab_size <= MAX_SIZE:
        raise AutoparError(f"--vocab-size={vocab_size}: must be an integer in 1..{MAX_SIZE}")
    if model is not None:
        spec = load_model(model)
        return spec if vocab_size is None else type(spec).model_validate({**spec.model_dump(), "vocab_size": vocab_size})
    if plan is None:
        raise AutoparError("--model or --script is required (a config.json, a preset name or a launch script)")
    return plan.model_spec(vocab_size)
