"""The README's accuracy paragraph quotes the shipped validation errors (row_errors.json, which
``python -m autopar.validate.bands`` regenerates from ``autopar validate``): a change of the cost
model's accuracy must update it."""

from __future__ import annotations

import re
from pathlib import Path

from autopar.validate.bands import shipped_errors

README = Path(__file__).resolve().parents[2] / "README.md"


def _errors(kind: str, family: str, precision: str | None) -> list[float]:
    return [r["error_pct"] for r in shipped_errors() if r["kind"] == kind and r["family"] == family
            and (precision is None or r["precision"] == precision)]


def test_readme_quotes_the_current_mape_and_max_per_set():
    text = " ".join(README.read_text().split())
    sets = {"dense": _errors("step_time", "dense", "bf16/fp16"), "fp8": _errors("step_time", "dense", "fp8"),
            "MoE": _errors("step_time", "MoE", None)}
    mape = {k: sum(map(abs, v)) / len(v) for k, v in sets.items()}
    assert f"dense bf16/fp16 step time {mape['dense']:.1f}% mean absolute error ({len(sets['dense'])} rows)" in text
    assert f"fp8 dense {mape['fp8']:.1f}% ({len(sets['fp8'])} rows)" in text
    assert f"mixture-of-experts step time {mape['MoE']:.1f}% ({len(sets['MoE'])} rows)" in text
    worst = {k: max(map(abs, v)) for k, v in sets.items()}
    assert re.search(rf"up to {worst['dense']:.1f}% \(dense\), {worst['fp8']:.1f}% \(fp8\) and "
                     rf"{worst['MoE']:.0f}% \(MoE\)", text)
