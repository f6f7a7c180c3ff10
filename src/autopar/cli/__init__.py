"""The ``autopar`` command line (typer + rich), one module per command.

User errors print one line (``error: ...``) on stderr and exit with code 2; they never show a
traceback. ``--json`` prints one stable JSON document on stdout. :data:`app` and :func:`main`
live in :mod:`autopar.cli.app`; importing this package registers every command on it.
"""

from autopar.cli.app import app, main
from autopar.cli import search, estimate, devices, validate, export  # noqa: F401  (register the commands)
from autopar.cli import balance, verify  # noqa: F401  (register `autopar balance`, `verify`, `calibrate`)
from autopar.cli import plan  # noqa: F401  (register `autopar plan`)
from autopar.cli.profile import profile_app

app.add_typer(profile_app, name="profile")

__all__ = ["app", "main"]
