"""``--help``: every documented default shown, option names whole at 80 columns."""

from __future__ import annotations

import re

import typer.main
from typer.testing import CliRunner

from autopar.cli import app

# Wide enough that no help line wraps (rich reads COLUMNS; typer caps help at TERMINAL_WIDTH).
runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


def test_help_shows_every_documented_default():
    """Help texts say "[default: X]" for options whose real default is None (script value or
    fallback); rich used to eat the bracket as a markup tag, so --help showed no default at all."""
    group = typer.main.get_command(app)
    checked = 0
    for name, command in group.commands.items():
        if not hasattr(command, "params") or name == "profile":
            continue
        rendered = " ".join(runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"}).output.split())
        for param in command.params:
            for default in re.findall(r"\[default: [^\]]*\]", param.help or ""):
                assert " ".join(default.split()) in rendered, f"{name} --help lost {default!r} of {param.opts}"
                checked += 1
    assert checked >= 19  # 17 in cli/options.py's shared options (search/estimate/export) + 2 of balance


def _commands(group, path: list[str]) -> list[tuple[list[str], object]]:
    """Every command under ``group`` with the argv that reaches it, sub-commands of groups
    (``profile ops``) included."""
    out = []
    for name, command in getattr(group, "commands", {}).items():
        out.append(([*path, name], command))
        out += _commands(command, [*path, name])
    return out


def test_help_at_80_columns_shows_every_option_name_whole():
    """``--help`` on an 80-column terminal names every option in full (rich's option table cut
    68 of them, e.g. ``--make-vocab-size…``, so a user could not tell what to type); the
    sub-commands of ``profile`` too."""
    commands = _commands(typer.main.get_command(app), [])
    assert {"profile ops", "profile layer", "profile comm", "search", "balance"} <= {" ".join(a) for a, _ in commands}
    for argv, command in commands:
        result = runner.invoke(app, [*argv, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0 and "…" not in result.output
        assert max(map(len, result.output.splitlines())) <= 80, argv
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt in result.output, f"{' '.join(argv)} --help lacks {opt}"


def test_estimate_help_defaults_by_hand():
    out = " ".join(runner.invoke(app, ["estimate", "--help"]).output.split())
    for text in ("sequence length (tokens) [default: 4096]", "global batch size (sequences per step) [default: 1024]",
                 "none | selective | full [default: none]", "Megatron distributed optimizer [default: 1]"):
        assert text in out


def test_constraint_examples_are_values_each_option_takes():
    """search --help said "e.g. 1,2,4" for every constraint: --zero has no stage 4 and --recompute
    takes names. Each example now parses as that option's own set of values."""
    from autopar.search.constraints import FIELD_BY_OPTION, parse_values

    group = typer.main.get_command(app)
    params = {p.opts[0]: p for p in group.commands["search"].params if p.opts}
    checked = []
    for option, spec in FIELD_BY_OPTION.items():
        found = option in params and re.search(r"e\.g\. ([^)]*)\)", params[option].help or "")
        if not found:  # --sp, --tp-comm-overlap, ...: on/off switches without a value
            continue
        example = found.group(1)
        checked.append(option)
        assert len(parse_values(spec, example)) >= 2, (option, example)  # raises on a value the option refuses
    assert {"--tp", "--zero", "--recompute", "--schedule", "--cp-comm-type"} <= set(checked)
    assert "e.g. 1,2)" in params["--zero"].help and "e.g. none,selective)" in params["--recompute"].help
    out = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--zero", "5"])
    assert out.exit_code == 2 and out.output.rstrip().endswith("in 0..3 or a comma-separated set of them, e.g. 1,2")
