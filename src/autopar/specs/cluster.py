"""``DeviceSpec`` and ``ClusterSpec``: what the hardware can do.

Device presets live in ``autopar/data/devices.json``, each with the datasheet it comes from.
Any field can be overridden from a YAML/JSON file (``--device-file``) or ``--device-set
key=value`` on the CLI.

The efficiency constants are the only calibration knobs of the analytic model, and each has a
physical meaning that holds for a whole device or interconnect (never per model or per run):

* ``gemm_efficiency``: achievable fraction of peak FLOP/s on large bf16 GEMMs. cuBLAS reaches
  about 80% on A100 and 70-75% on H100 SXM for large square GEMMs (NVIDIA "Matrix
  Multiplication Background" guide; Megatron-LM reports 52% end-to-end MFU on GPT-3 175B
  with A100, which bounds the GEMM share from below).
* ``fp8_gemm_efficiency``: the same for fp8 GEMMs, as a fraction of the fp8 peak (None: as
  ``gemm_efficiency``). Lower than the bf16 fraction: Transformer Engine runs dgrad/wgrad with
  split (fp32-promoted) accumulation and fp8 GEMMs throttle the clock harder under sustained
  load; the per-device values and their fit are in ``devices.json`` (``autopar.cost.fp8``).
* ``attention_efficiency``: fraction of the bf16 peak reached by fused (flash) attention
  forward+backward, with backward counted as 2x forward as autopar does (FlashAttention-2
  paper, Dao 2023: up to ~225 TFLOP/s fwd+bwd on A100 and ~335 on H100 SXM at head dim 128,
  counting backward as 2.5x forward, i.e. x 3/3.5 on autopar's count: A100 0.62, H100 0.29).
  Default 0.45 (between A100's FA2 and the unfused bmm + softmax path of the 2021-22 Megatron
  runs); Hopper presets 0.28 (FA2 and NeMo 2024's TE/cuDNN kernels stay far below the GEMM
  fraction on H100; see ``devices.json``). This is the long-block rate: short query/key blocks
  (short sequences, CP ring steps) run slower by :func:`autopar.cost.attention.block_efficiency`.
* ``memory_efficiency``: fraction of HBM bandwidth that element-wise kernels (norms,
  activations, Adam) reach (STREAM-like kernels reach 80-90%; fused Megatron kernels less).
* ``intra_node_comm_efficiency`` / ``inter_node_comm_efficiency``: NCCL bus bandwidth over the
  link's per-direction peak for large messages (nccl-tests all_reduce: about 230 of 300 GB/s on
  A100 NVLink3, 360 of 450 on H100 NVLink4; about 90% of InfiniBand line rate).
* ``framework_overhead_bytes``: memory the framework holds outside tensors the model accounts
  for: CUDA context and kernels (~0.5-1 GiB), NCCL communicators and buffers, cuBLAS/cuDNN
  workspaces and allocator fragmentation.
"""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autopar.errors import AutoparError, from_validation_error, read_text
from autopar.specs.long_numbers import json_or_yaml, too_large, yaml_load

Precision = Literal["bf16", "fp16", "fp8"]
GIB = 2**30
MAX_NODES = 100_000  # far beyond any cluster; keeps the layout enumeration finite and fast
MAX_DEVICES_PER_NODE = 1024
# Input bounds (what a user may set, not calibration): below 1% of a peak, 1 MB/s of bandwidth or
# 1 GFLOP/s no accelerator runs training, and a per-step latency or per-op host time of a second
# is a typo (1 s for 1e-6 s); such values would overflow the step time rather than describe a device.
MIN_EFFICIENCY = 0.01
MIN_BANDWIDTH_BYTES_PER_S = 1e6
MIN_PEAK_FLOPS = 1e9
MAX_LATENCY_S = 1.0
# Upper bounds, three orders of magnitude above the 2025 parts (B200: 192 GB HBM at 8 TB/s, ~1e16
# FLOP/s fp4): 1e300 bytes or FLOP/s printed 300-digit "smallest predicted peak" lines instead of an error.
MAX_MEMORY_BYTES = 1e15
MAX_BANDWIDTH_BYTES_PER_S = 1e15
MAX_PEAK_FLOPS = 1e18


