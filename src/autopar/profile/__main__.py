"""``python -m autopar.profile ...`` = ``autopar profile ...`` (what ``torchrun -m autopar.profile comm`` runs)."""

import sys

from autopar.cli import app

app(["profile", *sys.argv[1:]], prog_name="autopar")
