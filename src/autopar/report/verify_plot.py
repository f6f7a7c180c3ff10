"""The ``autopar verify`` picture: predicted vs measured step time per layout (matplotlib PNG)."""

from __future__ import annotations

from autopar.report.plots import _png, plt


def verify_chart(rows: list[tuple[str, float, float | None, str | None]]) -> bytes:
    """PNG: one pair of horizontal bars per layout, in the report's order (measured fastest at
    the top): the predicted step time (s) and the measured one beside it, with the signed error
    of the prediction; a failed run has only its predicted bar and says why (``failed: kind``).

    Args:
        rows: ``(label, predicted_step_s, measured_step_s or None, failure kind or None)`` in
            report order (:func:`autopar.verify.report.ranked`).
    Raises:
        ValueError: no rows.
    """
    if not rows:
        raise ValueError("verify_chart needs at least one layout")
    n = len(rows)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * n))
    ys = list(range(n))[::-1]  # first row at the top
    height = 0.38
    top = max(max(p, m or 0.0) for _, p, m, _ in rows)
    for y, (label, predicted, measured, failure) in zip(ys, rows):
        ax.barh(y + height / 2, predicted, height, color="#8c8c8c", label="predicted" if y == ys[0] else None)
        if measured is not None:
            ax.barh(y - height / 2, measured, height, color="#4c72b0", label="measured" if y == ys[0] else None)
            ax.text(max(predicted, measured) + top * 0.01, y, f"{(predicted - measured) / measured:+.0%}",
                    va="center", fontsize=8)
        else:
            ax.text(top * 0.01, y - height / 2, f"failed: {failure or 'no measurement'}", va="center", fontsize=8,
                    color="#c44e52")
    ax.set_yticks(ys, [label for label, *_ in rows], fontsize=8)
    ax.set_xlim(0, top * 1.15)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("step time (s); the % is the prediction's error against the measurement")
    ax.set_title("autopar verify: predicted vs measured, measured fastest first", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
