"""``autopar validate``: score autopar against the published measurements."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from autopar.cli.app import app, console, err_console, user_errors
from autopar.cli.json_output import print_json
from autopar.cli.options import Json
from autopar.cli.paths import refuse_overwriting_inputs
from autopar.errors import AutoparError

# The files ``autopar validate`` writes into ``--out`` (autopar.validate.report.write_report).
VALIDATE_FILES = ("accuracy.md", "rows.md", "scatter.png")


@app.command()
@user_errors
def validate(
    csv_path: Annotated[Optional[str], typer.Option("--csv", help="measurements CSV (default: "
                                                    "the published measurements shipped with autopar)")] = None,
    out: Annotated[str, typer.Option("--out", help="report directory")] = "out/validation",
    as_json: Json = False,
) -> None:
    """Score autopar against published measurements; write accuracy.md, rows.md, scatter.png."""
    from pathlib import Path

    from autopar.validate import DEFAULT_CSV, run_validation

    refuse_overwriting_inputs({"--csv": csv_path or DEFAULT_CSV},
                              {"--out": (out, [Path(out) / name for name in VALIDATE_FILES])})
    try:
        results, paths = run_validation(csv_path or DEFAULT_CSV.resolve(), out)
    except OSError as err:
        raise AutoparError(f"--out={out!r}: cannot write the report ({err.strerror})") from None
    if as_json:
        from autopar.validate.report import validation_doc

        err_console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)
        print_json("validate", {"csv": str(csv_path or DEFAULT_CSV), **validation_doc(results),
                                "written": [str(p) for p in paths.values()]})
        return
    console.print(paths["accuracy"].read_text(), highlight=False, markup=False)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)
