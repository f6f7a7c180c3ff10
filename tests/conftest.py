"""Shared fixtures: problems built from the shipped presets and hand-made toy models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import autopar
from autopar.problem import Problem
from autopar.specs import ModelSpec, TrainSpec, load_device, load_model, make_cluster

#: The data the tests use lives in the repository (a clean clone tests itself); ``test_data_files``
#: checks it against ``../shared/`` where a steering checkout sits beside this one.
DATA = Path(autopar.__file__).resolve().parent / "data"
MODELS = DATA / "models"                            # the HF config.json files of the presets
MEASUREMENTS = DATA / "validation" / "measurements.csv"
ROOT = Path(__file__).resolve().parents[1]                # the repository (docs/, benchmarks/, tools/)
TESTS_DATA = Path(__file__).resolve().parent / "data"      # test inputs (scripts/, logs/, torchtitan/)
SCRIPTS = TESTS_DATA / "scripts"   # Megatron-style launch scripts

# One folder per source package (tests/README.md). Test modules share helpers by module name
# (``from test_bad_input import one_line_error``), so every folder is importable; the names are unique.
sys.path[:0] = [str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
                if folder.is_dir() and folder.name not in ("data", "realclients", "__pycache__")]


def make_problem(model: str | ModelSpec, device: str = "h100-80gb", nodes: int = 1, per_node: int = 8,
                 gbs: int = 64, seq: int = 4096, **train) -> Problem:
    """A Problem from a preset name (or a ModelSpec) on ``nodes`` x ``per_node`` devices."""
    spec = load_model(model) if isinstance(model, str) else model
    cluster = make_cluster(load_device(device), nodes, per_node)
    return Problem(spec, cluster, TrainSpec(global_batch_size=gbs, seq_len=seq, **train))


def link_bandwidths(p: Problem) -> tuple[float, float]:
    """(intra-node bus bandwidth, per-rank NIC bandwidth) in bytes/s: the device's datasheet
    numbers times its efficiency constants, as the hand derivations of the comm tests use them."""
    dev = p.cluster.device
    return (dev.intra_node_bandwidth_bytes_per_s * dev.intra_node_comm_efficiency,
            dev.inter_node_bandwidth_bytes_per_s * dev.inter_node_comm_efficiency)


def toy_model(**over) -> ModelSpec:
    """The small model of shared/cases C-03 and C-10: L=4, h=16, 4 heads, FFN 64, vocab 32."""
    fields = dict(name="toy", num_layers=4, hidden_size=16, num_attention_heads=4, num_kv_heads=4, head_dim=4,
                  ffn_hidden_size=64, vocab_size=32, tie_word_embeddings=False, gated_mlp=False, norm="rmsnorm")
    fields.update(over)
    return ModelSpec(**fields)


@pytest.fixture
def llama70b_64() -> Problem:
    return make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192)


def mixtral_script(tmp_path: Path, extra: str, name: str = "s.sh") -> Path:
    """The shipped Mixtral launch script (``pretrain_mixtral_8x7b.sh``: 32 layers, tp 2, pp 4, ep 4,
    SP) written to ``tmp_path / name`` with ``extra`` flags after ``--sequence-parallel``."""
    path = tmp_path / name
    text = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()
    path.write_text(text.replace("    --sequence-parallel\n", f"    --sequence-parallel\n    {extra}\n"))
    return path



def whole_batch_top(p: Problem, space, keep: int):
    """The reference the streamed search is checked against: every valid layout of ``space``
    (:func:`autopar.search.valid_space.valid_layouts`) costed in one batch and stably sorted as the
    search ranks. Returns ``(expected, step, peak, fit, marginal)``: the row indices of the best
    ``keep`` fitting layouts in order, and the whole batch's step times, peaks, fitting rows and
    marginal flags."""
    import numpy as np

    from autopar.search import stream
    from autopar.search.costing import search_costs

    capacity = p.cluster.device.memory_bytes
    costs = search_costs(p, space.valid, capacity, space.keys)
    peak, step = costs.peak_memory_bytes, costs.step_time_s
    fit = np.flatnonzero(peak <= capacity)
    marginal = peak > 0.9 * capacity
    whole = stream.Ranked(space.valid.take(fit), step[fit], peak[fit], marginal[fit], fit)
    return fit[whole.order()][:keep], step, peak, fit, marginal