class DeviceSpec(BaseModel):
    """One accelerator. Units: FLOP/s, bytes, bytes/s (per device, per direction), seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=False)

    name: str
    description: str = ""
    source: str = ""
    vendor: Literal["nvidia", "amd", "huawei"] | None = Field(
        default=None, description="accelerator family: which training frameworks run on it (autopar.specs.targets); "
        "None (a device file without a base preset): not checked")
    peak_flops: dict[str, float] = Field(description="dense peak FLOP/s by dtype (bf16, fp16, fp8, fp32)")
    memory_bytes: float = Field(gt=0, le=MAX_MEMORY_BYTES)
    hbm_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S)
    intra_node_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S, description="NVLink/HCCS, per direction")
    inter_node_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S, description="network (NIC) per device, per direction")
    intra_node_latency_s: float = Field(default=8e-6, ge=0, le=MAX_LATENCY_S, description="per ring step")
    inter_node_latency_s: float = Field(default=20e-6, ge=0, le=MAX_LATENCY_S, description="per ring step")
    default_devices_per_node: int = Field(default=8, gt=0)
    nvlink_domain_size: int | None = Field(default=None, gt=0, description="devices sharing the fast link, if more than one node (GB200 NVL72); a multiple of the devices per node")
    sm_count: int | None = Field(
        default=None, gt=0, le=4096,
        description="streaming multiprocessors (AMD: compute units) the GEMMs run on: what Transformer Engine's "
        "userbuffers kernels take a share of (autopar.cost.userbuffers_sm); None: not known, that share not costed")
    gemm_efficiency: float = Field(default=0.75, ge=MIN_EFFICIENCY, le=1)
    fp8_gemm_efficiency: float | None = Field(default=None, ge=MIN_EFFICIENCY, le=1, description="fraction of the fp8 peak; None: as gemm_efficiency")
    attention_efficiency: float = Field(default=0.45, ge=MIN_EFFICIENCY, le=1)
    memory_efficiency: float = Field(default=0.7, ge=MIN_EFFICIENCY, le=1)
    intra_node_comm_efficiency: float = Field(default=0.8, ge=MIN_EFFICIENCY, le=1)
    inter_node_comm_efficiency: float = Field(default=0.85, ge=MIN_EFFICIENCY, le=1)
    framework_overhead_bytes: float = Field(default=2.0 * GIB, ge=0, le=MAX_MEMORY_BYTES)
    host_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S,
        description="host <-> device link per direction (PCIe, or NVLink-C2C on Grace): optimizer offload "
        "copies (autopar.cost.offload); None: unknown, offload refused")
    host_op_s: float = Field(default=13.5e-6, ge=0, le=MAX_LATENCY_S, description="host (CPU) seconds per eager framework op: "
                             "Python + PyTorch dispatch + kernel launch (autopar.cost.host)")

    @model_validator(mode="before")
    @classmethod
    def _no_booleans(cls, data: Any) -> Any:
        """YAML ``true`` is not a number: refuse it instead of reading it as 1."""
        if isinstance(data, dict):
            values = [*data.items(), *((f"peak_flops.{k}", v) for k, v in
                                       (data.get("peak_flops") if isinstance(data.get("peak_flops"), dict) else {}).items())]
            for key, value in values:
                if isinstance(value, bool):
                    raise ValueError(f"{key}={value}: expected a number, not true/false")
        return data

    @model_validator(mode="after")
    def _check_peaks(self) -> "DeviceSpec":
        for key, value in self.peak_flops.items():
            if not key or "." in key or not math.isfinite(value) or not MIN_PEAK_FLOPS <= value <= MAX_PEAK_FLOPS:
                raise ValueError(f"peak_flops.{key}={value}: needs a dtype name and a finite value in "
                                 f"{MIN_PEAK_FLOPS:g}..{MAX_PEAK_FLOPS:g} FLOP/s")
        if "bf16" not in self.peak_flops:
            raise ValueError("peak_flops needs a 'bf16' entry")
        return self

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``.

        Raises:
            AutoparError: the device has no such tensor-core precision (e.g. fp8 on A100).
        """
        if precision not in self.peak_flops:
            raise AutoparError(
                f"--precision={precision}: device {self.name} has no {precision} peak; "
                f"it supports {', '.join(sorted(self.peak_flops))}"
            )
        return self.peak_flops[precision]


