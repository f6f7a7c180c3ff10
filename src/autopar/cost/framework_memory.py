"""Memory that depends on the training framework (``TrainSpec.framework``), in bytes.

Megatron-LM is the reference (:mod:`autopar.cost.memory`); the other frameworks hold different
model-state buffers, save different tensors under "selective" recompute and compute the loss
differently. Every rule below holds for any model trained with that framework.

**Model states** (bytes per parameter; "/N" = sharded by the ZeRO rule of
:func:`autopar.cost.memory.model_state_bytes`):

=========== ======================================= ========== ============== =========
framework   optimizer                               weights    gradients      optimizer
=========== ======================================= ========== ============== =========
megatron    distributed optimizer                   2          grad_dtype (4) 12 (*)
deepspeed   BF16_Optimizer (bf16, ZeRO 0/1)         2          2 + 4 (full)   12
deepspeed   ZeRO optimizer (fp16, or ZeRO >= 2)     2          2              12
torchtitan  FSDP2, fp32 params, bf16 compute        4          4              8
=========== ======================================= ========== ============== =========

(*) Megatron: master weight + Adam m + v in ``main_params_dtype`` / ``exp_avg_dtype`` /
``exp_avg_sq_dtype`` (precision-aware optimizer, :class:`autopar.specs.train.TrainSpec`;
12 B when all are fp32, 8 B with DeepSeek-V3's bf16 moments), times the share not offloaded to
the host (:func:`autopar.cost.offload.device_optimizer_fraction`).

* DeepSpeed ``deepspeed/runtime/bf16_optimizer.py`` (``BF16_Optimizer._setup_for_real_optimizer``):
  the bf16 weights live in one flat buffer, the fp32 gradient accumulation buffer
  ``fp32_groups_gradients_flat`` is allocated at the size of the *whole* flat buffer (only its
  partition feeds the optimizer), the fp32 master partition and Adam m, v are 12/N; the bf16
  ``.grad`` of every parameter (2 B) is only released by ``clear_lp_grads`` before the next
  backward, so it is alive at the backward peak too.
* DeepSpeed ``deepspeed/runtime/zero/stage_1_and_2.py`` (``DeepSpeedZeroOptimizer``, fp16 and
  ZeRO-2): gradients stay in the 16-bit dtype (``param.grad``; partitioned with ZeRO-2), the fp32
  master partition and Adam m, v are 12/N; the fp32 gradient partition it builds in ``step()`` is
  freed before the next forward, when no activations are held.
* torchtitan ``parallelize_llama.py`` ``apply_fsdp`` with ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``: the model is built in fp32, so the sharded parameter *is* the fp32 master
  (4/N), its sharded gradient is fp32 (4/N) and AdamW's m, v are 8/N; bf16 copies exist only for
  the gathered modules (:func:`unsharded_param_bytes`).

**torchtitan FSDP2 + pipeline parallelism** (``parallelize_llama.py`` ``apply_fsdp`` of 2024-12:
"For PP, do not reshard after forward to avoid per-microbatch all-gathers", every block and the
root get ``reshard_after_forward=False``; PyTorch ``pipelining/stage.py``
``backward_maybe_with_nosync``: every backward but the last runs with
``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``, and FSDP2's
``FSDPParam.to_accumulated_grad_if_needed`` keeps the unsharded gradient in ``reduce_dtype``
fp32): from a stage's first forward to its last backward the whole stage is held gathered in bf16
(2 B/param) and its gradients accumulate unsharded in fp32 (4 B/param); the sharded fp32 states
(4 + 4 + 8)/N stay as without PP (:func:`pipeline_fsdp_bytes`).

**torchtitan selective recompute** is per-op SAC (``selective_ac_option = 'op'``, torchtitan
``parallelize_llama.py`` ``_save_list`` and ``_custom_policy``), not Megatron's core-attention
recompute: inside each decoder layer the outputs of every *odd* ``aten.mm`` (1st, 3rd, ...), of
SDPA (output and fp32 log-sum-exp) and of every ``reduce_scatter_tensor`` are saved, everything
else is recomputed from the layer input (:func:`op_sac_layer_bytes`).

**torchtitan loss** (``model.py`` ``self.output(h).float()``, ``train.py`` ``cross_entropy(pred
.float())`` then ``del pred`` before backward): the full-vocabulary logits exist in fp32; at the
start of backward the fp32 log-softmax output (saved), the dense fp32 ``nll_loss`` gradient and
the fp32 log-softmax input gradient are alive at once: 12 bytes per logit
(:func:`output_bytes`), over the vocabulary shard with loss parallel (tp > 1).

Units: bytes. Shapes: arrays broadcast with the ``LayoutBatch`` columns.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import activations as act
from autopar.cost import offload
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

BF16 = 2  # bytes of a 16-bit weight, gradient or activation element
FP32 = 4
ADAM_MOMENTS_BYTES = 8  # fp32 m + v
MASTER_AND_ADAM_BYTES = 12  # fp32 master weight + Adam m + v
TORCHTITAN_LOSS_BYTES_PER_LOGIT = 12  # fp32 log-softmax output + nll grad + log-softmax grad
# Memory a Megatron-DeepSpeed (2022, torch 1.11) process holds per byte of live tensors, beyond
# them and the CUDA context: the caching allocator's cached-but-free blocks (no expandable
# segments; the 16-bit weights are copied into flat buffers at start, non-flash attention scores
# and full-recompute churn leave fixed-size blocks) and NCCL buffers. BLOOM's sweep reports
# nvidia-smi memory (bigscience tr11-176B-ml/chronicles-prequel.md: "checking the actual GPU
# allocations (nvidia-smi)"); the value is the least-squares relative fit of nvidia-smi over the
# live tensors predicted here on its 12 memory rows (02-25 and 02-28 tables, 29-76 GB), which
# the same document's ZeRO-0 vs ZeRO-1 pair (72 vs 37 GB, 02-21) also supports (x1.5-1.6).
DEEPSPEED_ALLOCATOR_RESERVE_FRACTION = 0.30


def state_bytes_per_param(p: Problem, zero) -> tuple:
    """(weight, gradient, unsharded gradient, optimizer) bytes per parameter before sharding,
    per the table in the module docstring; ``zero`` is the ZeRO stage (int or array).

    The unsharded gradient bytes are held in full whatever the ZeRO stage (DeepSpeed
    BF16_Optimizer's fp32 accumulation buffer). Example: DeepSpeed bf16 with ZeRO-1 over N = 8
    ranks: 2 + 2 + 4 + 12/8 = 9.5 B/param; Megatron: 2 + 4 + 12/8 = 7.5 B/param; Megatron with bf16
    main gradients, bf16 moments and half the shard offloaded: 2 + 2 + (4 + 2 + 2) * 0.5 / 8 =
    4.5 B/param.
    """
    zero = np.asarray(zero)
    fw = p.train.framework
    if fw == "torchtitan":
        return FP32, FP32, np.zeros(zero.shape), ADAM_MOMENTS_BYTES
    if fw == "deepspeed":
        bf16_optimizer = (p.train.precision == "bf16") & (zero <= 1)
        return BF16, BF16, np.where(bf16_optimizer, FP32, 0), MASTER_AND_ADAM_BYTES
    optimizer = p.train.optimizer_bytes_per_param * offload.device_optimizer_fraction(p)
    return BF16, p.train.grad_bytes, np.zeros(zero.shape), optimizer


def op_sac(p: Problem) -> bool:
    """Whether ``recompute='selective'`` means torchtitan's per-op SAC (else Megatron's)."""
    return p.train.framework == "torchtitan"


def op_sac_layer_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Bytes one dense (non-MLA) decoder layer saves per micro-batch under torchtitan's per-op SAC.

    With ``n`` local tokens (seq/cp x mbs), ``t`` = tp, ``h`` hidden, ``f`` FFN width: the layer
    input (``2*n*h``, SP-sharded), the odd matmuls of the order wq, wk, wv, wo, w1, w3, w2
    (gated) or wq, wk, wv, wo, fc1, fc2: ``wq`` (``n*q/t``), ``wv`` (``n*kv/t``), ``w1``/``fc1``
    (``n*f/t``) and, gated only, ``w2`` (its row-parallel partial output, ``n*h``); SDPA's output
    (``n*v/t``) and fp32 log-sum-exp (``4*n*heads/t``); with SP the two reduce-scatter outputs
    (``2 * n*h/t``). Example: Llama-3-8B, 16384 tokens, tp 1: 2*(4096 + 4096 + 1024 + 4096 + 14336
    + 4096) + 4*32 = 63616 B/token, 1.042e9 B per layer (Megatron selective keeps 139392 B/token).
    """
    m = p.model
    n = act._tokens(p, batch)
    t = batch.tp
    h = m.hidden_size
    elements = h / act._sp_shard(batch) + (m.q_width + m.kv_width + m.ffn_hidden_size) / t + m.v_width / t
    if m.gated_mlp:
        elements = elements + h  # w2 is the 7th matmul
    elements = elements + np.where(batch.sp & (t > 1), 2 * h / t, 0.0)
    return n * (BF16 * elements + FP32 * m.num_attention_heads / t)


