"""The ``autopar`` command line (typer + rich), one module per command.

User errors print one line (``error: ...``) on stderr and exit with code 2; they never show a
traceback. ``--json`` prints one stable JSON document on stdout. :data:`app` and :func:`main`
live in :mod:`autopar.cli.app`; each command's module registers it on :data:`app` when that
command is first looked up (:mod:`autopar.cli.commands`), so a command imports only what it uses.
"""

from autopar.cli.app import app, main

__all__ = ["app", "main"]