class ClusterSpec(BaseModel):
    """A homogeneous cluster: ``num_nodes`` x ``devices_per_node`` of one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceSpec
    num_nodes: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def fast_domain_size(self) -> int:
        """Devices that reach each other over NVLink/HCCS (a node, or an NVL72 rack).

        Ranks are placed node by node, so a domain of ``nvlink_domain_size`` consecutive ranks
        must hold whole nodes (:func:`make_cluster` refuses another size): a group of ``size``
        ranks ``stride`` apart runs on NVLink when ``size * stride`` fits in it
        (:func:`autopar.cost.comm.group_bus_bandwidth`). A domain smaller than a node would be
        taken as the node, which is why it is refused rather than ignored."""
        domain = max(self.devices_per_node, self.device.nvlink_domain_size or 0)
        return min(domain, self.world_size)


def _presets() -> dict[str, dict[str, Any]]:
    text = (resources.files("autopar") / "data" / "devices.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def _device_table() -> dict[str, dict[str, Any]]:
    """Preset name -> its :class:`DeviceSpec` fields (``aliases`` taken out)."""
    return {k: {f: x for f, x in v.items() if f != "aliases"} for k, v in _presets().items()}


def device_names() -> list[str]:
    """Names of the shipped device presets."""
    return sorted(_device_table())


def preset_aliases(name: str) -> list[str]:
    """The names devices.json lists for preset ``name`` besides its own (empty for an unknown name)."""
    return list(_presets().get(name, {}).get("aliases", []))


def _key(text: str) -> str:
    """A device name as compared: lower case, letters and digits only ("H100-SXM5-80GB" -> "h100sxm580gb")."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def device_aliases() -> dict[str, str]:
    """Normalised name (:func:`_key`) -> preset, for every preset name and its ``aliases`` in devices.json."""
    table: dict[str, str] = {}
    for name, fields in _presets().items():
        for alias in [name, *fields.get("aliases", [])]:
            table[_key(alias)] = name
    return table


def resolve_device_name(text: str, option: str = "--device") -> str:
    """The preset a written device name means: "B200 (DGX-B200)" -> ``b200``, "H200 (8/node)" ->
    ``h200``, "Atlas 800T A2" -> ``ascend-910b``, "MI300X" -> ``mi300x``.

    One rule for every name: case, spaces and ASCII punctuation do not matter; any other
    character (an emoji, a full-width letter) is refused rather than dropped. The whole name is
    tried first, then the part before a parenthesis and each ``,``/``;``-separated part inside it
    (a name naming two presets is ambiguous), then the presets whose name or an alias starts with
    the part before the parenthesis ("MI32" -> ``mi325x``; "A100" could be ``a100-40gb`` or
    ``a100-80gb``, "H100" ``h100-80gb`` or ``h100-96gb-500w``). No alias is the start of another
    preset's name or alias (a test checks devices.json), so an alias never hides an ambiguity.

    Args:
        text: the name as written (a ``--device`` value, a measurements CSV ``gpu`` cell, ...).
        option: the option or field named in the error.
    Returns:
        The preset name (a key of devices.json).
    Raises:
        AutoparError: no preset matches (listing the presets), or several do (listing them).
    """
    odd = sorted({c for c in text if not (c.isascii() and c.isprintable())})
    if odd:
        raise AutoparError(f"{option}={text!r}: a device name is ASCII letters, digits, spaces and punctuation; "
                           f"{''.join(odd)!r} is none of them")
    aliases = device_aliases()
    if _key(text) in aliases:
        return aliases[_key(text)]
    main, _, rest = text.partition("(")
    parts = [_key(main), *(_key(x) for x in re.split(r"[;,]", rest.rstrip(") ")))]
    found = sorted({aliases[k] for k in parts if k in aliases})
    if not found and _key(main):
        found = sorted({preset for alias, preset in aliases.items() if alias.startswith(_key(main))})
    if len(found) == 1:
        return found[0]
    if found:
        raise AutoparError(f"{option}={text!r}: ambiguous device name; it may be {' or '.join(found)}: give one of them")
    raise AutoparError(f"{option}={text!r}: unknown device; known: {', '.join(device_names())} (or a name "
                       "such as 'H100-SXM5-80GB', 'B200 (DGX-B200)', 'MI300X', 'Atlas 800T A2'; `autopar devices`)")


def _read_mapping(path: str) -> dict[str, Any]:
    text = read_text(path, "--device-file", "expected YAML or JSON")
    try:
        data = json_or_yaml(text)
    except ValueError as err:
        raise AutoparError(f"--device-file: {path!r} is not valid YAML/JSON ({err})") from None
    except RecursionError:  # [[[...]]] nested beyond Python's recursion limit
        raise AutoparError(f"--device-file: {path!r} is nested too deeply to be a device file") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise AutoparError(f"--device-file: {path!r} must hold a mapping of device field names to values")
    if "base" in data and not isinstance(data["base"], str):
        raise AutoparError(f"--device-file: base={data['base']!r} must be a device preset name")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    import yaml  # only where --device-set is given

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise AutoparError(f"--device-set={item!r}: expected KEY=VALUE, e.g. memory_bytes=80e9")
    try:
        return key.strip(), yaml_load(value)
    except yaml.YAMLError:
        raise AutoparError(f"--device-set={item!r}: the value is not a number or string") from None