def output_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Last stage, per micro-batch: final-norm and output-layer inputs plus the loss's logits.

    Megatron: :func:`autopar.cost.activations.output_bytes` (fp32 logits, ``4*n*V/t``).
    torchtitan: ``2*2*n*h`` (SP-sharded) plus ``12*n*V/t`` (module docstring), ``V`` unpadded.
    Example: Llama-3-8B, 16384 tokens, tp 1: 12 * 16384 * 128256 = 25.2e9 bytes of logits.
    """
    if p.train.framework != "torchtitan":
        return act.output_bytes(p, batch)
    n = act._tokens(p, batch)
    inputs = 2 * BF16 * n * p.model.hidden_size / act._sp_shard(batch)
    return inputs + TORCHTITAN_LOSS_BYTES_PER_LOGIT * n * p.model.vocab_size / batch.tp


def pipeline_fsdp_bytes(p: Problem, batch: LayoutBatch, stage_params) -> np.ndarray:
    """torchtitan FSDP2 with pp > 1: the stage's parameters held gathered in bf16 plus their
    unsharded fp32 gradient accumulation, ``(2 + 4) * stage_params`` bytes (module docstring).

    ``stage_params``: parameters on one device of the stage (elements, embedding/output included
    on the first/last stage). Zero unless ``framework == 'torchtitan'``, ``zero >= 3`` and pp > 1.
    Example: a 1e9-parameter stage -> 6e9 bytes, on top of the (4 + 4 + 8)/N sharded states.
    """
    held = (BF16 + FP32) * np.asarray(stage_params, dtype=np.float64)
    on = (p.train.framework == "torchtitan") & (batch.zero >= 3) & (batch.pp > 1)
    return np.where(on, held, 0.0)


def unsharded_param_bytes(p: Problem, batch: LayoutBatch, layer_max, first, last, stage_params=0.0) -> np.ndarray:
    """ZeRO-3 / FSDP parameters gathered in the compute dtype at the peak (bytes).

    Megatron/DeepSpeed: the current and the prefetched layer, ``2 * 2 * layer_max``.
    torchtitan (``apply_fsdp``): the same two blocks, plus the root module (token embedding,
    final norm, output layer), re-gathered when backward starts, i.e. at the loss peak: ``2 *
    V*h/tp`` each for the embedding and the output layer; with pp > 1 instead the whole stage and
    its fp32 gradient accumulation (:func:`pipeline_fsdp_bytes` of ``stage_params``, elements).
    Zero where ``zero < 3``.
    """
    layers = 2 * BF16 * np.asarray(layer_max, dtype=np.float64)
    if p.train.framework == "torchtitan":
        m = p.model
        vocab = m.vocab_size * m.hidden_size / batch.tp
        root = np.where(first, vocab, 0.0) + np.where(last & ~(first & m.tie_word_embeddings), vocab, 0.0)
        layers = np.where(batch.pp > 1, pipeline_fsdp_bytes(p, batch, stage_params), layers + BF16 * root)
    return np.where(batch.zero >= 3, layers, 0.0)


def allocator_reserve_bytes(p: Problem, tensor_bytes) -> np.ndarray:
    """Memory the process holds beyond its live tensors and the device's
    ``framework_overhead_bytes`` (CUDA context), as a fraction of the live tensor bytes.

    DeepSpeed: :data:`DEEPSPEED_ALLOCATOR_RESERVE_FRACTION` (see there). Megatron-LM and
    torchtitan: 0 (Megatron's own ``theoretical_memory_usage.py`` has none; torchtitan's launch
    script sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, which maps freed pages back
    into one growing segment instead of caching fixed blocks).
    Example: DeepSpeed, 40 GiB of tensors -> 0.30 * 40 = 12 GiB.
    """
    fraction = DEEPSPEED_ALLOCATOR_RESERVE_FRACTION if p.train.framework == "deepspeed" else 0.0
    return fraction * np.asarray(tensor_bytes, dtype=np.float64)


def backward_transient_bytes(p: Problem, working, output) -> np.ndarray:
    """The last stage's loss/logits bytes (``output``) together with the layer that full recompute
    rebuilds in backward (``working``), per (layout, stage) row.

    Megatron: their sum, as ``theoretical_memory_usage.py`` adds the logits to the activations.
    torchtitan: the larger of the two, since the 12 B per logit of the loss backward are freed
    (cast to the bf16 logits gradient, then consumed by the output layer) before the first
    decoder layer is recomputed. Example: working 4.25 GiB, output 47 GiB -> 47 GiB, not 51.25.
    """
    if p.train.framework == "torchtitan":
        return np.maximum(working, output)
    return np.asarray(working) + np.asarray(output)
