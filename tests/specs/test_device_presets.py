"""Device presets (issue 15 item 4): the new parts' datasheet numbers, re-derived by hand from the
vendor figures their ``source`` cites, and the name lookup (``--device``, validate's ``gpu`` cells)."""

from __future__ import annotations

import csv
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs import device_names, load_device
from autopar.specs.cluster import _key, device_aliases, preset_aliases, resolve_device_name
from conftest import MEASUREMENTS

runner = CliRunner()
NEW = ["b300", "gb300", "mi300x", "mi325x", "mi355x", "ascend-910c"]


def test_new_presets_match_their_datasheets():
    b300, gb300 = load_device("b300"), load_device("gb300")
    # HGX B300, per 8 GPUs: FP16/BF16 36 and FP8 72 PFLOP/s with 2:4 sparsity, FP4 105 dense, 2.3 TB HBM3e
    assert b300.peak_flops == {"bf16": 36e15 / 8 / 2, "fp16": 36e15 / 8 / 2, "fp8": 72e15 / 8 / 2,
                               "fp4": 105e15 / 8, "fp32": 600e12 / 8}
    assert b300.memory_bytes == 288e9 and b300.default_devices_per_node == 8 and b300.nvlink_domain_size is None
    # GB300 NVL72, per 72 GPUs: BF16 360, FP8 720 PFLOP/s sparse, FP4 1,080 dense; NVLink 1.8 TB/s bidirectional
    assert (gb300.peak("bf16"), gb300.peak("fp8"), gb300.peak_flops["fp4"]) == (360e15 / 144, 720e15 / 144, 1080e15 / 72)
    assert gb300.nvlink_domain_size == 72 and gb300.default_devices_per_node == 4
    for d in (b300, gb300):  # NVLink5 1.8 TB/s bidirectional; ConnectX-8 800 Gb/s per GPU
        assert d.intra_node_bandwidth_bytes_per_s == 1.8e12 / 2 and d.inter_node_bandwidth_bytes_per_s == 800e9 / 8
    mi300x, mi325x, mi355x = (load_device(n) for n in ("mi300x", "mi325x", "mi355x"))
    # CDNA 3: 304 CUs x 2,048 (bf16) / 4,096 (fp8) FLOP per clock x 2.1 GHz; CDNA 4: 256 CUs x 4,096 / 8,192 x 2.4 GHz
    for d in (mi300x, mi325x):
        assert d.peak("bf16") == pytest.approx(304 * 2048 * 2.1e9, rel=1e-4)
        assert d.peak("fp8") == pytest.approx(304 * 4096 * 2.1e9, rel=1e-4)
        assert d.intra_node_bandwidth_bytes_per_s == 7 * 128e9 / 2  # 7 xGMI links, 128 GB/s bidirectional each
    assert mi355x.peak("bf16") == pytest.approx(256 * 4096 * 2.4e9, rel=1e-4)
    assert mi355x.peak("fp8") == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert mi355x.peak_flops["fp4"] == pytest.approx(2 * 256 * 8192 * 2.4e9, rel=1e-4)
    assert mi355x.intra_node_bandwidth_bytes_per_s == pytest.approx(7 * 153.6e9 / 2)
    assert [d.memory_bytes / 2**30 for d in (mi300x, mi325x, mi355x)] == [192, 256, 288]
    assert [d.hbm_bandwidth_bytes_per_s for d in (mi300x, mi325x, mi355x)] == [5.3e12, 6e12, 8e12]
    # Ascend 910C (CloudMatrix384 paper): per package 752 TFLOP/s, 128 GB at 3.2 TB/s, 392 GB/s UB and 400 Gb/s
    # RDMA one way, two dies = two devices (16 per A3 node); 384 packages per UB domain
    c = load_device("ascend-910c")
    assert (c.peak("bf16"), c.hbm_bandwidth_bytes_per_s, c.intra_node_bandwidth_bytes_per_s) == (752e12 / 2, 3.2e12 / 2,
                                                                                                 392e9 / 2)
    assert c.inter_node_bandwidth_bytes_per_s == 400e9 / 8 / 2 and c.nvlink_domain_size == 384 * 2
    assert c.default_devices_per_node == 16 and "fp8" not in c.peak_flops


def test_every_preset_says_where_its_numbers_come_from():
    for name in device_names():
        d = load_device(name)
        assert d.vendor in ("nvidia", "amd", "huawei") and len(d.source) > 80, name
        if name in NEW:  # the fields not fitted are named as assumed
            assert "assumed" in d.source.lower(), name
    assert "fp4" in load_device("b200").peak_flops and "fp4" in load_device("gb200").peak_flops


def test_devices_command_lists_the_new_presets():
    table = runner.invoke(app, ["devices"], env={"COLUMNS": "200"}).output
    docs = json.loads(runner.invoke(app, ["devices", "--json"]).output)["devices"]
    by_name = {d["name"]: d for d in docs}
    for name in NEW:
        assert name in table and name in by_name
    assert by_name["mi300x"]["targets"] == ["megatron", "torchtitan", "deepspeed"]
    assert by_name["ascend-910c"]["targets"] == ["mindspeed", "sapp"]
    assert "Atlas 800T A3" in by_name["ascend-910c"]["aliases"]


