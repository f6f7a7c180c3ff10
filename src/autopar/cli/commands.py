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


def _usage_error() -> type:
    """click's ``UsageError`` as typer runs it (typer >= 0.20 carries its own copy of click)."""
    try:
        from typer._click.exceptions import UsageError
    except ImportError:  # pragma: no cover - older typer on click itself
        from click.exceptions import UsageError
    return UsageError


def refuse_repeats(ctx: Any, order: list[Any]) -> None:
    """Refuse an option given twice on the command line: click keeps the last value, so
    ``estimate -m a -m b`` estimated ``b`` and ``search --tp 2 --tp 4`` searched tp 4 only,
    without a word. Options declared repeatable (``--device-set``, ``--sbatch-option``) may
    repeat; a search constraint is pointed at its comma-separated set (``--tp 2,4``).

    Args:
        ctx: the command's click context (for the error's usage line).
        order: the parameters in the order click's parser met them, once per occurrence.
    Raises:
        UsageError: ``--tp given 2 times: give it once; ...``.
    """
    seen: dict[str, int] = {}
    for param in order:
        if getattr(param, "multiple", False) or getattr(param, "count", False) or not getattr(param, "opts", None):
            continue
        seen[param.name] = seen.get(param.name, 0) + 1
        if seen[param.name] == 2:
            option = max(param.opts, key=len)
            if getattr(param, "secondary_opts", None):
                option = f"{option}/{max(param.secondary_opts, key=len)}"
            hint = (f"; a set of values is one comma-separated value, e.g. {option} 2,4"
                    if getattr(param, "rich_help_panel", None) == "Constraints" and not param.is_flag
                    else " (the command line keeps only one value)")
            raise _usage_error()(f"{option} given more than once: give it once{hint}", ctx=ctx)


def takes_int(param: Any) -> bool:
    """Whether click parameter ``param`` is declared ``int`` (typer's type descriptor, or click's
    ``INT`` on a typer that runs on click itself)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is int or getattr(getattr(param, "type", None), "name", "") == "integer"


def refuse_loose_integers(ctx: Any, opts: dict[str, Any], params: list[Any]) -> None:
    """Refuse a value of an ``int`` option that is not :data:`autopar.integers.INTEGER_RULE`:
    Python's ``int()`` under typer read ``--tp 1_0`` as 10 and ``--tp 2.0`` as 2.

    Raises:
        UsageError: ``--tp='2.0': expected a whole number in the ASCII digits 0-9 (...)``.
    """
    from autopar.integers import INTEGER_RULE, is_integer_text

    for param in params:
        value = opts.get(param.name)
        if value is None or not takes_int(param):
            continue
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(text, str) and not is_integer_text(text):
                option = max(param.opts, key=len)
                raise _usage_error()(f"{option}={text!r}: expected {INTEGER_RULE}", ctx=ctx)


def parsing_once(parser: Any, ctx: Any) -> Any:
    """``parser`` (click's option parser of ``ctx``'s command), its ``parse_args`` also calling
    :func:`refuse_repeats` on the order it returns and :func:`refuse_loose_integers` on the
    values it read."""
    parse = parser.parse_args

    def parse_once(args: list[str]) -> Any:
        opts, rest, order = parse(args=args)
        refuse_repeats(ctx, order)
        refuse_loose_integers(ctx, opts, ctx.command.params)
        return opts, rest, order

    parser.parse_args = parse_once
    return parser


def refusing_repeats(command: Any) -> Any:
    """``command`` (a click command or group as typer built it), its parser and those of its
    sub-commands refusing an option given twice (:func:`parsing_once`); returns it. Done on the
    built objects, so a command typer builds itself (from modules already imported) is covered
    as one :func:`build_command` builds."""
    if not getattr(command, "_refuses_repeats", False):
        make = command.make_parser
        command.make_parser = lambda ctx: parsing_once(make(ctx), ctx)
        command._refuses_repeats = True
    for sub in (getattr(command, "commands", None) or {}).values() if not isinstance(command, LazyGroup) else ():
        refusing_repeats(sub)
    return command


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
            for info in group.typer_instance.registered_commands:
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

    def make_parser(self, ctx: Any) -> Any:
        """The group's own options (``--config``) also refuse being given twice (:func:`refuse_repeats`)."""
        return parsing_once(super().make_parser(ctx), ctx)

    @property  # type: ignore[override]
    def commands(self) -> MutableMapping[str, Any]:
        for name in COMMANDS:
            self.get_command(None, name)  # type: ignore[arg-type]
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, Any]) -> None:
        self._loaded = value  # what typer built from the commands already registered
        for command in value.values():
            refusing_repeats(command)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, its module imported and the command built on first use."""
        if cmd_name not in self._loaded:
            from autopar.cli.app import app

            command = build_command(app, cmd_name)
            if command is None:
                return None
            self._loaded[cmd_name] = refusing_repeats(command)
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
