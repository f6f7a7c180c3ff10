"""Where a profile database's rows were measured, and whether they may stand for the planned device.

Every ``autopar profile`` run records, per (device, versions) key of its rows, a
:class:`MeasuredOn`: the device name the rows are stored under, the name torch reported
(``torch.cuda.get_device_name()``, or ``cpu:<machine>:<threads>t``), the autopar device preset
that name identifies (:func:`preset_for`, None when none does), the ``--device`` the run was
given (the plan whose shapes it measured, ``profile ops`` only), and the software (torch, CUDA
or ROCm, autopar). Each operator row also carries its precision (``dtype``).

``search``/``estimate --profile-db`` use a database device only for the plan's device
(:func:`accept`): the device's recorded preset must be the planned device's name, or the user
passes ``--profile-stands-for PLANNED`` ("trust these measurements as PLANNED"). A CPU
database silently used for an H100 plan turned #1 of ``search --device h100-80gb`` from tp1 dp8
at 10,628 tokens/s into pp8x2 at 4,878 (issue 13). No torch here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from autopar.errors import AutoparError

# The names CUDA reports (cudaDeviceProp.name, as torch.cuda.get_device_name() and nvidia-smi
# print them) of the GPUs an autopar preset describes. Only names that identify the preset's
# form factor: "NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe", "NVIDIA H100 NVL" and "NVIDIA H200
# NVL" are other cards (other clocks, power and links) and match no preset; so does the H100
# 96GB HBM2e, whose name does not say whether it runs at h100-96gb-500w's 500 W cap.
TORCH_NAMES = {
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100-80gb": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
}
SCHEMA2_RECORD = "derived from schema-2 rows"  # MeasuredOn.record of a migrated database


def preset_for(torch_name: str) -> str | None:
    """The autopar device preset whose GPU torch reports as ``torch_name`` (:data:`TORCH_NAMES`,
    whitespace-insensitive), or None (a CPU, or a GPU no preset describes)."""
    wanted = " ".join(torch_name.split())
    return next((preset for preset, name in TORCH_NAMES.items() if name == wanted), None)


def parse_versions(versions: str) -> dict[str, str | None]:
    """``{"torch", "cuda", "rocm"}`` from a rows' ``versions`` key (``torch=2.13.0 cuda=12.8
    cudnn=91002``); None where the key does not say (``cuda=None``: a ROCm or CPU build)."""
    found = dict(re.findall(r"(\w+)=(\S+)", versions))
    return {k: (None if found.get(k) in (None, "None") else found[k]) for k in ("torch", "cuda", "rocm")}


@dataclass(frozen=True)
class MeasuredOn:
    """Where and with what the rows of one (``device``, ``versions``) key were measured.

    ``device``: the name the rows are stored under; ``torch_name``: the name torch reported;
    ``preset``: the autopar preset that name identifies, or None; ``given_device``: the
    ``--device`` the profile run was given, or None; ``*_version``: the software (None where
    unknown); ``record``: ``"recorded"`` (written by the profile run) or :data:`SCHEMA2_RECORD`.
    """

    device: str
    versions: str
    torch_name: str
    preset: str | None
    given_device: str | None
    torch_version: str | None
    cuda_version: str | None
    rocm_version: str | None
    autopar_version: str | None
    record: str = "recorded"

    def to_dict(self) -> dict:
        return asdict(self)


def from_schema2(device: str, versions: str) -> MeasuredOn:
    """The record a schema-2 database implies for rows keyed (``device``, ``versions``).

    Schema 2's profile commands stored rows under the name torch reported and ``versions`` as
    torch's version with CUDA's (``cuda=None`` on ROCm and CPU builds); the autopar version and
    the ``--device`` given were not kept (None), nor the ROCm version.
    """
    parsed = parse_versions(versions)
    return MeasuredOn(device, versions, device, preset_for(device), None, parsed["torch"], parsed["cuda"],
                      parsed["rocm"], None, SCHEMA2_RECORD)


def device_preset(records: list[MeasuredOn], unrecorded: list[str]) -> str | None:
    """The preset every row of one database device was measured on, or None when a record
    names none, records disagree, or some rows (``unrecorded`` versions) have no record."""
    presets = {r.preset for r in records}
    if unrecorded or len(presets) != 1:
        return None
    return presets.pop()


def describe(device: str, preset: str | None) -> str:
    """``'NVIDIA H100 80GB HBM3' (preset h100-80gb)`` or ``'cpu:x86_64:2t' (no autopar preset)``."""
    return f"{device!r} ({f'preset {preset}' if preset else 'no autopar preset'})"


def accept(option: str, path: str, device: str, preset: str | None, planned: str, stands_for: str | None) -> str:
    """How the rows of database ``device`` (measured on ``preset``) may cost a plan for the
    device named ``planned``: ``"same device"`` or ``"--profile-stands-for PLANNED"``.

    Raises:
        AutoparError: ``stands_for`` names another device than ``planned``; or the database
            device is not ``planned`` and ``stands_for`` is None (one line naming both devices
            and the option that overrides).
    """
    if stands_for is not None and stands_for != planned:
        raise AutoparError(f"--profile-stands-for={stands_for!r}: the plan's device is {planned!r}; name it to use "
                           f"{option}'s measurements for it")
    if preset == planned:
        return "same device"
    if stands_for is None:
        raise AutoparError(f"{option}={path!r}: measured on {describe(device, preset)}, not on the planned "
                           f"{planned!r}; pass --profile-stands-for {planned} to use its times as {planned}'s, or "
                           "profile on that device")
    return f"--profile-stands-for {planned}"
