"""MoE knobs of the benchmark recipes behind the validation rows, where a row leaves them unstated.

A MoE row states its layout but not how the MoE layers ran: the token dispatcher, expert tensor
parallelism, the all-to-all overlap, the recompute modules and the kernel switches. Each source's
recipe sets them; :func:`apply_moe_recipe` applies the source's and records every one in the
row's ``assumed`` list. Facts of a recipe, never a fitted factor.

* Megatron-Bridge (``MBR-*`` rows, its performance summaries of the 25.09 / 25.11 containers):
  ``scripts/performance/configs/{deepseek,gpt_oss,qwen}/`` of NVIDIA-NeMo/Megatron-Bridge. Every
  MoE workload base config sets ``expert_tensor_parallel_size=1``; the ``set_*_common_configs`` of
  the Qwen3 and GPT-OSS pretrain configs set ``moe_router_fusion = True``,
  ``moe_router_force_load_balancing = True`` ("required for token dropless") and
  ``grad_reduce_in_fp32 = False`` (bf16 gradient reduction); the model providers run grouped GEMM
  with the fused permutation. Per model and GPU (:data:`MBR_KNOBS`): the dispatcher (``flex`` with
  ``moe_flex_dispatcher_backend`` deepep/hybridep, else ``alltoall``), ``moe_a2a_overlap``
  (``--overlap-moe-expert-parallel-comm``), ``recompute_modules``, the CUDA graph scope
  (``cuda_graph_impl="transformer_engine"``, ``cuda_graph_scope``) and, for Qwen3-235B on H100,
  ``CommOverlapConfig(tp_comm_overlap=False)``, as the 25.11 release branch has them (tag v0.2.0,
  2025-11-26). Where a row's layout differs from that release's config, the row's own cells win,
  except where every version of the config contradicts the table (:data:`MBR_LAYOUT_FIXES`). The
  DeepSeek-V3 H100 entry serves the 25.09 row only; it leaves out the ``moe_a2a_overlap=True``
  of v0.2.0, because the configs that state it begin on 2025-11-06 (commit bf75c65, "dataclass
  cfgs - perf"), after 25.09, so whether that run overlapped is not known.
* dgxc-benchmarking / NeMo 25.04 (``DGXC2505-*`` MoE rows): NeMo's MoE recipes fuse the
  permutation (``moe_permute_fusion=True``); dispatcher alltoall; router unfused (TE's fused router
  came later). DeepSeek-V3 runs without TP comm overlap: NeMo 6f2c6fd
  ``nemo/collections/llm/recipes/deepseek_v3.py`` ``pretrain_performance_optimizations`` adds
  ``MegatronCommOverlapCallback(tp_comm_overlap=False)`` (dgxc-benchmarking v25.05.04
  ``deepseek_v3/pretraining/launch.sh`` runs ``scripts.performance.llm.pretrain_deepseek_v3``, which
  builds ``pretrain_recipe(performance_mode=True)``); Grok-1's recipe sets it True.
* NeMo Automodel (``AUTOMODEL-*``): the rows' notes say "kernels TE + DeepEP" and "fake balanced
  gate": the DeepEP dispatcher with forced balance.
"""

from __future__ import annotations

from typing import Any

from autopar.specs import TrainSpec
from autopar.specs.moe_runtime import MoeRuntime
from autopar.strategy import Strategy
from autopar.validate.measurements import Row

MBR_SOURCE = "Megatron-Bridge scripts/performance/configs"
MBR_RUNTIME = dict(router_fusion=True, permute_fusion=True, force_balance=True)

