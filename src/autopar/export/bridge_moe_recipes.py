"""What Megatron-Bridge's MoE pretrain recipes run by default, which ``--target megatron-bridge``
(and ``export --format megatron-bridge``) assumes for those models where the command line and the
script leave it open: the token dispatcher and activation recompute (expert tensor parallel 1 is
:data:`autopar.specs.script_cli.TARGET_FALLBACKS`).

Read from NVIDIA-NeMo/Megatron-Bridge at commit 067f987df03b (2026-08-22); each library name
``<model>_pretrain_config`` is an alias of an H100 recipe function (``recipes/qwen/qwen3_moe.py``,
``recipes/gpt_oss/gpt_oss.py``, ``recipes/deepseek/deepseek_v3.py``):

| preset | recipe function (file under ``src/megatron/bridge/recipes/``) | dispatcher | recompute |
| --- | --- | --- | --- |
| qwen3-30b-a3b | ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config`` (``qwen/h100/qwen3_moe.py``) | flex, hybridep | none |
| qwen3-235b-a22b | ``qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config`` (``qwen/h100/qwen3_moe.py``) | flex, deepep | none |
| gpt-oss-120b | ``gpt_oss_120b_pretrain_64gpu_h100_bf16_config`` (``gpt_oss/h100/gpt_oss.py``) | alltoall | none |
| gpt-oss-20b | ``gpt_oss_20b_pretrain_16gpu_h100_bf16_config`` (``gpt_oss/h100/gpt_oss.py``) | alltoall | none |
| deepseek-v3 | ``deepseek_v3_pretrain_1024gpu_h100_bf16_config`` (``deepseek/h100/deepseek_v3.py``) | flex, hybridep | none |

The Qwen3-235B and DeepSeek-V3 recipes set ``moe_token_dispatcher_type="alltoall"`` with a
``moe_flex_dispatcher_backend`` and then call ``apply_flex_dispatcher_backend``
(``src/megatron/bridge/training/flex_dispatcher_backend.py``), which switches to ``flex`` with that
backend where the GPU runs it, else falls back to ``alltoall``: DeepEP on Ampere, Hopper, B200 and
B300; HybridEP on compute capability 8, 9 and 10 (GB200 and GB300 included)
(:func:`recipe_dispatcher`). The GPT-OSS recipes name ``deepep`` but never call it: they run
``alltoall``. Every recipe sets ``recompute_granularity=None`` and ``recompute_modules=None``
(Megatron-Core's default module list, ``core_attn``, is autopar's too).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.problem import Problem

BRIDGE_COMMIT = "067f987df03b"


@dataclass(frozen=True)
class MoeRecipeDefaults:
    """One recipe's MoE defaults: ``function`` (its name in ``file``), ``dispatcher`` as written
    (``alltoall`` or a flex backend, ``deepep``/``hybridep``), ``recompute`` (``none``/``selective``/``full``)."""

    function: str
    file: str
    dispatcher: str
    recompute: str = "none"


RECIPE_DEFAULTS: dict[str, MoeRecipeDefaults] = {
    "qwen3-30b-a3b": MoeRecipeDefaults("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "qwen/h100/qwen3_moe.py",
                                       "hybridep"),
    "qwen3-235b-a22b": MoeRecipeDefaults("qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", "qwen/h100/qwen3_moe.py",
                                         "deepep"),
    "gpt-oss-120b": MoeRecipeDefaults("gpt_oss_120b_pretrain_64gpu_h100_bf16_config", "gpt_oss/h100/gpt_oss.py",
                                      "alltoall"),
    "gpt-oss-20b": MoeRecipeDefaults("gpt_oss_20b_pretrain_16gpu_h100_bf16_config", "gpt_oss/h100/gpt_oss.py",
                                     "alltoall"),
    "deepseek-v3": MoeRecipeDefaults("deepseek_v3_pretrain_1024gpu_h100_bf16_config", "deepseek/h100/deepseek_v3.py",
                                     "hybridep"),
}

# Devices on which apply_flex_dispatcher_backend keeps each backend (by autopar preset name prefix):
# DeepEP "only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs"; HybridEP on major 8, 9, 10.
FLEX_DEVICES = {"deepep": ("a100", "h100", "h200", "b200", "b300"),
                "hybridep": ("a100", "h100", "h200", "b200", "b300", "gb200", "gb300")}


def recipe_defaults(p: Problem) -> MoeRecipeDefaults | None:
    """The MoE defaults of the recipe that builds ``p``'s model (:func:`autopar.export.megatron_bridge.recipe_for`),
    or None for a model without one in :data:`RECIPE_DEFAULTS`."""
    from autopar.errors import AutoparError
    from autopar.export.megatron_bridge import RECIPES, recipe_for

    try:
        recipe = recipe_for(p)
    except AutoparError:
        return None
    preset = next(name for name, fn in RECIPES.items() if fn == recipe)
    return RECIPE_DEFAULTS.get(preset)


def recipe_dispatcher(p: Problem, defaults: MoeRecipeDefaults) -> str:
    """The dispatcher the recipe runs on ``p``'s device: its flex backend where
    ``apply_flex_dispatcher_backend`` keeps it (:data:`FLEX_DEVICES`), else ``alltoall``. Example:
    Qwen3-235B-A22B's ``deepep`` on H100 stays ``deepep``, on GB200 falls back to ``alltoall``."""
    name = p.cluster.device.name.lower()
    if defaults.dispatcher in FLEX_DEVICES and not name.startswith(FLEX_DEVICES[defaults.dispatcher]):
        return "alltoall"
    return defaults.dispatcher


def layout_fallbacks(p: Problem) -> dict[str, str]:
    """Layout defaults (``Strategy`` fields) ``--target megatron-bridge`` takes from the model's
    recipe: ``moe_dispatcher`` and ``recompute``; empty for a model without a MoE recipe."""
    defaults = recipe_defaults(p)
    if defaults is None:
        return {}
    return {"moe_dispatcher": recipe_dispatcher(p, defaults), "recompute": defaults.recompute}


def note(p: Problem) -> str | None:
    """One line saying which recipe defaults the target assumes, or None without a MoE recipe.

    It names the recipe the export launches (``--recipe <model>_pretrain_config``) and the H100
    recipe function that name is an alias of, where the defaults are read; and it says the
    recompute default holds only where a layout leaves recompute open: a layout that recomputes
    selectively runs its own modules (Megatron-Core's default ``core_attn`` unless
    ``--recompute-modules``), which the recipe's ``recompute_modules=None`` does not decide."""
    defaults = recipe_defaults(p)
    if defaults is None:
        return None
    from autopar.errors import AutoparError
    from autopar.export.megatron_bridge import recipe_for

    dispatcher = recipe_dispatcher(p, defaults)
    fallback = "" if dispatcher == defaults.dispatcher else f" ({defaults.dispatcher} falls back to alltoall on " \
        f"{p.cluster.device.name})"
    try:
        alias = recipe_for(p)
    except AutoparError:  # no recipe builds this model: the export refuses it, the note names no alias
        alias = None
    launched = f"{alias}, an alias of " if alias and alias != defaults.function else ""
    return (f"Megatron-Bridge recipe {launched}{defaults.function} (src/megatron/bridge/recipes/{defaults.file} at "
            f"{BRIDGE_COMMIT}) defaults assumed where not given: dispatcher {dispatcher}{fallback}, recompute "
            f"{defaults.recompute} where the layout leaves it open (a selective layout recomputes its own modules), "
            "expert tensor parallel 1")
