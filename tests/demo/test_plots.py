"""The command line's plots draw what their captions say: matplotlib's artists are read when the figure would be
saved (the PNG itself is checked only for existence and size, in tests/demo/test_cli.py)."""

import math
import sys
import warnings

import matplotlib
import matplotlib.figure
import matplotlib.pyplot as plt
import pytest

from lossscale.demo import plots
from lossscale.demo.diagnostics import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL


@pytest.fixture(name="drawn")
def _drawn(monkeypatch):
    """The figures the plots would have written, in order; nothing is written, and matplotlib's warning about a
    legend with nothing labelled (its wording before and after 3.6) fails the test."""
    figures, open_before = [], plt.get_fignums()
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda figure, path, **_: figures.append(figure))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No (artists|handles) with labels found to put in legend")
        yield figures
    assert plt.get_fignums() == open_before  # each plot closes its figure (pyplot keeps open ones forever)


def _records(losses, scales, overflows):
    return [
        {"step": step, "loss": loss, "loss_scale": scale, "overflow": overflow}
        for step, (loss, scale, overflow) in enumerate(zip(losses, scales, overflows))
    ]


def _xy(line):
    return list(line.get_xdata()), list(line.get_ydata())


def _x_extent(patch):
    """(left, right) of a band drawn by axvspan, in data coordinates (a Rectangle from matplotlib 3.9, a Polygon
    before)."""
    xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
    return float(xs.min()), float(xs.max())


def _bands(axis):
    """The axvspan bands of a histogram's axis, in drawing order (the other patches are the histogram's bars)."""
    bars = axis.containers[0].patches
    return [_x_extent(patch) for patch in axis.patches if patch not in bars]


def _legend_texts(axis):
    legend = axis.get_legend()
    return [] if legend is None else [text.get_text() for text in legend.get_texts()]


SKIPPING_RUN = _records(
    [1.0, math.inf, 0.5, math.nan, 0.25, 0.2], [8.0, 8.0, 4.0, 4.0, 2.0, 4.0], [False, True, False, True, False, False]
)


def test_training_plot_draws_finite_losses_and_marks_the_skipped_steps_on_the_scale(drawn):
    assert plots.plot_training(SKIPPING_RUN, "training.png", "a run") == "training.png"
    top, bottom = drawn[0].axes
    assert [_xy(line) for line in top.get_lines()] == [([0, 2, 4, 5], [1.0, 0.5, 0.25, 0.2])]
    scale, skipped = bottom.get_lines()
    assert _xy(scale) == ([0, 1, 2, 3, 4, 5], [8.0, 8.0, 4.0, 4.0, 2.0, 4.0])
    assert scale.get_drawstyle() == "steps-post"  # the scale holds from its step until the next change
    assert _xy(skipped) == ([1, 3], [8.0, 4.0]) and skipped.get_linestyle() == "None"
    assert (top.get_yscale(), bottom.get_yscale(), bottom.yaxis.get_transform().base) == ("log", "log", 2)
    assert (top.get_title(), top.get_ylabel(), bottom.get_ylabel(), bottom.get_xlabel()) == (
        "a run",
        "training loss",
        "loss scale",
        "step",
    )
    assert (_legend_texts(top), _legend_texts(bottom)) == ([], ["overflow (step skipped)"])


@pytest.mark.parametrize(
    "losses, scales, drawn_losses, drawn_scales, log_axes",
    [
        # every step skipped at a scale backed off to 0 (a loss weighted to inf): log axes of nothing failed to draw
        ([math.inf] * 3, [2.0, 1.0, 0.0], [], [0, 1], ("linear", "log")),
        ([math.nan, 0.0, -1.0], [0.0, 0.0, 0.0], [], [], ("linear", "linear")),
        ([1.0, 0.5, 0.25], [math.inf, 4.0, 4.0], [0, 1, 2], [1, 2], ("log", "log")),
    ],
    ids=["scale_backed_off_to_zero", "nothing_positive", "inf_scale"],
)
def test_training_plot_leaves_out_what_a_log_axis_cannot_show(
    drawn, losses, scales, drawn_losses, drawn_scales, log_axes
):
    plots.plot_training(_records(losses, scales, [True] * 3), "training.png", "run")
    top, bottom = drawn[0].axes
    assert [_xy(line)[0] for line in top.get_lines()] == [drawn_losses]
    assert _xy(bottom.get_lines()[0])[0] == drawn_scales
    assert (top.get_yscale(), bottom.get_yscale()) == log_axes


def test_training_plot_without_a_skipped_step_has_no_marks_and_no_legend(drawn):
    plots.plot_training(_records([1.0, 0.5], [8.0, 16.0], [False, False]), "training.png", "clean")
    bottom = drawn[0].axes[1]
    assert [_xy(line) for line in bottom.get_lines()] == [([0, 1], [8.0, 16.0])]
    assert bottom.get_legend() is None


