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


def data_parallel_of(row: Row, family: Family, num_layers: int, hidden_size: int,
                     assumed: list[str]) -> tuple[bool, str]:
    """(``TrainSpec.overlap_grad_reduce``, ``TrainSpec.grad_dtype``) of the row: the family's
    (overlap as :attr:`Family.dp_overlap`, fp32 main gradients), except SC'21 Table 1 rows whose
    launch script runs PyTorch DDP (:data:`SC21_TABLE1_TORCH_DDP`, ``--DDP-impl torch``; matched by
    layer count and hidden size). Megatron-LM's
    schedule (2021, ``schedules.py`` ``forward_backward_no_pipelining``) runs all micro-batches but
    the last inside ``model.no_sync()``, so torch DDP all-reduces its gradient buckets during the
    last micro-batch's backward, in the 16-bit dtype of the wrapped fp16/bf16 module's gradients
    (2 B: ``grad_dtype='bf16'``). Recorded in ``assumed``."""
    if family.name == "megatron-2021" and row.id.startswith("NAR21-T1") \
            and (num_layers, hidden_size) in SC21_TABLE1_TORCH_DDP:
        assumed.append("DDP=torch (run_table_1.sh): 16-bit gradients all-reduced during the last backward")
        return True, "bf16"
    return family.dp_overlap, "fp32"