@pytest.mark.parametrize(("written", "preset"), [
    ("B200 (DGX-B200)", "b200"), ("H200 (8/node)", "h200"), ("H200", "h200"), ("MI300X", "mi300x"),
    ("Atlas 800T A2", "ascend-910b"), ("H100-SXM5-80GB", "h100-80gb"), ("GB200 NVL72", "gb200"),
    ("gb300 (DGX-GB300)", "gb300"), ("amd instinct mi355x", "mi355x"), ("H100-96GB-HBM2e (Grand Teton, 500W)",
                                                                       "h100-96gb-500w"),
    ("h100_sxm5_80gb", "h100-80gb"), ("Ascend-910C", "ascend-910c"), ("MI32", "mi325x"), ("b300", "b300"),
])
def test_written_names_resolve(written, preset):
    assert resolve_device_name(written) == preset


def test_ambiguous_and_unknown_names_are_refused_with_the_candidates():
    with pytest.raises(AutoparError, match=r"--device='A100': ambiguous device name; it may be a100-40gb or a100-80gb"):
        resolve_device_name("A100")
    with pytest.raises(AutoparError, match="mi300x or mi325x or mi355x"):
        resolve_device_name("mi3")
    with pytest.raises(AutoparError, match=r"gpu='V100-SXM3-32GB \(DGX-2\)': unknown device; known: a100-40gb"):
        resolve_device_name("V100-SXM3-32GB (DGX-2)", "gpu")
    res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--device", "A100"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "a100-40gb or a100-80gb" in res.output


def test_one_rule_for_every_device_name():
    """``--device h100`` picked h100-80gb through an alias while ``a100`` was ambiguous, and
    'H100🚀' lost its emoji and became h100-80gb: a family name that starts several presets is
    ambiguous for each family, and a character outside ASCII is refused."""
    with pytest.raises(AutoparError, match=r"--device='h100': ambiguous device name; it may be h100-80gb or "
                                           r"h100-96gb-500w"):
        resolve_device_name("h100")
    for text, odd in (("H100🚀", "🚀"), ("Ｈ100-80gb", "Ｈ"), ("h100-80gb\n", "\n")):
        with pytest.raises(AutoparError) as err:
            resolve_device_name(text)
        assert str(err.value) == (f"--device={text!r}: a device name is ASCII letters, digits, spaces and "
                                  f"punctuation; {odd!r} is none of them")
    keys = device_aliases()
    hiding = [(k, v, o) for k, v in keys.items() for kk, o in keys.items() if kk != k and kk.startswith(k) and o != v]
    assert hiding == []  # an alias that starts another preset's name would hide that ambiguity


def test_aliases_name_one_preset_each():
    written = [a for n in device_names() for a in [n, *preset_aliases(n)]]
    assert len({_key(a) for a in written}) == len(written) == len(device_aliases())


def test_device_option_and_device_file_take_aliases(tmp_path):
    res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--device", "B200 (DGX-B200)", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["device_memory_bytes"] == load_device("b200").memory_bytes
    f = tmp_path / "dev.yaml"
    f.write_text("base: H100-SXM5-80GB\nmemory_bytes: 96e9\n")
    d = load_device(None, str(f))
    assert d.name == "h100-80gb" and d.memory_bytes == 96e9 and d.vendor == "nvidia"


def test_validation_gpu_cells_resolve_as_validate_maps_them():
    """Every ``gpu`` cell of the measurements CSV that validate maps resolves to the same preset;
    the two it cannot (V100, an A100 of unstated memory) are refused, not guessed."""
    from autopar.validate.rows import Unscorable, device_of

    cells = sorted({row["gpu"] for row in csv.DictReader(MEASUREMENTS.open())})
    refused = []
    for gpu in cells:
        try:
            preset = resolve_device_name(gpu, "gpu")
        except AutoparError:
            refused.append(gpu)
            continue
        try:
            assert device_of({"gpu": gpu}).name == preset
        except Unscorable:  # a preset validate does not map yet (B200, GB300, H200 rows)
            assert preset in ("b200", "gb300", "h200")
    assert [g.split()[0] for g in refused] == ["A100", "V100-SXM3-32GB"]


@given(st.sampled_from([(n, a) for n in device_names() for a in [n, *preset_aliases(n)]]), st.data())
def test_case_spaces_and_punctuation_do_not_matter(pair, data):
    preset, alias = pair
    flips = data.draw(st.lists(st.booleans(), min_size=len(alias), max_size=len(alias)))
    seps = data.draw(st.lists(st.sampled_from(["", "", " ", "-", "_", "/"]), min_size=len(alias), max_size=len(alias)))
    written = "".join((c.upper() if f else c.lower()) + sep for c, f, sep in zip(alias, flips, seps))
    assert resolve_device_name(written) == preset
