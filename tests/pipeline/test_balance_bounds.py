"""The work bounds of ``autopar balance``: micro-batches, layers, recompute options and the size of
a ``--layers`` file are refused with one error line before the work (or the memory) they would
cost; 100,000 micro-batches run within the bound (the steady state, autopar.pipeline.steady)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.pipeline import layers_file
from autopar.pipeline.balance import balance
from autopar.pipeline.layers_file import load_layers_file
from test_bad_input import LAYERS_DOC, one_line_error


def _write(tmp_path, doc) -> str:
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_microbatch_bound_is_checked_before_allocating(tmp_path):
    table = load_layers_file(_write(tmp_path, LAYERS_DOC)).table
    tracemalloc.start()
    with pytest.raises(AutoparError, match="num_microbatches=1000000000000: balancing takes at most 100,000"):
        balance(table, 1, 10**12, "1f1b")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1e6


def test_balance_of_100000_microbatches_is_the_1f1b_closed_form(tmp_path):
    """16 equal layers (10 + 20 ms) on pp 4: 4 layers a stage, (m + pp - 1) * 0.12 s; the
    event simulation of all 100,000 micro-batches took minutes and gigabytes."""
    path = _write(tmp_path, {**LAYERS_DOC, "num_microbatches": 100_000})
    out = CliRunner().invoke(app, ["balance", "--layers", path, "--options", "none"])
    assert out.exit_code == 0, out.output
    assert f"balanced {(100_000 + 3) * 0.12:.2f} s" in out.stdout  # 12000.36 s
    assert "gain +0.0%" in out.stdout
    path = _write(tmp_path, {**LAYERS_DOC, "num_microbatches": 100_001})
    assert "balancing takes at most 100,000 micro-batches" in one_line_error(["balance", "--layers", path])


def test_layers_file_over_the_size_bound_is_not_read(tmp_path, monkeypatch):
    path = _write(tmp_path, LAYERS_DOC)
    size = (tmp_path / "layers.json").stat().st_size
    monkeypatch.setattr(layers_file, "MAX_FILE_BYTES", 100)
    monkeypatch.setattr(layers_file, "read_text", lambda *a: pytest.fail("the file was read"))
    err = one_line_error(["balance", "--layers", path])
    assert err.endswith(f"{size:,} bytes, beyond the 100 a table of 1,024 layers needs")


@pytest.mark.parametrize("name, bound, needle", [
    ("MAX_LAYERS", 8, "16 layers: balancing splits at most 8 layers"),
    ("MAX_OPTIONS", 1, "layers[0].activation_bytes has 2 recompute options, at most 1"),
])
def test_layers_file_over_a_bound_is_refused_before_the_table(tmp_path, monkeypatch, name, bound, needle):
    """Refused while reading the file: the layer table (layers x options arrays) is never built."""
    monkeypatch.setattr(layers_file, name, bound)
    monkeypatch.setattr(layers_file, "LayerTable", lambda **kw: pytest.fail("the table was built"))
    path = _write(tmp_path, LAYERS_DOC)
    assert needle in one_line_error(["balance", "--layers", path])
    with pytest.raises(AutoparError, match="balancing|recompute options"):
        load_layers_file(path)
