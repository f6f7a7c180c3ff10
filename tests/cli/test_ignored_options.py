"""Options and values that used to be accepted and then ignored are refused by name: the model and
cluster options ``balance --layers`` does not use, an NVLink domain that is not a whole number of
nodes, ``--embedding-loss-split`` on a single pipeline stage; and a limit the user gave is named as
given (``--memory-limit-gib=60``, not ``memory_limit_bytes``). A script's negative
``--moe-expert-capacity-factor`` is Megatron-Core's "no capacity" and costs as dropless."""

from __future__ import annotations

import json

import pytest

from conftest import SCRIPTS
from test_bad_input import LAYERS_DOC, LLAMA, one_line_error, runner
from autopar.cli import app


@pytest.fixture
def layers_file(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps(LAYERS_DOC))
    return str(path)


@pytest.mark.parametrize("extra, option", [
    (["--precision", "junk"], "--precision"),
    (["--devices-per-node", "0"], "--devices-per-node"),
    (["--vocab-size", "-1"], "--vocab-size"),
    (["--device-set", "memory_bytes=1"], "--device-set"),
    (["--no-flash-attention"], "--no-flash-attention"),
    (["--flash-attention"], "--flash-attention"),
    (["--make-vocab-size-divisible-by", "64"], "--make-vocab-size-divisible-by"),
    (["--no-fp8-param-storage"], "--no-fp8-param-storage"),
])
def test_balance_layers_refuses_the_model_and_cluster_options_it_ignores(layers_file, extra, option):
    err = one_line_error(["balance", "--layers", layers_file, *extra])
    assert f"error: --layers with {option}: the layer file gives the costs" in err


def test_balance_layers_takes_the_options_it_uses(layers_file):
    result = runner.invoke(app, ["balance", "--layers", layers_file, "--memory-limit-gib", "70", "--form", "megatron",
                                 "--options", "none,full", "--schedule", "1f1b"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("extra, needle", [
    (["--memory-limit-gib", "60"], "error: --memory-limit-gib=60: no split of 80 layers over pp=2"),
    ([], "error: device h100-80gb memory (79.6 GiB): no split of 80 layers over pp=2"),
])
def test_balance_no_fit_names_the_limit_as_given(extra, needle):
    err = one_line_error(["balance", "-m", "llama3-70b", "--device", "h100-80gb", "--pp", "2", *extra])
    assert needle in err and "memory_limit_bytes" not in err, err


def test_balance_layers_no_fit_names_the_files_key(layers_file):
    doc = {**LAYERS_DOC, "memory_limit_bytes": 1.5e9}  # the static 1e9 x 4 layers per stage alone exceed it
    path = layers_file.replace("l.json", "small.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    err = one_line_error(["balance", "--layers", path])
    assert f"error: --layers {path}: memory_limit_bytes=1.5e+09: no split of 16 layers over pp=4" in err


@pytest.mark.parametrize("args, needle", [
    (["--device", "h100-80gb", "--device-set", "nvlink_domain_size=3"],
     "device.nvlink_domain_size=3 with default_devices_per_node=8: the NVLink domain spans whole nodes, so it must "
     "be a multiple of 8"),
    (["--device", "h100-80gb", "--device-set", "nvlink_domain_size=4"], "must be a multiple of 8"),  # was ignored
    (["--device", "gb200", "--devices-per-node", "5"], "device.nvlink_domain_size=72 with --devices-per-node=5"),
])
def test_nvlink_domain_must_hold_whole_nodes(args, needle):
    assert needle in one_line_error(["estimate", "-m", "llama3-8b", "--nodes", "2", *args])


def test_nvlink_domain_from_a_device_file(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("base: h100-80gb\nnvlink_domain_size: 3\n")
    assert "device.nvlink_domain_size=3" in one_line_error(["estimate", "-m", "llama3-8b", "--device-file", str(path)])


def test_an_nvlink_domain_of_whole_nodes_is_used():
    """Two 8-GPU nodes in one 16-GPU NVLink domain: tp 8 dp 2's gradient all-reduce crosses the
    nodes over NVLink instead of the NIC, so the step is shorter (dp_comm lower)."""
    def dp_comm(*extra):
        result = runner.invoke(app, ["estimate", *LLAMA, "--nodes", "2", "--tp", "8", "--zero", "0", "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["time_breakdown_s"]["dp_comm"]

    assert dp_comm("--device-set", "nvlink_domain_size=16") < dp_comm()


def test_embedding_loss_split_needs_a_pipeline():
    for pp in ([], ["--pp", "1"]):
        err = one_line_error(["estimate", *LLAMA, "--embedding-loss-split", *pp])
        assert "error: --embedding-loss-split with --pp=1: it counts the embedding and the loss as layers" in err
    result = runner.invoke(app, ["estimate", *LLAMA, "--embedding-loss-split", "--pp", "2", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["strategy"]["account_for_embedding"]
    result = runner.invoke(app, ["estimate", *LLAMA, "--no-embedding-loss-split", "--json"])
    assert result.exit_code == 0


def test_negative_capacity_factor_in_a_script_is_dropless(tmp_path):
    """Megatron-Core ``TransformerConfig.__post_init__``: a ``moe_expert_capacity_factor`` below 0
    is set to None, i.e. no capacity, dropless routing: the same cost as without the flag."""
    base = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()
    assert "--moe-token-dispatcher-type alltoall" in base
    path = tmp_path / "job.sh"
    path.write_text(base.replace("--moe-token-dispatcher-type alltoall",
                                 "--moe-token-dispatcher-type alltoall\n    --moe-expert-capacity-factor -1"))

    def step_s(script):
        result = runner.invoke(app, ["estimate", "--script", str(script), "--device", "h100-80gb", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["step_time_s"]

    assert step_s(path) == step_s(SCRIPTS / "pretrain_mixtral_8x7b.sh")
