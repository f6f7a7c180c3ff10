"""The pipeline split of a validation row where its source states it only by its framework's rules:
Narayanan et al.'s SC21 Table 1 runs (:func:`sc21_table1`), Megatron's embedding/loss accounting
(:func:`embedding_loss_split`) and torchtitan's pipeline split (:func:`torchtitan_pipeline`). Used by
:func:`autopar.validate.rows.strategy_of`.
"""

from __future__ import annotations

import numpy as np

from autopar.pipeline.layout import PipelineLayout
from autopar.validate.cells import Unscorable, required
from autopar.validate.measurements import Row

# Narayanan et al. Table 1 does not state mbs or interleaving; the paper's own launch script
# (Megatron-LM examples/sc21/run_table_1.sh) gives MBS and --num-layers-per-virtual-pipeline-stage
# per model size, keyed here by layer count.
SC21_TABLE1 = {30: (16, None), 40: (8, None), 60: (2, 5), 80: (2, 5), 96: (1, 3), 105: (1, 1), 128: (1, None)}


def sc21_table1(num_layers: int, pp: int, mbs: int | None, vpp: int | None,
                assumed: list[str]) -> tuple[int | None, int | None]:
    """(mbs, vpp) of a Narayanan et al. Table 1 row: the row's own, else the paper's launch script
    (:data:`SC21_TABLE1`: MBS and layers per virtual stage by layer count). A layer count the
    script does not list, or a chunking that does not split ``num_layers / pp``, leaves the
    knob to the generic default (mbs 1, vpp 1), recorded in ``assumed``."""
    if num_layers not in SC21_TABLE1:
        return mbs, vpp  # mbs=1 and vpp=1 are then recorded by strategy_of as generic defaults
    script_mbs, per_virtual = SC21_TABLE1[num_layers]
    from_script = []
    if mbs is None:
        mbs = script_mbs
        from_script.append(f"mbs={mbs}")
    if vpp is None:
        if per_virtual and num_layers % (pp * per_virtual):
            vpp = 1
            assumed.append(f"vpp=1 (run_table_1.sh's {per_virtual} layers per virtual stage do not split "
                           f"{num_layers} layers over pp={pp})")
        else:
            vpp = num_layers // (pp * per_virtual) if per_virtual else 1
            from_script.append(f"vpp={vpp}")
    if from_script:
        assumed.append(f"{', '.join(from_script)} (run_table_1.sh)")
    return mbs, vpp


def embedding_loss_split(num_layers: int, pp: int, vpp: int, assumed: list[str]) -> dict:
    """Megatron's embedding/loss-accounted split for an interleaved row whose layers do not
    split into whole chunks but ``L + 2`` does (Llama-3.1-405B: 126 layers, pp 8, vpp 8).
    NVIDIA's recipes for that layout set both switches: NeMo
    ``scripts/performance/llm/pretrain_llama31_405b.py`` (``account_for_embedding_in_pipeline_split``
    and ``account_for_loss_in_pipeline_split`` = True), which the dgxc-benchmarking 25.05 llama3.1
    and Megatron-LM examples/llama FP8 rows follow; Megatron would refuse the layout otherwise.
    Recorded in ``assumed`` (the rows do not state it). Empty when not needed."""
    if vpp == 1 or (num_layers % pp == 0 and (num_layers // pp) % vpp == 0) or (num_layers + 2) % (pp * vpp):
        return {}
    assumed.append("embedding and loss counted as pipeline layers (NeMo llama31_405b recipe)")
    return {"account_for_embedding": True, "account_for_loss": True}


def torchtitan_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage (model chunk) of torchtitan's default split, used when
    no ``pipeline_parallel_split_points`` are given (``parallelisms/pipelining_utils.py``
    ``generate_split_points``, 2024-12): the first and last stage get ``L // S`` layers, the
    middle stages one more while ``L % S`` lasts. Example: 126 layers, 8 stages: 15, 16 x 6, 15."""
    base, extra = divmod(num_layers, stages)
    middle = [base + 1 if i < extra else base for i in range(stages - 2)]
    return (base, *middle, num_layers - base - sum(middle))


def torchtitan_pipeline(row: Row, local_batch: int, pp: int, mbs: int | None, vpp: int | None,
                        assumed: list[str], mtp_num_layers: int = 0) -> tuple[int, int, dict]:
    """(mbs, vpp, split fields) of a torchtitan run with pp > 1 whose row leaves them unstated.

    torchtitan 2024-12 (the TT2412 benchmark commit 9dec370; ``pipelining_utils.py``): a
    multi-stage schedule (Interleaved 1F1B, named in the notes) gets 2 stages per rank
    (``generate_split_points``), and ``pipeline_parallel_microbatches`` defaults to
    ``pipeline_parallel_degree`` (``build_pipeline_schedule``; pytorch/torchtitan#781 changed it to
    pp * stages per rank only on 2025-01-07), so ``num_microbatches = pp`` and
    ``mbs = local_batch / pp``.
    The split is :func:`torchtitan_split`; with vpp 1 it is passed as ``layers_per_stage``, with
    vpp > 1 as Megatron's embedding/loss-accounted split where that is the same split, else as
    the :class:`~autopar.pipeline.layout.PipelineLayout` of its chunks (stage ``i`` on rank
    ``i % pp``, torchtitan's interleaved placement; ``mtp_num_layers`` of the model before the loss).

    Raises:
        Unscorable: the local batch is not a multiple of pp.
    """
    if vpp is None:
        vpp = 2 if "interleaved" in row["notes"].lower() else 1
        assumed.append(f"vpp={vpp} (torchtitan default stages per rank)")
    if mbs is None:
        if local_batch % pp:
            raise Unscorable(f"local batch {local_batch} is not a multiple of pp = {pp} "
                             "(torchtitan's default micro-batch count)")
        mbs = local_batch // pp
        assumed.append(f"mbs={mbs} (torchtitan 2024-12 default: pp micro-batches)")
    layers = required(row, "layers", "torchtitan's pipeline split needs it")
    chunks = torchtitan_split(layers, pp * vpp)
    if vpp == 1:
        return mbs, vpp, {"layers_per_stage": chunks} if len(set(chunks)) > 1 else {}
    slots = (layers + 2) // (pp * vpp)
    accounted = (slots - 1,) + (slots,) * (pp * vpp - 2) + (slots - 1,)
    if (layers + 2) % (pp * vpp) == 0 and chunks == accounted:
        return mbs, vpp, {"account_for_embedding": True, "account_for_loss": True}
    decoder = np.asarray(chunks, dtype=np.int64).reshape(vpp, pp).T  # [rank, chunk]
    return mbs, vpp, {"pipeline_layout": PipelineLayout.from_chunks(decoder, mtp_num_layers).megatron()}
