"""``python -m autopar ...`` = ``autopar ...`` (e.g. where the console script is not on PATH)."""

from autopar.cli import main

main()
