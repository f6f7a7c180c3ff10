"""``autopar balance``: the table, the plot, the --layers file and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
LLAMA8B_PP4 = ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64",
               "--seq-len", "8192", "--pp", "4"]


def test_balance_llama3_8b_pp4_names_the_split():
    result = runner.invoke(app, LLAMA8B_PP4)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Balanced pipeline" in out and "SAPP offset" in out and "even split" in out and "gain" in out
    assert "--decoder-first-pipeline-num-layers" in out  # the 32 layers are split unevenly


def test_balance_plot_writes_a_png(tmp_path):
    png = tmp_path / "pipe.png"
    result = runner.invoke(app, LLAMA8B_PP4 + ["--vpp", "2", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_balance_bad_layout_exits_2_with_one_line():
    result = runner.invoke(app, ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1",
                                 "--tp", "3", "--pp", "4"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "tp*pp*cp" in lines[0]


def test_balance_layers_file(tmp_path):
    layer = '{"forward_s": 0.01, "backward_s": 0.02, "static_bytes": 1e9, "activation_bytes": {"none": 1e9, "full": 1e8}}'
    heavy = layer.replace("0.01", "0.04").replace("0.02", "0.08")
    doc = tmp_path / "layers.json"
    doc.write_text(f'{{"pp": 2, "num_microbatches": 8, "memory_limit_bytes": 2e10, '
                   f'"layers": [{heavy}, {layer}, {layer}, {layer}, {layer}, {layer}]}}')
    result = runner.invoke(app, ["balance", "--layers", str(doc)])
    assert result.exit_code == 0, result.output
    # the heavy first layer (0.12 s) gets fewer neighbours: (2, 4) and (1, 5) both make the slowest
    # stage 0.15 s, objective 7 * 0.15 + 0.27 = 1.32 s (the split (3, 3): 1.53 s)
    assert "SAPP offset:    [-1, 1]" in result.output or "SAPP offset:    [-2, 2]" in result.output
    doc = json.loads(runner.invoke(app, ["balance", "--layers", str(doc), "--json"]).stdout)
    assert doc["balanced"]["objective_s"] == pytest.approx(1.32)
    assert doc["balanced"]["layers_per_stage"] in ([2, 4], [1, 5]) and doc["balanced"]["step_time_s"] <= 1.32 + 1e-9


def test_balance_layers_file_missing_field_is_one_line(tmp_path):
    doc = tmp_path / "layers.yaml"
    doc.write_text("pp: 2\nlayers: []\n")
    result = runner.invoke(app, ["balance", "--layers", str(doc)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "num_microbatches" in result.output


def test_balance_sapp_arrays_match_the_sapp_export():
    """balance printed offset[stage][chunk] and option names ([['full', 'full'], ...]); MindFormers
    (and autopar export --format sapp) take offset/recompute/select_recompute as [chunk][stage]
    layer counts (flat per stage without interleaving). Llama-3-8B, 32 layers, pp 2 vpp 2, stages
    14 + 18 (chunks 7+7, 9+9), full recompute on stage 0 and selective on stage 1: by hand offset
    7-8 = -1 and 9-8 = +1 per chunk, recompute [7, 0], select_recompute [0, 9]."""
    import numpy as np

    from autopar.export import sapp
    from autopar.strategy import Strategy
    from conftest import make_problem

    arrays = sapp.chunk_arrays(np.array([[7, 7], [9, 9]]), np.array([[7, 7], [0, 0]]), np.array([[0, 0], [9, 9]]))
    assert arrays == {"pipeline_stage": 2, "pp_interleave_num": 2, "offset": [[-1, 1], [-1, 1]],
                      "recompute": [[7, 0], [7, 0]], "select_recompute": [[0, 9], [0, 9]]}
    s = Strategy(dp=4, pp=2, vpp=2, schedule="interleaved", layers_per_stage=(14, 18),
                 recompute="full", recompute_per_stage=("full", "selective"))
    written = sapp.config(make_problem("llama3-8b", gbs=64, seq=4096), s)
    assert {k: written[k] for k in arrays} == arrays
    flat = sapp.chunk_arrays(np.array([[3], [5]]), np.array([[0], [5]]), np.array([[0], [0]]))
    assert flat == {"pipeline_stage": 2, "pp_interleave_num": 1, "offset": [-1, 1], "recompute": [0, 5],
                    "select_recompute": [0, 0]}


def test_balance_plot_into_a_missing_directory_is_one_line_before_any_output(tmp_path):
    """The table used to be printed first and the error after it."""
    result = runner.invoke(app, LLAMA8B_PP4 + ["--plot", str(tmp_path / "no" / "pipe.png")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --plot=") and "no directory" in lines[0]
