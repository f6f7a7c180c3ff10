"""Transformer Engine userbuffers settings of the published Megatron/NeMo runs with TP comm overlap
(``TrainSpec.userbuffers``, :mod:`autopar.specs.userbuffers`; costs :mod:`autopar.cost.userbuffers_sm`).

Where the run's recipe states ``ub_tp_comm_overlap_cfg`` it is used as written:

* dgxc-benchmarking v24.11.1 (commit 35a9aec, NeMo 24.05/24.09 YAML configs):
  ``llama3.1/llama3.1_70b.yaml``, ``llama3.1/llama3.1_405b.yaml``,
  ``nemo_megatron/gpt3_175b_hydra.yaml`` (bf16 and fp8 alike: ``configure.sh`` overrides only
  ``fp8_buf``); ``nemotron/nemotron4-{15b,340b}-synth.yaml`` state none;
* dgxc-benchmarking v25.05.04 (commit 1f6d9f4; ``*/setup.sh`` pins NeMo commit 6f2c6fd, "r2.3.0
  llmb-nemo", in the nemo:25.04.00 container) runs NeMo's ``scripts/performance/llm/pretrain_*.py``,
  which take ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``: Llama 3.1 405B
  ``userbuffers_{bf16,fp8}_{h100_h16384_tp8,b200_h16384_tp4}_cp2_mbs1_seqlen8192`` (GB200 uses the
  b200 ones), Nemotron-4 340B on B200/GB200 ``userbuffers_{bf16,fp8}_b200_h18432_tp8_mbs1_seqlen4096``,
  Grok-1 ``userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192`` on every GPU and dtype;
  Nemotron-4 340B and 15B on H100 set none (TE's defaults: NeMo v2.3.0 ``requirements/manifest.json``
  pins TE bee4649 of 2025-03-18, after TE 2.0);
* NeMo 24.07 performance summary (``NEMO2407-*``): NeMo-Framework-Launcher tag 24.07
  ``launcher_scripts/conf/training/{gpt3/20b,gpt3/175b,llama/llama3_70b}.yaml`` name
  ``tp_overlap/ub_cfg_h100_{h6144_tp2_mbs2_seqlen2048,h12288_tp4_mbs1_seqlen2048,h8192_tp4_mbs1_seqlen8192}``;
  the Nemotron 8B/22B/340B configs name none;
* Megatron-Bridge v0.2.0 (25.11) ``scripts/performance/configs/llama3{,1}/*_llm_pretrain.py``: H100 FP8
  Llama 3 70B ``userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192``, Llama 3.1 405B
  ``userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192`` (``training/comm_overlap.py``);
* Megatron-LM ``examples/llama/README.md`` "FP8 Performance" (2025-06, its rows' notes: "configs
  follow NeMo performance scripts"): the same two NeMo configs.

Without a stated config TE's defaults of the run's TE release apply: TE 1.x
(:data:`~autopar.specs.userbuffers.TE1_DEFAULTS`) for runs before 2025 (Megatron-LM's 2024 README
table, NeMo 24.x), TE >= 2.0 (:data:`~autopar.specs.userbuffers.TE2_DEFAULTS`) for 2025 releases
(NeMo 25.04, Megatron-Bridge 25.09/25.11; TE 2.0 is of 2025-02-12).
"""

from __future__ import annotations

from autopar.specs.userbuffers import TE1_DEFAULTS, TE2_DEFAULTS, UbGemm, Userbuffers
from autopar.validate.measurements import Row

_NAMES = ("proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")


def _ub(spec: str) -> Userbuffers:
    """``"p24 p16 b4 b24 b2 b4"`` in :data:`_NAMES` order: ``p``/``b`` pipeline/bulk with ``num_sm``
    (set_sm_margin on for pipeline, off for bulk, as every config below writes it), ``r`` ring
    exchange with ``num_sm`` 1 and set_sm_margin on (NeMo's ``RingExchangeOverlapCfg(num_sm=1,
    set_sm_margin=True)``)."""
    methods = {"p": ("pipeline", True), "b": ("bulk", False), "r": ("ring_exchange", True)}
    gemms = {}
    for name, item in zip(_NAMES, spec.split(), strict=True):
        method, margin = methods[item[0]]
        gemms[name] = UbGemm(method=method, num_sm=int(item[1:]), set_sm_margin=margin)
    return Userbuffers(**gemms)


