"""How a measured run reduced its data-parallel gradients, where its launch script says so.

Kept apart from :mod:`autopar.validate.rows` (which maps the rest of a row) so each source's
data-parallel implementation sits beside the script line it comes from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.validate.measurements import Row

if TYPE_CHECKING:
    from autopar.validate.rows import Family

# Megatron-LM examples/sc21/run_table_1.sh: DDP=torch (PyTorch DistributedDataParallel) for the
# 1.7B, 3.6B, 7.5B and 18B models, as (layers, hidden size); the larger ones run DDP=local
# (Megatron's own, reducing after the last backward: the megatron-2021 family default).
SC21_TABLE1_TORCH_DDP = ((24, 2304), (30, 3072), (36, 4096), (40, 6144))

#: (row id prefix, source): runs whose recipe reduces the data-parallel gradients in bf16
#: (``grad_reduce_in_fp32=False``: 2 B per gradient in memory and on the wire, ``grad_dtype='bf16'``),
#: where autopar's Megatron default is fp32 main gradients.
BF16_GRAD_RECIPES = (
    # dgxc-benchmarking v24.11.1 (NeMo 24.05/24.09, NeMo 1.x YAMLs): llama3.1/llama3.1_{70b,405b}.yaml,
    # nemo_megatron/gpt3_175b_hydra.yaml and nemotron/nemotron4-{15b,340b}-synth.yaml set
    # optim.name: distributed_fused_adam with optim.grad_sync_dtype: bf16 (no launch.sh/configure.sh
    # overrides it). NeMo's MegatronDistributedFusedAdam (nemo/core/optim/distributed_adam.py,
    # init_params_bucket) reduces every bucket in grad_sync_dtype but the embedding/output ones
    # (``_with_fp32_optimizer``: fp32), a vocab-sized share autopar does not split off.
    ("DGXC2411", "dgxc-benchmarking v24.11.1 YAMLs: distributed_fused_adam grad_sync_dtype bf16"),
    # dgxc-benchmarking v25.05.04 runs NeMo commit 6f2c6fd's scripts/performance/llm/pretrain_*.py with
    # performance_mode=True: the recipes' pretrain_performance_optimizations (llama31_405b.py,
    # nemotron4_340b.py, nemotron4_15b.py, deepseek_v3.py; pretrain_grok1_314b.py's own) set
    # recipe.trainer.plugins.grad_reduce_in_fp32 = False for bf16 and fp8 alike, and
    # scripts/performance/utils.py set_primary_perf_configs sets it again with the fp8 plugin. The
    # plugin's value overrides the DDP config's (nemo/lightning/pytorch/strategies/megatron_strategy.py:
    # ddp_config = update_config_with_dtype_overrides(dtype_config, ddp_config)).
    ("DGXC2505", "NeMo 6f2c6fd performance recipes: plugins.grad_reduce_in_fp32=False"),
    # Megatron-Bridge v0.2.0 (25.11) scripts/performance/configs/{llama3,llama31,qwen3,deepseek,gpt_oss}/
    # *_llm_pretrain.py: set_*_common_configs sets cfg.mixed_precision.grad_reduce_in_fp32 = False and
    # cfg.ddp.grad_reduce_in_fp32 = False for every GPU and precision.
    ("MBR", "Megatron-Bridge v0.2.0 performance configs: grad_reduce_in_fp32=False"),
)


#: (row id prefix, source): fp8 runs whose recipe keeps the linear weights in fp8 and gathers them
#: in fp8 (``TrainSpec.fp8_param_storage``, :mod:`autopar.cost.fp8_param_gather`).
FP8_PARAM_GATHER_RECIPES = (
    # dgxc-benchmarking v24.11.1: nemo_megatron/gpt3_175b_hydra.yaml sets model.fp8_params: true,
    # llama3.1/configure.sh and nemotron/configure.sh pass +model.fp8_params=$FP8_ENABLED; all run
    # distributed_fused_adam, whose NeMo subclass (nemo/core/optim/distributed_adam.py,
    # init_params_bucket) gives Float8Tensor parameters buckets with param_sync_dtype=torch.uint8.
    ("DGXC2411", "dgxc-benchmarking v24.11.1: model.fp8_params true (gpt3_175b_hydra.yaml, llama3.1/ and "
                 "nemotron/configure.sh), uint8 param buckets in NeMo's distributed_fused_adam"),
    # dgxc-benchmarking v25.05.04 launch.sh passes --compute_dtype fp8 and no --fp8_recipe: NeMo 6f2c6fd
    # scripts/performance/utils.py set_primary_perf_configs takes recipe "ds", the plugin
    # bf16_with_fp8_mixed() (nemo/collections/llm/recipes/precision/mixed_precision.py), which sets
    # fp8_param_gather = True.
    ("DGXC2505", "NeMo 6f2c6fd performance recipes: bf16_with_fp8_mixed() fp8_param_gather=True"),
    # Megatron-Bridge v0.2.0 (25.11) scripts/performance/utils/helpers.py get_precision_config: fp8_cs is
    # bf16_with_fp8_current_scaling_mixed(), fp8_mx bf16_with_mxfp8_mixed(); both set fp8_param_gather = True
    # (src/megatron/bridge/training/mixed_precision.py), and no performance config resets it.
    ("MBR-2511", "Megatron-Bridge v0.2.0 performance configs: fp8_param_gather=True"),
    # Megatron-LM examples/llama/README.md's FP8 table: its FP8 recipe, train_llama3_8b_h100_fp8.sh, passes
    # --fp8-param-gather.
    ("MLM-LLAMA-FP8", "Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh: --fp8-param-gather"),
)


def fp8_param_gather_of(row: Row, precision: str, assumed: list[str]) -> bool:
    """``TrainSpec.fp8_param_storage`` of the row: True for an fp8 row of a
    :data:`FP8_PARAM_GATHER_RECIPES` source (recorded in ``assumed``), else False (autopar's default,
    Megatron's: bf16 weights gathered in bf16)."""
    if precision != "fp8":
        return False
    for prefix, source in FP8_PARAM_GATHER_RECIPES:
        if row.id.startswith(prefix):
            assumed.append(f"fp8 param gather ({source})")
            return True
    return False


def data_parallel_of(row: Row, family: Family, num_layers: int, hidden_size: int,
                     assumed: list[str]) -> tuple[bool, str]:
    """(``TrainSpec.overlap_grad_reduce``, ``TrainSpec.grad_dtype``) of the row: the family's
    (overlap as :attr:`Family.dp_overlap`, fp32 main gradients), except SC'21 Table 1 rows whose
    launch script runs PyTorch DDP (:data:`SC21_TABLE1_TORCH_DDP`, ``--DDP-impl torch``; matched by
    layer count and hidden size). Megatron-LM's
    schedule (2021, ``schedules.py`` ``forward_backward_no_pipelining``) runs all micro-batches but
    the last inside ``model.no_sync()``, so torch DDP all-reduces its gradient buckets during the
    last micro-batch's backward, in the 16-bit dtype of the wrapped fp16/bf16 module's gradients
    (2 B: ``grad_dtype='bf16'``). Rows of a :data:`BF16_GRAD_RECIPES` source reduce bf16 gradients
    (overlap as the family's). Recorded in ``assumed``."""
    if family.name == "megatron-2021" and row.id.startswith("NAR21-T1") \
            and (num_layers, hidden_size) in SC21_TABLE1_TORCH_DDP:
        assumed.append("DDP=torch (run_table_1.sh): 16-bit gradients all-reduced during the last backward")
        return True, "bf16"
    for prefix, source in BF16_GRAD_RECIPES:
        if row.id.startswith(prefix):
            assumed.append(f"grad_dtype=bf16 ({source})")
            return family.dp_overlap, "bf16"
    return family.dp_overlap, "fp32"
