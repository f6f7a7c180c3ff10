"""``python -m autopar.profile ...`` = ``autopar profile ...`` (what ``torchrun -m autopar.profile comm`` runs)."""

import sys

from autopar.cli import main

sys.argv[1:1] = ["profile"]
main(prog_name="autopar")
