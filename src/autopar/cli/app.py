"""The ``autopar`` typer application and what every command shares: the consoles, the
:func:`user_errors` wrapper (one ``error:`` line, exit code 2) and the console entry point
:func:`main`. The commands live one per module beside this one and register themselves on
:data:`app` when :mod:`autopar.cli` imports them.
"""

from __future__ import annotations

import atexit
import gc
import sys
import typing
from functools import wraps
from typing import Any, Callable, ContextManager

import typer
from rich.console import Console
from rich.markup import escape

from autopar.cli.commands import LazyGroup
from autopar.cli.config import Config
from autopar.cli.paths import refuse_empty
from autopar.errors import AutoparError
from autopar.notices import take_warnings

app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Plan the parallel layout of LLM training before spending GPU hours.")
# Pipes and CI logs get a wide console so the tables are not squeezed to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


@app.callback()
def _options_file(config: Config = None) -> None:
    """Plan the parallel layout of LLM training before spending GPU hours."""


def option_names(fn: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> the long option a user types for it (``from_result`` -> ``--from``), read
    from the command's ``typer.Option`` declarations (``--`` + the name with dashes where none)."""
    names = {}
    for param, hint in typing.get_type_hints(fn, include_extras=True).items():
        decls = [d for meta in getattr(hint, "__metadata__", ()) if isinstance(meta, typer.models.OptionInfo)
                 for d in (meta.default, *meta.param_decls) if isinstance(d, str)]  # Annotated: default = "--x"
        names[param] = next((d.split("/")[0] for d in decls if d.startswith("--")), "--" + param.replace("_", "-"))
    return names


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn :class:`AutoparError` into one red line on stderr and exit code 2; on success print
    the queued :func:`autopar.notices.warn_on_success` lines. An option given as an empty
    string is refused before the command runs (:func:`autopar.cli.paths.refuse_empty`)."""
    names: dict[str, str] = {}

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        take_warnings()
        try:
            names.update(names or option_names(fn))
            refuse_empty({names.get(k, k): v for k, v in kwargs.items()})
            result = fn(*args, **kwargs)
        except AutoparError as err:
            err_console.print(f"[red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        finally:
            queued = take_warnings()
        for message in queued:
            err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
        return result

    return wrapper


def on_terminals() -> bool:
    """Whether stdout and stderr are both a terminal."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def progress_shown(quiet: bool) -> ContextManager[None]:
    """The progress display of slow phases (:mod:`autopar.progress`) on stderr, or nothing: off
    with ``--quiet`` and whenever stdout or stderr is not a terminal (a pipe, a file, CI), so
    progress never mixes into output that is read back (``--json > out.json``)."""
    from contextlib import nullcontext

    if quiet or not on_terminals():
        return nullcontext()
    from autopar.progress import display

    return display(err_console)


def _is_validation_error(err: BaseException | None) -> bool:
    """Whether ``err`` is a pydantic ``ValidationError`` (pydantic imported only if it is loaded)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(err, pydantic.ValidationError)


def main(prog_name: str | None = None) -> None:
    """Console entry point (``autopar``; ``prog_name`` names it in usage lines): :data:`app`, with click's usage errors (unknown option,
    ``--gbs 1.5``, missing value) printed as one ``error:`` line naming the option, exit code 2.

    Typer's standalone mode would print them in a multi-line box; a bare ``autopar`` (or a group
    without a command) still shows the help. Exit codes: 0 success, 1 abort, 2 user error, 3 ``verify``
    ran its jobs and none measured a step time.
    """
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)  # the interpreter's last collections at exit then skip every object
    try:
        code = app(standalone_mode=False, prog_name=prog_name)
    except typer.TyperException as err:  # typer's vendored click errors
        if type(err).__name__ == "NoArgsIsHelpError":
            from typer.rich_utils import rich_format_error  # rich markdown: only for this help box

            rich_format_error(err)  # the help text, as standalone typer shows it
            sys.exit(err.exit_code)
        where = f" (see '{err.ctx.command_path} --help')" if getattr(err, "ctx", None) else ""
        cause = err.__cause__  # typer's value coercion: a pydantic error that holds the input
        got = f" (got {cause.errors()[0]['input']!r})" if _is_validation_error(cause) else ""
        err_console.print(f"[red]error:[/] {escape(err.format_message())}{escape(got + where)}", highlight=False,
                          soft_wrap=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        err_console.print("aborted", highlight=False)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