#: (row id prefix, source, settings); the first matching prefix applies.
RECIPES: tuple[tuple[str, str, Userbuffers], ...] = (
    ("DGXC2411-L70B-", "dgxc 24.11.1 llama3.1_70b.yaml", _ub("p24 p16 b4 b24 b2 b4")),
    ("DGXC2411-L405B-", "dgxc 24.11.1 llama3.1_405b.yaml", _ub("p24 p8 b2 b24 b2 b2")),
    ("DGXC2411-G175B-", "dgxc 24.11.1 gpt3_175b_hydra.yaml", _ub("p24 p20 b4 b8 b2 b4")),
    ("DGXC2505-L405B-H100-BF16", "NeMo 6f2c6fd userbuffers_bf16_h100_h16384_tp8_cp2", _ub("p24 p8 b2 b24 b2 b2")),
    ("DGXC2505-L405B-H100-FP8", "NeMo 6f2c6fd userbuffers_fp8_h100_h16384_tp8_cp2", _ub("r1 r1 b2 b24 b2 b2")),
    ("DGXC2505-L405B-GB200-BF16", "NeMo 6f2c6fd userbuffers_bf16_b200_h16384_tp4_cp2", _ub("p32 p8 b8 b24 b2 b2")),
    ("DGXC2505-L405B-GB200-FP8", "NeMo 6f2c6fd userbuffers_fp8_b200_h16384_tp4_cp2", _ub("r1 r1 b8 b32 b2 b8")),
    ("DGXC2505-N340B-GB200-SS-BF16", "NeMo 6f2c6fd userbuffers_bf16_b200_h18432_tp8", _ub("r1 p24 b8 b32 b2 b8")),
    ("DGXC2505-N340B-GB200-SS-FP8", "NeMo 6f2c6fd userbuffers_fp8_b200_h18432_tp8", _ub("r1 r1 b8 b32 b2 b8")),
    ("DGXC2505-N340B-GB200-BF16", "NeMo 6f2c6fd userbuffers_bf16_b200_h18432_tp8", _ub("r1 p24 b8 b32 b2 b8")),
    ("DGXC2505-GROK1-", "NeMo 6f2c6fd pretrain_grok1_314b.py userbuffers_fp8_b200_h16384_tp4_cp2", _ub("r1 r1 b8 b32 b2 b8")),
    ("NEMO2407-02", "NeMo-Framework-Launcher 24.07 ub_cfg_h100_h6144_tp2_mbs2_seqlen2048", _ub("p16 p24 b8 b16 b4 b16")),
    ("NEMO2407-03", "NeMo-Framework-Launcher 24.07 ub_cfg_h100_h12288_tp4_mbs1_seqlen2048", _ub("p24 p20 b4 b8 b2 b4")),
    ("NEMO2407-12", "NeMo-Framework-Launcher 24.07 ub_cfg_h100_h8192_tp4_mbs1_seqlen8192", _ub("p24 p16 b4 b24 b2 b4")),
    ("MBR-2511-H100-2", "Megatron-Bridge v0.2.0 userbuffers_fp8_h100_h8192_tp4", _ub("r1 r1 b4 b24 b2 b4")),
    ("MBR-2511-H100-3", "Megatron-Bridge v0.2.0 userbuffers_fp8_h100_h16384_tp8_cp2", _ub("r1 r1 b2 b24 b2 b2")),
    ("MLM-LLAMA-FP8-2", "NeMo performance scripts' userbuffers_fp8_h100_h8192_tp4", _ub("r1 r1 b4 b24 b2 b4")),
    ("MLM-LLAMA-FP8-3", "NeMo performance scripts' userbuffers_fp8_h100_h16384_tp8_cp2", _ub("r1 r1 b2 b24 b2 b2")),
)

#: Row id prefixes of 2025 releases (TE >= 2.0) among those without a stated config.
TE2_PREFIXES = ("DGXC2505", "MBR")


def userbuffers_of(row: Row) -> tuple[Userbuffers, str]:
    """(settings, where they come from) for a row run with Megatron's TP comm overlap (module
    docstring)."""
    for prefix, source, ub in RECIPES:
        if row.id.startswith(prefix):
            return ub, source
    if row.id.startswith(TE2_PREFIXES):
        return TE2_DEFAULTS, "TE >= 2.0 defaults (no config in the recipe)"
    return TE1_DEFAULTS, "TE 1.x defaults (no config in the recipe)"


def describe(ub: Userbuffers) -> str:
    """Short text of ``ub`` for a row's ``assumed`` list: ``proj_fprop pipeline 24 SMs margin, ...``."""
    return ", ".join(f"{name} {getattr(ub, name).method} {getattr(ub, name).num_sm}"
                     + (" margin" if getattr(ub, name).set_sm_margin else "") for name in _NAMES)
