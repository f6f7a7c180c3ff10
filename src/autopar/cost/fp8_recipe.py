"""Low-precision recipes of fp8 training: which device runs which, and what each adds in memory
and time over bf16 (``TrainSpec.fp8_recipe``; :mod:`autopar.cost.fp8` applies them).

Recipes (Transformer Engine 2.x ``common/recipe/__init__.py``; Megatron-LM core_v0.15
``--fp8-recipe {delayed, tensorwise, mxfp8, blockwise}`` and ``--fp4-format e2m1 --fp4-recipe nvfp4``;
NVIDIA "Using FP8 and FP4 with Transformer Engine" user guide):

| recipe | GEMMs | scales | cached weight copies per linear parameter | device |
| --- | --- | --- | --- | --- |
| delayed | fp8 (E4M3/E5M2) | per tensor, from a 1024-step amax history | fp8 + its transpose: 2 B | fp8 |
| tensorwise (current) | fp8 | per tensor, this step's amax (one more read) | 2 B | fp8 |
| blockwise | fp8 | fp32 per 1x128 activation tile, 128x128 weight block | 2 B + fp32 per block | fp8, NVIDIA |
| mxfp8 | fp8, block-scaled | E8M0 per 32 elements | rowwise + columnwise 2 B + 2/32 B | block-scaled (Blackwell, CDNA4) |
| nvfp4 | fp4 (E2M1) | E4M3 per 16 elements + fp32 per tensor | 2 x (0.5 + 1/16) = 1.125 B | fp4, NVIDIA (Blackwell) |

* **Device.** The fp8 recipes need an fp8 peak (A100 has none). MXFP8 and NVFP4 need block-scaled
  tensor-core instructions, which came with the fp4 tensor cores (Blackwell's ``tcgen05.mma``
  ``kind::mxf8f6f4`` / ``kind::mxf4nvf4``; AMD CDNA4's MX formats): a device with an ``fp4``
  peak. NVFP4 is NVIDIA's format (vendor ``nvidia``); TE's ``Float8BlockScaling`` (DeepSeek-V3's
  blocks) is a Transformer Engine recipe for NVIDIA GPUs. :func:`check_device` refuses the rest.
* **Time.** Every linear layer's input is quantised once per GEMM (``cast_transpose``): read the
  bf16 tensor (2 B), write the low-precision copy in both layouts the forward and backward GEMMs
  read, plus their scales (:attr:`Fp8Recipe.cast_write_bytes`); where a norm kernel can write the
  quantised tensor itself (Transformer Engine ``LayerNormLinear``, :attr:`Fp8Recipe.norm_fused_cast`)
  there is no separate cast (:func:`autopar.cost.fp8.cast_bytes`). A recipe that takes the scale
  from the tensor itself (current / tensorwise scaling, and NVFP4's per-tensor second-level
  scale) reads the input once more for its amax first (TE ``compute_amax`` before
  ``quantize``): :attr:`Fp8Recipe.amax_read_bytes`. NVFP4 GEMMs run on the fp4 peak at the
  device's ``fp8_gemm_efficiency``; its random Hadamard transform of the weight-gradient inputs
  is fused into the cast (TE ``NVFP4BlockScaling``), not counted.
* **Memory.** The cached weight copies above (:attr:`Fp8Recipe.weight_copy_bytes`) on top of the
  bf16 weight, unless the weights are stored only in fp8 (``fp8_param_storage``); and the scaling
  state: delayed scaling keeps an amax history of ``amax_history_len`` (1024) fp32 values plus
  scale and inverse scale for each GEMM's input, weight and gradient; current scaling keeps amax,
  scale and inverse scale (3 fp32); the block recipes carry their scales with the tensors.
  Activations stay counted in bf16, as TE saves the bf16 norm outputs it quantises again.

Units: bytes per element or per parameter; the per-recipe numbers are checked by hand in
``tests/cost/test_fp8_recipes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.specs.cluster import DeviceSpec

AMAX_HISTORY_LEN = 1024  # TE DelayedScaling default amax_history_len
FP32 = 4


@dataclass(frozen=True)
class Fp8Recipe:
    """Costs of one recipe (module docstring). ``gemm_precision``: the ``DeviceSpec.peak_flops``
    key its linear GEMMs run at; ``cast_write_bytes``: bytes written per quantised input element
    (both layouts and their scales); ``amax_read_bytes``: bytes read per element before the cast
    to find its amax (0 when the scale is known beforehand); ``weight_copy_bytes``: cached
    low-precision weight bytes per linear parameter; ``scaling_state_bytes``: fp32 scaling state
    per GEMM operand (input, weight, gradient); ``norm_fused_cast``: a norm kernel can write its
    output quantised (the scale is known before the tensor is complete: from the amax history, or
    local to a block), :func:`autopar.cost.fp8.cast_bytes`; ``needs_block_scaling`` /
    ``nvidia_only``: device requirements (:func:`check_device`)."""

    name: str
    gemm_precision: str
    cast_write_bytes: float
    amax_read_bytes: float
    weight_copy_bytes: float
    scaling_state_bytes: float
    norm_fused_cast: bool = True
    needs_block_scaling: bool = False
    nvidia_only: bool = False


RECIPES: dict[str, Fp8Recipe] = {r.name: r for r in (
    Fp8Recipe("delayed", "fp8", cast_write_bytes=2.0, amax_read_bytes=0.0, weight_copy_bytes=2.0,
              scaling_state_bytes=(AMAX_HISTORY_LEN + 2) * FP32),
    Fp8Recipe("tensorwise", "fp8", cast_write_bytes=2.0, amax_read_bytes=2.0, weight_copy_bytes=2.0,
              scaling_state_bytes=3 * FP32, norm_fused_cast=False),
    Fp8Recipe("blockwise", "fp8", cast_write_bytes=2.0 + 2 * FP32 / 128, amax_read_bytes=0.0,
              weight_copy_bytes=2.0 + 2 * FP32 / (128 * 128), scaling_state_bytes=0.0, nvidia_only=True),
    Fp8Recipe("mxfp8", "fp8", cast_write_bytes=2.0 + 2 / 32, amax_read_bytes=0.0, weight_copy_bytes=2.0 + 2 / 32,
              scaling_state_bytes=0.0, needs_block_scaling=True),
    Fp8Recipe("nvfp4", "fp4", cast_write_bytes=2 * (0.5 + 1 / 16), amax_read_bytes=2.0,
              weight_copy_bytes=2 * (0.5 + 1 / 16), scaling_state_bytes=FP32, norm_fused_cast=False,
              needs_block_scaling=True, nvidia_only=True),
)}


def recipe(name: str) -> Fp8Recipe:
    """The :class:`Fp8Recipe` called ``name`` (one of :data:`FP8_RECIPES`)."""
    return RECIPES[name]


def supported(device: DeviceSpec, name: str) -> str | None:
    """Why ``device`` cannot run recipe ``name``, or None when it can (module docstring)."""
    r = RECIPES[name]
    if r.gemm_precision not in device.peak_flops:
        return f"device {device.name} has no {r.gemm_precision} tensor cores (its peaks: {', '.join(sorted(device.peak_flops))})"
    if r.needs_block_scaling and "fp4" not in device.peak_flops:
        runs = [n for n in RECIPES if n != name and supported(device, n) is None]
        return (f"device {device.name} has no block-scaled tensor cores (they came with fp4: Blackwell, "
                f"AMD CDNA4); recipes it runs: {', '.join(runs)}")
    if r.nvidia_only and device.vendor not in (None, "nvidia"):
        return f"{name} is an NVIDIA Transformer Engine recipe; device {device.name} is {device.vendor}"
    return None


def check_device(device: DeviceSpec, name: str) -> None:
    """Refuse a recipe the device cannot run.

    Raises:
        AutoparError: a device without fp8 at all names ``--precision=fp8``
            (:meth:`~autopar.specs.cluster.DeviceSpec.peak`); otherwise the message names
            ``--fp8-recipe``, the recipe and the reason (:func:`supported`).
    """
    device.peak("fp8")
    if (why := supported(device, name)) is not None:
        raise AutoparError(f"--fp8-recipe={name}: {why}")


def cast_bytes_per_element(name: str) -> float:
    """HBM bytes of quantising one input element: amax read (if any) + bf16 read + the writes.
    delayed 4, tensorwise 6, blockwise 4.0625, mxfp8 4.0625, nvfp4 5.125."""
    r = RECIPES[name]
    return r.amax_read_bytes + 2.0 + r.cast_write_bytes
