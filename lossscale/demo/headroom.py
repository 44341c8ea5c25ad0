"""The results page's section on automatic loss scaling: the dynamic rule, the adaptive window and automatic loss
scaling on the same seed and data, each step's scale against the largest safe scale measured at that step
(:class:`lossscale.demo.diagnostics.SafeScaleProbe`), skipped steps, and accuracy and loss against fp32.
"""

import math
import statistics
from fractions import Fraction

from lossscale.core._text import format_scale, plural
from lossscale.core.automatic import AutomaticLossScaleRule

RULES = ("fp16 dynamic", "fp16 adaptive", "fp16 automatic")
# Their largest safe scale is measured every this many steps: each measurement is two or more backward passes.
SAFE_SCALE_EVERY = 6
# Test-accuracy differences below this many points (about five of the 359 test images) are noise.
NOISE_POINTS = 1.5


def evenly_spaced(count, samples):
    """The indices of ``samples`` evenly spaced items among ``count`` (the first and the last included; fewer when
    ``count`` is smaller).

    Example:
        >>> evenly_spaced(15, 8), evenly_spaced(3, 8), evenly_spaced(0, 8)
        ([0, 2, 4, 6, 8, 10, 12, 14], [0, 1, 2], [])
    """
    return sorted({round(i * (count - 1) / (samples - 1)) for i in range(samples)}) if count else []


def headroom(result):
    """``[(step, scale, largest safe scale)]`` at the run's measured steps (the safe scale None: none was)."""
    records = result["records"]
    return [(step, records[step - 1]["loss_scale"], safe) for step, safe in result["largest_safe_scales"]]


def gap(scale, safe):
    """log2 of how far ``scale`` sits below ``safe`` (negative: above it, the step overflowed); None without one.

    Example:
        >>> gap(2.0**24, 2.0**30), gap(2.0**24, 2.0**23), gap(1.0, None)
        (6.0, -1.0, None)
    """
    return None if safe is None else math.log2(safe) - math.log2(scale)


def above(scale, safe):
    """Whether ``scale`` is above the largest safe scale ``safe`` (always, when even scale 1 overflowed: None)."""
    return safe is None or scale > safe


def agreement(runs):
    """``(agreeing, measured)``: at how many measured steps of ``runs`` the step overflowed exactly when its scale
    was above the measured largest safe scale, out of how many."""
    pairs = [
        (result["records"][step - 1]["overflow"], above(scale, safe))
        for _, result in runs
        for step, scale, safe in headroom(result)
    ]
    return sum(overflowed == was_above for overflowed, was_above in pairs), len(pairs)


def _median_gap(result):
    gaps = [gap(scale, safe) for _, scale, safe in headroom(result) if safe is not None]
    return statistics.median(gaps) if gaps else None


def _rows(fp32, runs):
    reference = 100 * fp32["test_accuracy"]
    rows = [
        "| run | test acc % | vs fp32 (points) | final loss | skipped steps | gap to the largest safe scale (median) "
        "| measured steps above it |",
        "|---|---|---|---|---|---|---|",
        f"| fp32 | {reference:.2f} | | {_final_loss(fp32):.4f} | | | |",
    ]
    for label, result in runs:
        points = headroom(result)
        steps_above = sum(above(scale, safe) for _, scale, safe in points)
        median = _median_gap(result)
        below = "n/a" if median is None else f"{median:g}"
        rows.append(
            f"| {label} | {100 * result['test_accuracy']:.2f} | {100 * result['test_accuracy'] - reference:+.2f} | "
            f"{_final_loss(result):.4f} | {result['summary']['skipped_steps']} of {result['summary']['steps']} | "
            f"{below} | {steps_above} of {len(points)} |"
        )
    return rows


def _final_loss(result):
    return result["final_loss"] / result["config"]["loss_weight"]


def _best(runs, key, largest):
    """``(labels, value)``: the labels of ``runs`` with the largest (or smallest) ``key(result)``, and that value."""
    values = {label: key(result) for label, result in runs if key(result) is not None}
    best = (max if largest else min)(values.values())
    return [label for label, value in values.items() if value == best], best


