"""PNG plots for the CLI. matplotlib is optional (``pip install "lossscale[plot]"``).

Each function returns the path written, or raises :class:`PlotUnavailable` with
a one-line explanation when matplotlib is missing.
"""

import math

from lossscale.demo.diagnostics import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailable(
            'matplotlib is not installed; no PNG written (pip install "lossscale[plot]" to get plots)'
        ) from error
    return plt


def _plottable(value):
    """Whether ``value`` can be drawn on a logarithmic axis (finite and > 0)."""
    return math.isfinite(value) and value > 0


def _draw_scale(axis, records, label=None, color=None):
    """The scale each step used (log2 axis; a scale of 0 or inf is left out), overflows marked."""
    drawn = [r for r in records if _plottable(r["loss_scale"])]
    axis.step([r["step"] for r in drawn], [r["loss_scale"] for r in drawn], where="post", label=label, color=color)
    skipped = [r for r in drawn if r["overflow"]]
    if skipped:
        axis.plot(
            [r["step"] for r in skipped],
            [r["loss_scale"] for r in skipped],
            "x",
            color=color or "red",
            markersize=4,
            label=None if label else "overflow (step skipped)",
        )
    if drawn:
        axis.set_yscale("log", base=2)
    axis.set_ylabel("loss scale")


def _draw_loss(axis, records, **style):
    """The training loss per step (log axis; non-finite and non-positive losses are left out)."""
    drawn = [r for r in records if _plottable(r["loss"])]
    axis.plot([r["step"] for r in drawn], [r["loss"] for r in drawn], linewidth=0.8, **style)
    return bool(drawn)


def _legend(axis):
    """A legend if something on ``axis`` has a label (matplotlib warns about an empty one)."""
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="best")


def _finish(plt, figure, top, bottom, title, path, loss_drawn=True):
    """Shared tail of the two-panel plots: labels, legends (where something is labelled), save, close."""
    if loss_drawn:
        top.set_yscale("log")
    top.set_ylabel("training loss")
    top.set_title(title)
    _legend(top)
    bottom.set_xlabel("step")
    _legend(bottom)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _save_single(plt, figure, axis, title, path):
    """Shared tail of the one-panel plots: title, legend (if something is labelled), save, close."""
    axis.set_title(title)
    _legend(axis)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_training(records, path, title):
    """Loss (top) and loss scale with skipped steps marked (bottom) over training steps."""
    plt = _pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    drawn = _draw_loss(top, records)
    _draw_scale(bottom, records)
    return _finish(plt, figure, top, bottom, title, path, drawn)


def plot_comparison(runs, path, title):
    """Training loss of every run (top) and the loss scale of the scaled runs (bottom).

    ``runs`` maps a label to that run's monitor records.
    """
    plt = _pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 7))
    drawn = False
    for index, (label, records) in enumerate(runs.items()):
        color = f"C{index}"
        drawn = _draw_loss(top, records, label=label, color=color) or drawn
        if len({r["loss_scale"] for r in records}) > 1 or records and records[0]["loss_scale"] != 1.0:
            _draw_scale(bottom, records, label=label, color=color)
    return _finish(plt, figure, top, bottom, title, path, drawn)


def plot_headroom(runs, path, title):
    """The loss scale of each run at every step (overflows marked) and, dotted, its measured largest safe scale.

    ``runs`` maps a label to ``(records, [(step, largest safe scale or None)])``.
    """
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for index, (label, (records, measured)) in enumerate(runs.items()):
        _draw_scale(axis, records, label=label, color=f"C{index}")
        safe = [(step, value) for step, value in measured if value is not None]
        if safe:
            axis.plot(*zip(*safe), "o:", color=f"C{index}", markersize=3, label=f"{label}: largest safe")
    axis.set_xlabel("step")
    return _save_single(plt, figure, axis, title, path)


def plot_histogram(log2_magnitudes, scale, path, title):
    """Histogram of log2|gradient| shifted by log2(scale), against the float16 range."""
    plt = _pyplot()
    shift = math.log2(scale)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    axis.hist([v + shift for v in log2_magnitudes], bins=120, color="tab:blue", alpha=0.8)
    axis.axvspan(
        min(min(log2_magnitudes) + shift, -40),
        math.log2(FP16_MIN_SUBNORMAL) - 1,
        color="red",
        alpha=0.12,
        label="flushed to zero in fp16",
    )
    axis.axvspan(
        math.log2(FP16_MIN_SUBNORMAL) - 1,
        math.log2(FP16_MIN_NORMAL),
        color="orange",
        alpha=0.12,
        label="fp16 subnormal (precision lost)",
    )
    axis.axvline(math.log2(FP16_MAX), color="black", linestyle="--", label="fp16 max (65504)")
    axis.set_xlabel(f"log2 |gradient x scale|   (scale = 2^{shift:g})")
    axis.set_ylabel("elements")
    return _save_single(plt, figure, axis, title, path)
