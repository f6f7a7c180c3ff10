"""Transformer Engine userbuffers settings of the GEMMs that can share their SMs with a
communication kernel under Megatron's ``--tp-comm-overlap`` (``TrainSpec.userbuffers``; costs:
:mod:`autopar.cost.userbuffers_sm`).

TE's ``initialize_ub`` (``transformer_engine/pytorch/module/base.py``) registers one communicator
per overlapped GEMM of a transformer layer, each with an overlap ``method`` and ``num_sm`` /
``set_sm_margin``:

* ``ring_exchange`` (AG+GEMM ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``, ``fc2_dgrad`` by default):
  peer-to-peer chunk copies on the copy engine (``use_ce`` True), no SM taken; these four keep
  ``set_sm_margin`` False in every TE default and every recipe autopar reads, so they are not
  listed here;
* ``pipeline`` (GEMM+RS ``proj_fprop``, ``fc2_fprop``): the GEMM in ``num_splits`` chunks, each
  chunk's reduce-scatter a userbuffers kernel on ``num_sm`` SMs;
* ``bulk`` (``qkv_dgrad`` / ``fc1_dgrad``: the input all-gather for the weight gradient under the
  data-gradient GEMM; ``qkv_wgrad`` / ``fc1_wgrad``: the data-gradient reduce-scatter under the
  weight-gradient GEMM): one userbuffers kernel on ``num_sm`` SMs beside the whole GEMM.

``set_sm_margin`` (``comm_gemm_overlap.cpp`` ``CommOverlapCore::initialize``:
``_math_sms = set_sm_margin ? sm_count - num_comm_sm : sm_count``, passed to every GEMM of the
overlap as cuBLAS's SM-count target) runs the GEMM on ``sm_count - num_sm`` SMs throughout;
without it the GEMM is launched on all SMs and only loses the ones the communication kernel holds
while it runs.

Defaults by TE version (``get_default_config`` / ``add_ub`` in ``module/base.py``):

* TE 1.x (v1.5 2024-04 to v1.13 2024-12): ``num_sm`` 16 for ``pipeline`` and ``bulk``,
  ``set_sm_margin`` 0 (:data:`TE1_DEFAULTS`);
* TE >= 2.0 (v2.0, 2025-02-12, unchanged to v2.18): ``num_sm`` 16 and
  ``"set_sm_margin": not method == "ring_exchange"`` (:data:`TE2_DEFAULTS`, the default of
  :class:`autopar.specs.train.TrainSpec`).

Recipes state their own (NeMo ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``,
dgxc-benchmarking's ``ub_tp_comm_overlap_cfg``); :mod:`autopar.validate.ub_recipes` holds the ones
of the published runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

UbMethod = Literal["ring_exchange", "pipeline", "bulk"]


class UbGemm(BaseModel):
    """One overlapped GEMM's userbuffers setting (TE ``ub_cfgs[name]``): ``method``, ``num_sm``
    (SMs of its communication kernel; 0 with the copy engine) and ``set_sm_margin`` (the GEMM
    itself launched on ``sm_count - num_sm`` SMs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: UbMethod
    num_sm: int = Field(ge=0, le=1024)
    set_sm_margin: bool


class Userbuffers(BaseModel):
    """Settings of the six GEMMs whose overlap can run a communication kernel on SMs (module
    docstring): the forward of the row-parallel linears (``proj_fprop``, ``fc2_fprop``) and the
    backward of the column-parallel ones (``qkv_dgrad``/``qkv_wgrad``, ``fc1_dgrad``/``fc1_wgrad``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proj_fprop: UbGemm
    fc2_fprop: UbGemm
    qkv_dgrad: UbGemm
    qkv_wgrad: UbGemm
    fc1_dgrad: UbGemm
    fc1_wgrad: UbGemm


def _defaults(margin: bool) -> Userbuffers:
    def ub(method: UbMethod) -> UbGemm:
        return UbGemm(method=method, num_sm=16, set_sm_margin=margin)
    return Userbuffers(proj_fprop=ub("pipeline"), fc2_fprop=ub("pipeline"), qkv_dgrad=ub("bulk"),
                       qkv_wgrad=ub("bulk"), fc1_dgrad=ub("bulk"), fc1_wgrad=ub("bulk"))


#: TE 1.x ``initialize_ub`` without a config: ``num_sm`` 16, ``set_sm_margin`` 0 (v1.5-v1.13 ``add_ub``).
TE1_DEFAULTS = _defaults(margin=False)
#: TE >= 2.0 ``initialize_ub`` without a config: ``num_sm`` 16, ``set_sm_margin`` on for pipeline and bulk.
TE2_DEFAULTS = _defaults(margin=True)