#: (model, GPU family) -> recipe knobs of Megatron-Bridge's MoE performance configs at the 25.11 release
#: (tag v0.2.0, ``scripts/performance/configs/*/workload_base_configs.py``; module docstring). A config
#: without ``moe_flex_dispatcher_backend`` keeps its model provider's ``moe_token_dispatcher_type =
#: "alltoall"``; ``cuda_graph_scope`` goes with ``cuda_graph_impl="transformer_engine"``.
MBR_KNOBS: dict[tuple[str, str], dict[str, Any]] = {
    ("gpt-oss-120b", "H100"): dict(dispatcher="alltoall", recompute_modules=("layernorm", "moe_act")),
    ("gpt-oss-120b", "B200"): dict(dispatcher="alltoall", recompute_modules=("layernorm", "moe_act")),
    # No moe_a2a_overlap: Megatron-Bridge added it to the GPT-OSS configs on 2026-03-23 (commit 7260d62,
    # "perf optimizations- GPT-OSS 120B"), after the 25.11 release.
    ("gpt-oss-120b", "GB200"): dict(dispatcher="alltoall", recompute_modules=("layernorm", "moe_act")),
    ("gpt-oss-120b", "GB300"): dict(dispatcher="alltoall", cuda_graph_scope=("attn", "moe_router", "moe_preprocess")),
    ("qwen3-30b-a3b", "H100"): dict(dispatcher="alltoall", ep_overlap=True),
    ("qwen3-235b-a22b", "H100"): dict(dispatcher="alltoall", ep_overlap=True, tp_overlap=False),
    ("qwen3-235b-a22b", "GB200"): dict(dispatcher="hybridep", cuda_graph_scope=("attn", "moe_router", "moe_preprocess")),
    ("qwen3-235b-a22b", "GB300"): dict(dispatcher="hybridep", cuda_graph_scope=("moe_router", "moe_preprocess")),
    ("deepseek-v3", "H100"): dict(dispatcher="deepep", recompute_modules=("mla_up_proj", "mlp")),
    ("deepseek-v3", "B200"): dict(dispatcher="alltoall", recompute_modules=("mla_up_proj",)),
    ("deepseek-v3", "GB200"): dict(dispatcher="hybridep", recompute_modules=("mla_up_proj",),
                                   cuda_graph_scope=("moe_router", "moe_preprocess")),
    ("deepseek-v3", "GB300"): dict(dispatcher="hybridep", recompute_modules=("moe_act",),
                                   cuda_graph_scope=("attn", "moe_router", "moe_preprocess")),
}


#: (release, model, GPU family) -> layout cells the release's own config states where the published
#: table prints another value, with the evidence. Only where no version of the config has the table's
#: combination: GPT-OSS-120B on DGX-B200 in 25.11 - the table prints EP 8 with MBS 4; the configs
#: (``GPT_OSS_120B_B200_BF16_BASE_CONFIG``, unchanged from commit 34641780 "fix GPT-OSS perf scripts",
#: 2025-11-20, through tags v0.2.0, v0.2.1 and v0.2.2) set ``expert_model_parallel_size=64`` together
#: with ``micro_batch_size=4``; before that commit every GPT-OSS entry was the base config (EP 8, MBS 8,
#: full-iteration CUDA graphs). The table's GB200 and GB300 GPT-OSS rows were first published with the
#: same config values (EP 64, MBS 4, GBS 512, seq 4096) and corrected to their run's cells in commit
#: 1804c076f; the B200 row was not. Its 8213 tokens/s/GPU is about half of the GB200 row first published
#: for that same config (15754), as an EP-64 dispatch over the 8 DGX-B200 nodes' InfiniBand, against
#: the NVL72 domain's NVLink, would have it.
#: Left as the table has them, because a config version has the table's cells or neither reading is
#: consistent: Qwen3-30B-A3B H100 FP8-CS (table VP 24, MBS 2; v0.2.0 config VP 12, MBS 1; the 25.09
#: yaml VP 12, MBS 2) and GPT-OSS H100 (table MBS 4, GA 2; the config MBS 1, and dp 16 gives GA 8 or 32).
MBR_LAYOUT_FIXES: dict[tuple[str, str, str], tuple[dict[str, int], str]] = {
    ("2511", "gpt-oss-120b", "B200"): (
        dict(ep=64), "Megatron-Bridge v0.2.0 GPT_OSS_120B_B200_BF16_BASE_CONFIG expert_model_parallel_size=64 "
                     "with micro_batch_size=4 (the table's EP 8 appears in no config with MBS 4)"),
}


