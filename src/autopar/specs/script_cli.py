"""Command-line defaults taken from a launch script (``--script``): explicit options win, then
the script's values, then autopar's own defaults."""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.model import MAX_SIZE, ModelSpec
from autopar.specs.script import ScriptPlan

# autopar's own defaults for options neither the command line nor a script sets.
CLI_FALLBACKS: dict[str, Any] = dict(nodes=1, devices_per_node=None, gbs=1024, seq_len=4096, precision="bf16",
                                     flash=True, vocab_pad=128)
LAYOUT_FALLBACKS: dict[str, Any] = dict(tp=1, pp=1, cp=1, vpp=1, ep=1, etp=None, mbs=1, zero=1, sp=False,
                                        recompute="none", recompute_layers=None, layers_per_stage=None,
                                        account_for_embedding=False, account_for_loss=False,
                                        recompute_modules=("core_attn",))
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


def layout_defaults(plan: ScriptPlan | None, values: dict[str, Any]) -> dict[str, Any]:
    """Fill the layout options left None from the script's layout, else :data:`LAYOUT_FALLBACKS`.
    The embedding/loss split switches come from the script too (also when ``values`` has no
    such option), except with an explicit ``layers_per_stage``, which replaces them."""
    script = plan.layout if plan is not None else {}
    filled = {k: v if v is not None else script.get(k, LAYOUT_FALLBACKS.get(k)) for k, v in values.items()}
    explicit_split = values.get("layers_per_stage") is not None
    for k in _SCRIPT_ONLY:
        if values.get(k) is None and (k in values or plan is not None):
            filled[k] = False if explicit_split else script.get(k, LAYOUT_FALLBACKS[k])
    return filled


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
