"""Which module registers each ``autopar`` command, and the click group that imports a command's
module only when that command runs (click's "lazily loading subcommands" pattern).

``autopar search`` then never imports what ``balance`` (highspy's integer program), ``profile``,
``verify`` or ``validate`` need, and ``autopar --help`` lists the commands from :data:`COMMANDS`
without importing any of them (numpy and the pydantic specs included).
"""

from __future__ import annotations

import gc
import importlib
from typing import Any, MutableMapping

import typer.core
import typer.main

# command -> (the module whose import registers it on autopar.cli.app.app, the first paragraph of
# its help as `autopar --help` lists it; tests/cli/test_cli_lazy_commands.py checks both).
COMMANDS: dict[str, tuple[str, str]] = {
    "search": ("autopar.cli.search",
               "Search every valid layout, drop those that do not fit, rank the rest by step time."),
    "estimate": ("autopar.cli.estimate",
                 "Estimate memory (per stage) and step time (with breakdown) of one explicit layout."),
    "devices": ("autopar.cli.devices",
                "List the device presets and their numbers (--json: every field, the names each preset answers "
                "to, the export formats that run on it and the fp8 recipes it runs)."),
    "validate": ("autopar.cli.validate",
                 "Score autopar against published measurements; write accuracy.md, rows.md, errors.png."),
    "export": ("autopar.cli.export",
               "Write one layout as a framework config: a search result's (--from, --rank) or an explicit one."),
    "balance": ("autopar.cli.balance",
                "Balance pipeline stages: layers (per chunk) and recompute per stage vs the even split."),
    "verify": ("autopar.cli.verify",
               "Run the top layouts for a few iterations in your framework; predicted vs measured, re-ranked."),
    "calibrate": ("autopar.cli.verify",
                  "Fit the model's efficiency factors to the stored runs (NNLS); later searches with --profile-db "
                  "use them."),
    "plan": ("autopar.cli.plan",
             "Profile where a GPU is present, search, and write the target's configs into one folder."),
    "profile": ("autopar.cli.profile", "Measure operators, layers and collectives into a profile DB."),
}


def import_all() -> None:
    """Import every command's module, registering each command on ``autopar.cli.app.app``: for
    code that reads ``app.registered_commands`` rather than the click group (which loads on demand)."""
    for module, _ in COMMANDS.values():
        importlib.import_module(module)


def build_command(app: typer.Typer, name: str) -> Any:
    """The click command (or group, for ``profile``) of ``name`` as typer builds it, importing
    the module that registers it on ``app`` first; None for a name that is no command.

    The command is built with ``app``'s settings, as ``typer.main.get_command(app)`` would
    build it had the module been imported before."""
    if name not in COMMANDS:
        return None
    collecting = gc.isenabled()
    gc.disable()  # importing builds ~40,000 long-lived objects and little garbage: no collection pays off
    try:
        importlib.import_module(COMMANDS[name][0])
    finally:
        gc.freeze()  # and they live as long as the process: keep them out of the command's collections
        if collecting:
            gc.enable()
    for info in app.registered_commands:
        if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:
            return typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                                    rich_markup_mode=app.rich_markup_mode)
    for group in app.registered_groups:
        if group.name == name:
            return typer.main.get_group_from_info(group, pretty_exceptions_short=app.pretty_exceptions_short,
                                                  suggest_commands=app.suggest_commands,
                                                  rich_markup_mode=app.rich_markup_mode)
    raise LookupError(f"{COMMANDS[name][0]} registers no command {name!r}")  # a wrong COMMANDS entry


class LazyGroup(typer.core.TyperGroup):
    """The top-level ``autopar`` group: a command's module is imported when the command is
    looked up (run, ``CMD --help``), not when the group is built.

    ``commands`` (click's mapping name -> command) loads every command when read, so code
    that walks it (``--config`` checking every section, the docs' reference page, typer's "did
    you mean" on a mistyped command) sees them all; running one command reads only
    :meth:`get_command`.
    """

    @property  # type: ignore[override]
    def commands(self) -> MutableMapping[str, Any]:
        for name in COMMANDS:
            self.get_command(None, name)  # type: ignore[arg-type]
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, Any]) -> None:
        self._loaded = value  # what typer built from the commands already registered

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, its module imported and the command built on first use."""
        if cmd_name not in self._loaded:
            from autopar.cli.app import app

            command = build_command(app, cmd_name)
            if command is None:
                return None
            self._loaded[cmd_name] = command
        return self._loaded[cmd_name]

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command name, in :data:`COMMANDS` order, without importing any."""
        return list(dict.fromkeys([*COMMANDS, *self._loaded]))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The "Commands" section of ``autopar --help``: each name and the start of its help, read
        from :data:`COMMANDS` for the commands not imported yet (the same text their modules give)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            command = self._loaded.get(name) or typer.core.TyperCommand(name=name, help=COMMANDS[name][1])
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)