def layout_fix(row: Row) -> tuple[dict[str, int], str] | None:
    """(layout cells, evidence) of :data:`MBR_LAYOUT_FIXES` for a Megatron-Bridge row
    (``MBR-<release>-...``), else None."""
    parts = row.id.split("-")
    if parts[0] != "MBR" or len(parts) < 2:
        return None
    return MBR_LAYOUT_FIXES.get((parts[1], row["model"].lower(), gpu_family(row)))


def gpu_family(row: Row) -> str:
    """The GPU family a recipe is keyed by: GB300, GB200, B200 or H100 (from the ``gpu`` cell), else ''."""
    gpu = row["gpu"].upper()
    return next((name for name in ("GB300", "GB200", "B200", "H100") if gpu.startswith(name)), "")


def _knobs(row: Row) -> tuple[str, dict[str, Any]] | None:
    """(source, knobs) of the row's recipe, or None where autopar knows none."""
    rid, model = row.id, row["model"].lower()
    if rid.startswith("MBR"):
        knobs = MBR_KNOBS.get((model, gpu_family(row)))
        if knobs is None:
            return None
        return MBR_SOURCE, dict(knobs, etp=1, grad_dtype="bf16", runtime=MBR_RUNTIME)
    if rid.startswith("DGXC"):
        knobs: dict[str, Any] = dict(runtime=dict(permute_fusion=True))
        if model.startswith("deepseek"):
            knobs["tp_overlap"] = False  # NeMo 6f2c6fd deepseek_v3.py: tp_comm_overlap=False (module docstring)
        return "NeMo 25.04 MoE recipes", knobs
    if rid.startswith("AUTOMODEL") and "deepep" in row["notes"].lower():
        return "NeMo Automodel notes: TE + DeepEP, fake balanced gate", dict(
            dispatcher="deepep", runtime=dict(force_balance="balanced gate" in row["notes"].lower()))
    return None


def apply_moe_recipe(row: Row, strategy: Strategy, train: TrainSpec, assumed: list[str]
                     ) -> tuple[Strategy, TrainSpec]:
    """The row's layout and training settings with its recipe's MoE knobs (module docstring),
    each recorded in ``assumed``; unchanged for a dense model or a source without a recipe. A
    knob the row states itself (``ETP=`` in the notes) is kept; a layout cell of
    :data:`MBR_LAYOUT_FIXES` replaces the table's, recorded with its evidence."""
    found = _knobs(row)
    if found is None:
        return strategy, train
    source, knobs = found
    layout: dict[str, Any] = {}
    fix = layout_fix(row)
    if fix is not None:
        assumed.append(f"layout from the release config, not the table: {fix[0]} ({fix[1]})")
    if "etp" in knobs and "ETP=" not in row["notes"]:
        layout["etp"] = knobs["etp"]
    if "dispatcher" in knobs:
        layout["moe_dispatcher"] = knobs["dispatcher"]
    if knobs.get("ep_overlap") and strategy.ep > 1:
        layout["moe_ep_overlap"] = True
    if "recompute_modules" in knobs and not row["recompute"]:
        layout.update(recompute="selective", recompute_modules=knobs["recompute_modules"])
    if knobs.get("tp_overlap") is False:
        layout["tp_comm_overlap"] = False
    fields: dict[str, Any] = {"moe": MoeRuntime(**knobs.get("runtime", {}))}
    if "grad_dtype" in knobs:
        fields["grad_dtype"] = knobs["grad_dtype"]
    if "cuda_graph_scope" in knobs:
        fields.update(cuda_graph_impl="transformer_engine", cuda_graph_scope=knobs["cuda_graph_scope"])
    said = [f"{k}={v}" for k, v in layout.items()] + [f"{k}={v}" for k, v in knobs.get("runtime", {}).items()]
    said += [f"{k}={v}" for k, v in fields.items() if k in ("grad_dtype", "cuda_graph_impl", "cuda_graph_scope")]
    assumed.append(f"MoE recipe ({source}): " + ", ".join(said))
    return strategy.model_copy(update={**layout, **(fix[0] if fix else {})}), train.model_copy(update=fields)
