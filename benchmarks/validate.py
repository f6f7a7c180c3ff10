"""Regenerate the accuracy report: ``python benchmarks/validate.py [OUT_DIR]``.

Same as ``autopar validate --out OUT_DIR`` (default ``out/validation``); paste
``OUT_DIR/accuracy.md`` into the README's "Accuracy" section.
"""

import sys

from autopar.validate import DEFAULT_CSV, run_validation

if __name__ == "__main__":
    _, paths = run_validation(DEFAULT_CSV.resolve(), sys.argv[1] if len(sys.argv) > 1 else "out/validation")
    print("\n".join(str(p) for p in paths.values()))
