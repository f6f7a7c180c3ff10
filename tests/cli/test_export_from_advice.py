"""``export --from`` of a layout the format's writer refuses says what to do: the layout options the
writer names cannot be combined with ``--from``, so the line points at searching again with
``--target`` (a new user followed "--no-tp-comm-overlap" into "--from with --tp-comm-overlap")."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autopar.cli import app
from test_bad_input import error_line_of

runner = CliRunner()


def test_refused_layout_from_a_result_points_at_search_target(tmp_path):
    result = runner.invoke(app, ["search", "-m", "llama3-70b", "--device", "h100-80gb", "--nodes", "8",
                                 "--gbs", "512", "--zero", "1", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["layouts"][0]["strategy"]
    assert top["zero"] == 1  # Galvatron's data-parallel types are ddp, zero2 and zero3
    path = tmp_path / "result.json"
    path.write_text(result.stdout)
    line = error_line_of(runner.invoke(app, ["export", "--format", "galvatron", "--from", str(path)]))
    assert line.startswith("error: Galvatron cannot express this layout: zero=1")
    assert f"the layout is --from {path}'s: search again with --target galvatron" in line