def findings(fp32, runs):
    """The section's verdict, in sentences computed from the numbers (whichever rule they favour). The closest
    rule is the one whose median gap is nearest zero (a negative gap: above the safe scale)."""
    results = dict(runs)
    fewest, skipped = _best(runs, lambda result: result["summary"]["skipped_steps"], largest=False)
    closest, _ = _best(runs, lambda result: _absolute(_median_gap(result)), largest=False)
    accurate, accuracy = _best(runs, lambda result: result["test_accuracy"], largest=True)
    spread = 100 * (accuracy - min(result["test_accuracy"] for _, result in runs))
    noise = "within" if spread < NOISE_POINTS else "beyond"
    sentences = [
        f"Fewest skipped steps: {' and '.join(fewest)} ({skipped}).",
        f"Closest to the largest safe scale: {' and '.join(closest)} (a median gap of "
        f"{_median_gap(results[closest[0]]):g}).",
        f"Highest test accuracy: {' and '.join(accurate)} ({100 * accuracy:.2f}%, fp32 "
        f"{100 * fp32['test_accuracy']:.2f}%); the rules differ by {spread:.2f} points, {noise} the test set's noise "
        f"of {NOISE_POINTS:g}.",
    ]
    return sentences + _ceiling_sentence(results["fp16 automatic"])


def _absolute(value):
    return None if value is None else abs(value)


def _ceiling_sentence(result):
    """Whether automatic loss scaling sat at its ceiling (``max_scale``), and for how many steps."""
    ceiling = AutomaticLossScaleRule().max_scale
    at_ceiling = [record["step"] for record in result["records"] if record["loss_scale"] >= ceiling]
    if not at_ceiling:
        return []
    return [
        f"Automatic loss scaling reached its ceiling (`max_scale`, {format_scale(ceiling)}) at step {at_ceiling[0]} "
        f"and used it at {len(at_ceiling)} of {len(result['records'])} steps: where the gradients allow more, the "
        "ceiling, not the gradients, sets its scale."
    ]


def _trajectory(runs, samples=8):
    """The scale and the measured largest safe scale of every rule at ``samples`` of the measured steps."""
    points = [headroom(result) for _, result in runs]
    picked = evenly_spaced(len(points[0]), samples)
    header = " | ".join(f"{label} | largest safe" for label, _ in runs)
    rows = [f"| step | {header} |", "|---" * (2 * len(runs) + 1) + "|"]
    for index in picked:
        cells = " | ".join(f"{format_scale(p[index][1])} | {format_scale(p[index][2])}" for p in points)
        rows.append(f"| {points[0][index][0]} | {cells} |")
    return rows


def automatic_section(groups, precision):
    """The section as markdown lines. ``groups``: ``[(loss weight, results, image)]``, ``results`` mapping labels to
    runs (fp32 and :data:`RULES` among them), ``image`` the file name of its figure in ``images/``."""
    rule = AutomaticLossScaleRule()
    lines = [
        "## Automatic loss scaling against the dynamic rule and the adaptive window",
        "",
        "Automatic loss scaling (`AutomaticLossScaleRule()`, Graphcore's rule with PopART's defaults) reads where "
        f"the gradients lie: it halves the scale when more than {rule.threshold:g} of the gradient values sit at "
        f"or above {Fraction(rule.bin_edge).limit_denominator()} of float16's largest value, and doubles it "
        f"otherwise, {_every(rule.update_period)}, between {format_scale(rule.min_scale)} and "
        f"{format_scale(rule.max_scale)} from {format_scale(rule.init_scale)}. Below ten million values, one value "
        "in that bin is enough to halve.",
        "",
        f"At every {SAFE_SCALE_EVERY}th step from the first, each run's largest safe scale was measured: the largest "
        f"power of two at which that step's weights and batch, back-propagated in {precision}, give finite "
        "gradients. The gap to it is in powers of two.",
        "",
    ]
    for weight, results, image in groups:
        lines += _group(f"At loss weight {weight:g}", results, image)
    return lines


def _every(period):
    """``every step`` or ``every N steps``."""
    return "every step" if period == 1 else f"every {plural(period, 'step')}"


def _group(title, results, image):
    runs = [(label, results[label]) for label in RULES]
    agreeing, measured = agreement(runs)
    return [
        f"### {title}",
        "",
        *_rows(results["fp32"], runs),
        "",
        f"A step overflowed exactly when its scale was above its largest safe scale at {agreeing} of {measured} "
        "measured steps.",
        "",
        *findings(results["fp32"], runs),
        "",
        "The scale against the largest safe scale, at measured steps:",
        "",
        *_trajectory(runs),
        "",
        f"![each rule's loss scale against its measured largest safe scale, {title.lower()}](images/{image})",
        "",
    ]
