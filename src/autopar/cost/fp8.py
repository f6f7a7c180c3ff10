"""fp8 training (Transformer Engine, Megatron ``--fp8-format hybrid``): what runs in fp8 and what
it costs in memory.

Time: only linear layers run on the fp8 tensor cores (TE ``Linear``/``LayerNormLinear``/
``GroupedLinear`` inside ``fp8_autocast``); core attention (softmax and the two batched GEMMs),
the router and the output layer stay in bf16 (TE "Using FP8 with Transformer Engine" primer;
Megatron keeps the output layer out of fp8). TE's default recipe (``DelayedScaling``,
``override_linear_precision=(False, False, False)``) runs all three GEMMs of a linear layer in
fp8: fprop (E4M3 x E4M3), dgrad and wgrad (E5M2 gradients); fprop uses cuBLASLt fast
accumulation, dgrad/wgrad split accumulation (``_2X_ACC_DGRAD``/``_2X_ACC_WGRAD``), which is
one reason the device's ``fp8_gemm_efficiency`` is below its bf16 ``gemm_efficiency``
(:func:`gemm_efficiency`). Each fp8 GEMM quantises its activation input (``cast_transpose``:
read bf16, write fp8 and its fp8 transpose for the backward pass, 4 B per element) unless the norm
before it writes it in fp8 (TE ``LayerNormLinear``, :func:`cast_bytes`); the
backward's gradient cast-transpose is the same work on the output side and is covered by the
2x-forward backward. Weights are cast once per step, not per micro-batch (Megatron calls
``set_is_first_microbatch``, TE caches the fp8 weight and its transpose): 4 B per linear
parameter per step, under 0.1% of a step, not counted. Amax/scale updates are one fused
kernel per step (TE ``amax_and_scale_update``), also not counted.

Memory (TE delayed scaling with bf16 parameters, Megatron's default): every linear weight keeps
its bf16 master copy for the optimizer *and* an fp8 copy plus its fp8 transpose, cached for the
step (TE ``Float8Tensor`` weight workspace): +2 B per linear parameter on the device, sharded
like the weight. Scaling state: per fp8 GEMM, scale, inverse scale and an amax history of
:data:`AMAX_HISTORY_LEN` fp32 values for its input, weight and gradient. With fp8 parameter
storage (``--fp8-param-gather``) the weight lives only in fp8 (1 B + 1 B transpose = the bf16
2 B), so nothing is added. Activations are counted in bf16 as for bf16 training (TE also keeps
the bf16 norm outputs it recomputes from), so fp8 memory is never below bf16 memory.

The numbers above are the delayed-scaling recipe's; ``TrainSpec.fp8_recipe`` picks another
(current/tensorwise, blockwise, MXFP8, NVFP4), whose GEMM precision, cast traffic, weight copies
and scaling state come from :mod:`autopar.cost.fp8_recipe`, and which the device must support.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from autopar.cost import fp8_recipe
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs import ModelSpec

OPERANDS_PER_GEMM = 3  # input, weight, gradient: each has its scaling state


def gemm_precision(p: Problem, linear: bool) -> str:
    """Tensor-core precision of a GEMM: the recipe's (fp8, or fp4 for NVFP4) only for linear
    layers under fp8 training.

    Raises:
        AutoparError: the device cannot run the recipe (:func:`autopar.cost.fp8_recipe.check_device`),
            e.g. fp8 on an A100 or MXFP8 on an H100.
    """
    if p.train.precision != "fp8":
        return p.train.precision
    if not linear:
        return "bf16"
    fp8_recipe.check_device(p.cluster.device, p.train.effective_fp8_recipe)
    return fp8_recipe.recipe(p.train.effective_fp8_recipe).gemm_precision


def gemm_efficiency(p: Problem, linear: bool) -> float:
    """Achievable fraction of the tensor-core peak for a GEMM: the device's
    ``fp8_gemm_efficiency`` for fp8 GEMMs (falls back to ``gemm_efficiency`` when a device file
    leaves it unset), else ``gemm_efficiency``. fp8 GEMMs reach a lower fraction of their
    (doubled) peak than bf16 ones: the same HBM/L2 traffic per FLOP halves the arithmetic
    intensity headroom, Hopper promotes the fp8 accumulators through CUDA cores every few
    k-blocks, and an fp8 GEMM draws more power, so the clock throttles further under sustained
    load (see ``autopar.specs.cluster`` for the per-device values and their sources)."""
    dev = p.cluster.device
    if gemm_precision(p, linear) in ("fp8", "fp4") and dev.fp8_gemm_efficiency is not None:
        return dev.fp8_gemm_efficiency
    return dev.gemm_efficiency


def cast_bytes(p: Problem, m, k, count, linear: bool, norm_input: bool = False):
    """HBM traffic of quantising a GEMM's ``m x k`` input (0 when not in fp8): the recipe's bytes per
    element (:func:`autopar.cost.fp8_recipe.cast_bytes_per_element`; delayed scaling: read bf16 2 B,
    write fp8 and its transpose 1 B each).

    ``norm_input``: the input is a norm's output (the QKV and dense fc1 inputs). Under Megatron-LM
    these linears are Transformer Engine ``LayerNormLinear`` modules, whose norm kernel writes the
    quantised output itself when the recipe's scale is known before the tensor is complete
    (:attr:`~autopar.cost.fp8_recipe.Fp8Recipe.norm_fused_cast`: delayed scaling's scale from the
    amax history, the block recipes' local scales): no separate cast. Current (tensorwise) scaling
    and NVFP4 need the finished tensor's amax first, so the norm writes bf16 and the cast follows.
    torchtitan's float8 linears cast their input themselves."""
    if p.train.precision != "fp8" or not linear:
        return 0.0
    name = p.train.effective_fp8_recipe
    if norm_input and p.train.framework == "megatron" and fp8_recipe.recipe(name).norm_fused_cast:
        return 0.0
    return fp8_recipe.cast_bytes_per_element(name) * m * k * count


@lru_cache(maxsize=64)
def _linear_prefix(model: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefix sums over layers of TP-split linear, replicated linear (MLA down-projections) and
    routed-expert parameters. Norm weights, the router and biases are not fp8 GEMM weights; the
    TP bucket's column biases are negligible and counted as linear."""
    tp, rep, exp = [], [], []
    h = model.hidden_size
    mla_down = (h * model.q_lora_rank + h * (model.kv_lora_rank + model.qk_rope_head_dim)) if model.mla else 0
    for i in range(model.num_layers):
        lp = model.layer_params(i)
        tp.append(lp.tp)
        rep.append(mla_down)
        exp.append(lp.experts)
    cum = lambda xs: np.concatenate([[0.0], np.cumsum(np.asarray(xs, dtype=np.float64))])  # noqa: E731
    return cum(tp), cum(rep), cum(exp)


def linear_params(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Linear-layer parameters of the decoder layers on one device of each stage (embedding and
    output layer excluded: they are not fp8 GEMMs). Llama-2-7B unsharded: 6.476e9 (case C-11)."""
    dense, experts = linear_params_split(p, batch, stages)
    return dense + experts


def linear_params_split(p: Problem, batch: LayoutBatch, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """:func:`linear_params` as (dense, expert) parts: the TP-split linears over ``tp`` plus the
    replicated ones (MLA down-projections), and the routed experts' over ``ep * etp``. Shapes ``(n,)``."""
    tp, rep, exp = _linear_prefix(p.model)
    end = stages.start + stages.layers
    dense = (tp[end] - tp[stages.start]) / batch.tp + (rep[end] - rep[stages.start])
    return dense, (exp[end] - exp[stages.start]) / (batch.ep * batch.etp)


def extra_memory_bytes(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Bytes fp8 training adds on one device of each stage (module docstring): the recipe's cached
    weight copies (:attr:`~autopar.cost.fp8_recipe.Fp8Recipe.weight_copy_bytes` per linear
    parameter, none with ``fp8_param_storage``) and scaling state per GEMM operand, neither for the layers
    kept in bf16 (:mod:`autopar.cost.fp8_bf16_layers`); 0 for bf16/fp16."""
    if p.train.precision != "fp8":
        return np.zeros(len(batch))
    from autopar.cost import fp8_bf16_layers

    r = fp8_recipe.recipe(p.train.effective_fp8_recipe)
    fp8_params = linear_params(p, batch, stages) - fp8_bf16_layers.linear_params(p, batch, stages)
    copies = 0.0 if p.train.fp8_param_storage else r.weight_copy_bytes * fp8_params
    m = p.model
    attention = (5 if m.q_lora_rank else 4) if m.mla else 2  # linear modules (qkv/proj; MLA down/up/proj)
    mlp = 2 * (m.num_experts / batch.ep + (1 if m.shared_expert_ffn_hidden_size else 0) if m.is_moe else 1)
    fp8_layers = stages.layers - sum(fp8_bf16_layers.layer_counts(p, batch, stages))  # bf16 layers have no state
    return copies + OPERANDS_PER_GEMM * r.scaling_state_bytes * (attention + mlp) * fp8_layers
