"""Regenerate the accuracy report: ``python benchmarks/validate.py [OUT_DIR]``.

Same as ``autopar validate --out OUT_DIR`` (default ``out/validation``). The documentation's
accuracy page (``docs/accuracy.md``) shows the command's output and is re-run by the test suite;
``python tools/docs_examples.py --update`` rewrites it after the numbers move.
"""

import argparse

from autopar.validate import DEFAULT_CSV, run_validation

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].replace("``", ""))
    parser.add_argument("out_dir", nargs="?", default="out/validation", help="report folder (default out/validation)")
    args = parser.parse_args()
    _, paths = run_validation(DEFAULT_CSV.resolve(), args.out_dir)
    print("\n".join(str(p) for p in paths.values()))
