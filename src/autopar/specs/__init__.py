"""Validated, immutable input specs: model, cluster, training job."""

from autopar.specs.cluster import ClusterSpec, DeviceSpec, device_names, load_device, make_cluster
from autopar.specs.hf import load_model, model_from_hf_dict, preset_names
from autopar.specs.model import ModelSpec
from autopar.specs.train import TrainSpec

__all__ = [
    "ClusterSpec", "DeviceSpec", "ModelSpec", "TrainSpec", "device_names", "load_device",
    "load_model", "make_cluster", "model_from_hf_dict", "preset_names",
]
