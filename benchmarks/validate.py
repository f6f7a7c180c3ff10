"""Regenerate the accuracy report: ``python benchmarks/validate.py [OUT_DIR] [--readme]``.

Same as ``autopar validate --out OUT_DIR`` (default ``out/validation``). With ``--readme`` the
README's "Accuracy" section, from its ``Rows:`` line to the next ``## `` heading, is replaced by
``OUT_DIR/accuracy.md`` verbatim, so the table there is always the command's output.
"""

import argparse
import re
from pathlib import Path

from autopar.validate import DEFAULT_CSV, run_validation

README = Path(__file__).resolve().parents[1] / "README.md"


def update_readme(accuracy_md: str, readme: Path = README) -> None:
    """Replace the generated part of the README's Accuracy section with ``accuracy_md``."""
    text = readme.read_text()
    pattern = re.compile(r"(## Accuracy\n.*?\n)Rows: .*?(?=\n## |\Z)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme}: no '## Accuracy' section with a 'Rows:' line")
    readme.write_text(pattern.sub(lambda m: m.group(1) + accuracy_md.rstrip("\n") + "\n", text, count=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].replace("``", ""))
    parser.add_argument("out_dir", nargs="?", default="out/validation", help="report folder (default out/validation)")
    parser.add_argument("--readme", action="store_true", help="also paste accuracy.md into README.md")
    args = parser.parse_args()
    _, paths = run_validation(DEFAULT_CSV.resolve(), args.out_dir)
    print("\n".join(str(p) for p in paths.values()))
    if args.readme:
        update_readme(Path(paths["accuracy"]).read_text())
        print(f"updated {README}")
