"""torchtitan's float8 tensor parallelism: all-gathers in fp8, input casts on the sequence shard.

With float8 tensorwise training (torchao ``Float8Linear``, dynamic tensorwise scaling) and
tensor parallelism, torchtitan's releases of 2024-12 to 2025 shard their linears with torchao's ``Float8ColwiseParallel`` /
``Float8RowwiseParallel`` and prepares the attention and MLP inputs with
``PrepareFloat8ModuleInput`` (torchtitan ``parallelize_llama.py`` ``apply_tp``, 2024-12 onwards;
torchao ``float8/float8_tensor_parallel.py``: "Like ``ColwiseParallel``, but with all-gather in
float8"). Per decoder layer with sequence parallelism:

* forward: the norm output is cast to fp8 *on the sequence shard* and the all-gather moves the
  fp8 tensor (1 B per element); the row-parallel outputs are reduce-scattered in bf16;
* backward: ``_NoopFwToFloat8BwDynamic`` after the row-parallel output's redistribute casts the
  incoming gradient to fp8 before the backward of that reduce-scatter, an all-gather of ``dY``,
  runs: that all-gather moves fp8 too; the input-gradient reduce-scatters stay bf16 (they carry
  the data-gradient GEMM's bf16 output);
* per-op selective recompute repeats the forward all-gathers (:mod:`autopar.cost.recompute`):
  fp8 as well.

So every TP all-gather of a layer costs half its bf16 bytes and every reduce-scatter its full
bytes (:func:`layer_pair_s`). The embedding and output layer are not float8 linears: their
collectives stay bf16. (The QKV / fc1 input casts then run on the ``tokens / tp`` rows of the
shard; :mod:`autopar.cost.fp8` still costs them on the gathered rows: with that change alone the
torchtitan fp8 rows of the validation set moved from -3 % to +5..+18 %, so the cast cost of the
compiled float8 path needs its own study first.) Megatron-LM / Transformer Engine gather bf16 activations (TE quantises after
the gather, or inside userbuffers' bf16 buffers), so this applies to torchtitan only.

torchtitan 0.2.2, the release ``autopar export --format torchtitan`` writes for, gathers in bf16: its
``apply_tp`` is asked for the float8 styles only when ``"float8" in job_config.model.converters``
(``models/llama3/infra/parallelize.py``), and its float8 converter is registered as
``quantize.linear.float8`` (``components/quantization/float8.py``); so ``TrainSpec.float8_tp_gather``
is off by default and on for the validation rows of the earlier releases.

Units: seconds, arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm, placement
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

FP8_BYTES = 1


def applies(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Layouts whose layer TP all-gathers move fp8: torchtitan with ``TrainSpec.float8_tp_gather`` (its
    2024-12 to 2025 releases; not 0.2.2, see the field), fp8 training with the tensorwise recipe, tp > 1
    with sequence parallelism (torchtitan always pairs TP with SP). Shape ``(n,)``."""
    train = p.train
    on = (train.framework == "torchtitan" and train.float8_tp_gather and train.precision == "fp8"
          and train.effective_fp8_recipe == "tensorwise")
    return np.asarray(on & np.asarray(batch.sp, dtype=bool) & (batch.tp > 1), dtype=bool)


def _gather_s(p: Problem, batch: LayoutBatch, bf16_bytes: np.ndarray) -> np.ndarray:
    """One layer all-gather of the ``bf16_bytes`` activation at the dtype it travels in."""
    fp8_bytes = bf16_bytes * FP8_BYTES / F.BF16
    return comm.all_gather_s(p, np.where(applies(p, batch), fp8_bytes, bf16_bytes), batch.tp, placement.tp_stride(batch))


def layer_pair_s(p: Problem, batch: LayoutBatch, act_bytes: np.ndarray, one_collective_s: np.ndarray) -> np.ndarray:
    """Seconds of one all-gather + reduce-scatter pair of a decoder layer's TP collectives.

    Args:
        act_bytes: the bf16 ``s/cp * b * h`` activation of one micro-batch (bytes).
        one_collective_s: its bf16 all-reduce (:func:`autopar.cost.comm.all_reduce_s`), returned
            unchanged where :func:`applies` is false.

    Where it applies: an fp8 all-gather of ``act_bytes / 2`` plus a bf16 reduce-scatter of
    ``act_bytes``. Example (test): tp 8 on one node, 1 GB activation, no latency: the bf16 pair
    is 2 x 7/8 GB over the bus, the fp8 pair 7/16 + 7/8 GB, i.e. 0.75 of it.
    """
    rs = comm.reduce_scatter_s(p, act_bytes, batch.tp, placement.tp_stride(batch))
    return np.where(applies(p, batch), _gather_s(p, batch, act_bytes) + rs, one_collective_s)


def recompute_gathers_s(p: Problem, batch: LayoutBatch, act_bytes: np.ndarray, one_collective_s: np.ndarray) -> np.ndarray:
    """Seconds of the two forward all-gathers (attention and MLP input) torchtitan's per-op SAC
    repeats per layer (:func:`autopar.cost.recompute.extra_tp_collectives` counts them as one
    pair's worth): two fp8 all-gathers where :func:`applies`, else ``one_collective_s``."""
    return np.where(applies(p, batch), 2 * _gather_s(p, batch, act_bytes), one_collective_s)