def load_device(
    name: str | None,
    device_file: str | None = None,
    overrides: list[str] | None = None,
) -> DeviceSpec:
    """A device preset, optionally starting from or overridden by a file and ``KEY=VALUE`` pairs.

    ``name`` (and a file's ``base``) may be any name :func:`resolve_device_name` resolves.

    ``device_file`` may set ``base: <preset>`` and any :class:`DeviceSpec` field; ``peak_flops``
    keys are merged. Dotted overrides (``peak_flops.bf16=900e12``) address the dict.

    Raises:
        AutoparError: unknown or ambiguous preset, unreadable file, unknown or invalid field, a number of more
            digits than any field holds (``device.memory_bytes=<a 5000-digit number>: too large``).
    """
    table = _device_table()
    fields: dict[str, Any] = {}
    extra = _read_mapping(device_file) if device_file else {}
    base = name or extra.pop("base", None)
    extra.pop("base", None)
    if base is not None:
        base = resolve_device_name(base, "--device" if name else "--device-file base")
        fields = {"name": base, **json.loads(json.dumps(table[base]))}
    elif not device_file:
        raise AutoparError(f"--device: required; known: {', '.join(sorted(table))}")
    for key, value in [*extra.items(), *(_parse_override(o) for o in overrides or [])]:
        if key.startswith("peak_flops."):
            fields.setdefault("peak_flops", {})[key.split(".", 1)[1]] = value
        elif key == "peak_flops" and isinstance(value, dict):
            fields["peak_flops"] = {**fields.get("peak_flops", {}), **value}
        else:
            fields[key] = value
    peaks = fields.get("peak_flops") if isinstance(fields.get("peak_flops"), dict) else {}
    for key, value in [*fields.items(), *((f"peak_flops.{k}", v) for k, v in peaks.items())]:
        why = too_large(f"device.{key}", value, f"memory and bandwidths at most {MAX_MEMORY_BYTES:g}, peaks at most "
                        f"{MAX_PEAK_FLOPS:g}")
        if why:
            raise AutoparError(why)
    unknown = sorted(set(fields) - set(DeviceSpec.model_fields))
    if unknown:  # named by where it was given: --device-set KEY=VALUE or the --device-file
        allowed = ", ".join(DeviceSpec.model_fields)
        typed = next((o for o in overrides or [] if o.partition("=")[0].strip() == unknown[0]), None)
        where = (f"--device-set={typed!r}" if typed is not None
                 else f"--device-file {device_file!r}" if unknown[0] in extra else "device")
        raise AutoparError(f"{where}: unknown device field {unknown[0]!r}; allowed: {allowed}")
    fields.setdefault("name", Path(device_file).stem if device_file else "custom")
    try:
        return DeviceSpec(**fields)
    except ValidationError as err:
        raise from_validation_error(err, "device") from None


def make_cluster(device: DeviceSpec, num_nodes: int, devices_per_node: int | None) -> ClusterSpec:
    """Build a :class:`ClusterSpec`; ``devices_per_node`` defaults to the device's usual node size.

    Raises:
        AutoparError: zero or negative sizes; a device ``nvlink_domain_size`` that is not a whole
            number of nodes (see :attr:`ClusterSpec.fast_domain_size`).
    """
    dpn = device.default_devices_per_node if devices_per_node is None else devices_per_node
    if not 0 < num_nodes <= MAX_NODES:
        raise AutoparError(f"--nodes={num_nodes}: must be an integer in 1..{MAX_NODES}")
    if not 0 < dpn <= MAX_DEVICES_PER_NODE:
        raise AutoparError(f"--devices-per-node={dpn}: must be an integer in 1..{MAX_DEVICES_PER_NODE}")
    domain = device.nvlink_domain_size
    if domain is not None and domain % dpn:
        raise AutoparError(
            f"device.nvlink_domain_size={domain} with "
            f"{f'--devices-per-node={dpn}' if devices_per_node else f'default_devices_per_node={dpn}'}: "
            "the NVLink domain spans whole nodes, "
            f"so it must be a multiple of {dpn} (GB200 NVL72: 72 = 18 nodes x 4); a node always counts as one "
            "fast domain, so for slower links inside a node lower intra_node_bandwidth_bytes_per_s instead")
    return ClusterSpec(device=device, num_nodes=num_nodes, devices_per_node=dpn)