def test_comparison_draws_every_loss_and_only_the_scales_that_are_not_one(drawn):
    """An unscaled run (scale 1 throughout, or no record) has no scale to show; a fixed scale other than 1 does."""
    runs = {
        "float32": _records([1.0, 0.5], [1.0, 1.0], [False, False]),
        "fixed 128": _records([1.0, 0.6], [128.0, 128.0], [False, False]),
        "dynamic": SKIPPING_RUN,
        "empty": [],
        "from one": _records([1.0, 0.9], [1.0, 2.0], [False, False]),
    }
    plots.plot_comparison(runs, "compare.png", "runs")
    top, bottom = drawn[0].axes
    assert [(line.get_label(), line.get_color()) for line in top.get_lines()] == [
        ("float32", "C0"),
        ("fixed 128", "C1"),
        ("dynamic", "C2"),
        ("empty", "C3"),
        ("from one", "C4"),
    ]
    assert _xy(top.get_lines()[2]) == ([0, 2, 4, 5], [1.0, 0.5, 0.25, 0.2])
    scales = [(line.get_label(), line.get_color(), _xy(line)) for line in bottom.get_lines()]
    assert scales == [
        ("fixed 128", "C1", ([0, 1], [128.0, 128.0])),
        ("dynamic", "C2", ([0, 1, 2, 3, 4, 5], [8.0, 8.0, 4.0, 4.0, 2.0, 4.0])),
        ("_child2", "C2", ([1, 3], [8.0, 4.0])),  # the run's skipped steps, in its colour, unlabelled
        ("from one", "C4", ([0, 1], [1.0, 2.0])),
    ]
    assert _legend_texts(top) == ["float32", "fixed 128", "dynamic", "empty", "from one"]
    assert _legend_texts(bottom) == ["fixed 128", "dynamic", "from one"]


def test_headroom_draws_each_scale_with_its_largest_safe_scale_in_the_same_colour(drawn):
    """Every step's scale (skipped steps marked) and, dotted, the measured largest safe scale; a step measured
    without one (overflow even at scale 1) is left out."""
    runs = {
        "dynamic": (SKIPPING_RUN, [(0, 4.0), (3, 2.0), (5, 8.0)]),
        "automatic": (_records([1.0, 0.5], [2.0, 1.0], [False, False]), [(0, None), (1, 2.0)]),
    }
    plots.plot_headroom(runs, "automatic.png", "rules")
    axis = drawn[0].axes[0]
    lines = [(line.get_label(), line.get_color(), _xy(line)) for line in axis.get_lines()]
    assert lines == [
        ("dynamic", "C0", ([0, 1, 2, 3, 4, 5], [8.0, 8.0, 4.0, 4.0, 2.0, 4.0])),
        ("_child1", "C0", ([1, 3], [8.0, 4.0])),
        ("dynamic: largest safe", "C0", ([0, 3, 5], [4.0, 2.0, 8.0])),
        ("automatic", "C1", ([0, 1], [2.0, 1.0])),
        ("automatic: largest safe", "C1", ([1], [2.0])),
    ]
    assert axis.get_lines()[2].get_linestyle() == ":" and axis.get_yscale() == "log"
    assert _legend_texts(axis) == ["dynamic", "dynamic: largest safe", "automatic", "automatic: largest safe"]
    assert (axis.get_title(), axis.get_xlabel(), axis.get_ylabel()) == ("rules", "step", "loss scale")


def test_histogram_shifts_the_magnitudes_by_the_scale_against_the_float16_range(drawn):
    plots.plot_histogram([-60.0, -20.0, -10.0], 2.0**10, "gradients.png", "gradients")
    axis = drawn[0].axes[0]
    bars = axis.containers[0]
    left = min(bar.get_x() for bar in bars)
    right = max(bar.get_x() + bar.get_width() for bar in bars)
    assert (left, right) == (-50.0, 0.0) and sum(bar.get_height() for bar in bars) == 3
    # the red band reaches the smallest magnitude (below -40) and ends one below the smallest subnormal
    assert _bands(axis) == [
        (-50.0, math.log2(FP16_MIN_SUBNORMAL) - 1),
        (math.log2(FP16_MIN_SUBNORMAL) - 1, math.log2(FP16_MIN_NORMAL)),
    ]
    (maximum,) = axis.get_lines()
    assert list(maximum.get_xdata()) == [math.log2(FP16_MAX)] * 2
    assert (axis.get_title(), axis.get_xlabel()) == ("gradients", "log2 |gradient x scale|   (scale = 2^10)")
    assert sorted(_legend_texts(axis)) == [
        "flushed to zero in fp16",
        "fp16 max (65504)",
        "fp16 subnormal (precision lost)",
    ]  # the order depends on matplotlib


def test_histogram_red_band_starts_at_minus_40_when_every_magnitude_is_above(drawn):
    plots.plot_histogram([-10.0, -5.0], 1.0, "gradients.png", "gradients")
    axis = drawn[0].axes[0]
    assert _bands(axis)[0][0] == -40.0 and axis.get_xlabel().endswith("(scale = 2^0)")


@pytest.mark.parametrize(
    "draw",
    [
        lambda: plots.plot_training([], "t.png", "t"),
        lambda: plots.plot_comparison({}, "c.png", "c"),
        lambda: plots.plot_histogram([0.0], 1.0, "h.png", "h"),
        lambda: plots.plot_headroom({}, "a.png", "a"),
    ],
    ids=["training", "comparison", "histogram", "headroom"],
)
def test_without_matplotlib_every_plot_says_how_to_get_it(monkeypatch, draw):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plots.PlotUnavailable, match=r'matplotlib is not installed.*pip install "lossscale\[plot\]"'):
        draw()


def test_plots_draw_off_screen_whatever_backend_was_chosen(drawn):
    """The command line runs on machines without a display: a backend chosen before (by MPLBACKEND, say) gives
    way to Agg, which writes PNGs without one."""
    chosen = matplotlib.get_backend()
    matplotlib.use("template")
    try:
        plots.plot_training(SKIPPING_RUN, "training.png", "a run")
        assert matplotlib.get_backend().lower() == "agg" and len(drawn) == 1
    finally:
        matplotlib.use(chosen)
