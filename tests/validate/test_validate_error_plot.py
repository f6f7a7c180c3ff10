"""``autopar validate``'s ``errors.png``: signed error per row, grouped by source and device,
+-MAPE band, 20%/30% lines, errors beyond the axis written on its edge."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest

from autopar.validate.error_plot import AXIS_PCT, error_groups, errors_figure, errors_png
from autopar.validate.measurements import Row
from autopar.validate.score import Result


def _result(family: str, device: str, metric: str, measured: float, predicted: float | None,
            moe: bool = False, precision: str = "bf16") -> Result:
    """A scored row with just what the plot reads: source, device, model kind, precision."""
    case = SimpleNamespace(family=SimpleNamespace(name=family), precision=precision,
                           problem=SimpleNamespace(model=SimpleNamespace(is_moe=moe),
                                                   cluster=SimpleNamespace(device=SimpleNamespace(name=device))))
    row = Row({"id": f"{family}-{measured}", "measured_metric": metric, "measured_value": str(measured)})
    return Result(row, case if predicted is not None else None, predicted)


RESULTS = [
    _result("nemo", "h100-80gb", "step_time", 10.0, 11.0),  # +10%
    _result("nemo", "h100-80gb", "step_time", 10.0, 9.0),  # -10%
    _result("nemo", "h100-80gb", "peak_mem_per_gpu", 50.0, 55.0),  # +10% (memory)
    _result("nemo", "gb200", "mfu", 0.4, 0.3, precision="fp8"),  # -25%
    _result("generic", "h100-80gb", "step_time", 1.0, 2.27, moe=True),  # +127%: beyond the axis
    _result("nemo", "h100-80gb", "step_time", 10.0, None),  # not scored
    _result("nemo", "h100-80gb", "oom_observed", 1.0, 1.0),  # boolean: no error
]


def test_groups_are_source_and_device_of_rows_with_an_error():
    groups = error_groups(RESULTS)
    assert list(groups) == ["generic · h100-80gb", "nemo · gb200", "nemo · h100-80gb"]
    assert [len(rows) for rows in groups.values()] == [1, 1, 3]


def test_errors_are_signed_percent_with_the_mape_band_and_reference_lines():
    """Errors +10, -10, +10, -25, +127: MAPE = 182 / 5 = 36.4%. The axis stops at +-AXIS_PCT, so
    the +127% row is a triangle on the right edge with its value written beside it."""
    fig = errors_figure(RESULTS)
    try:
        ax = fig.axes[0]
        assert ax.get_xlim() == (-AXIS_PCT, AXIS_PCT)
        assert [t.get_text() for t in ax.get_yticklabels()] == ["generic · h100-80gb", "nemo · gb200", "nemo · h100-80gb"]
        band = ax.patches[0]  # the +-MAPE band (axvspan)
        assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((-36.4, 36.4))
        lines = sorted(round(line.get_xdata()[0], 6) for line in ax.lines)
        assert lines == [-30, -20, 0, 20, 30]
        texts = [t.get_text() for t in ax.texts]
        assert "+127%" in texts
        assert "3 rows, MAPE 10.0%" in texts and "1 rows, MAPE 25.0%" in texts
        points = np.concatenate([c.get_offsets() for c in ax.collections])
        assert sorted(points[:, 0].round(6).tolist()) == [-25, -10, 10, 10, AXIS_PCT]
        assert "+-MAPE 36.4%" in ax.get_title() and "5 scored rows" in ax.get_title()
    finally:
        plt.close(fig)


def test_no_row_with_an_error_still_writes_the_file(tmp_path):
    errors_png(RESULTS[-2:], tmp_path / "errors.png")
    assert (tmp_path / "errors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
