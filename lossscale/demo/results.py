"""The results page of the documentation (docs/results.md), written by ``lossscale compare --results``.

Every number and figure on the page comes from the run that writes it: the comparison table, the
verdict, the scales' trajectories, the gradient measurements at the initial weights, the largest
safe scales and the figures (``images/compare.png``, ``images/inspect-<model>.png``,
``images/automatic*.png`` next to the page). The page names the command that made it, so rerunning
that command regenerates it; the tests rerun it.
"""

import argparse
import datetime
import os
import platform
import sys
from importlib import metadata

import mindspore as ms
import numpy as np

from lossscale.core._text import format_scale
from lossscale.core.adaptive import MAX_SCALE_WINDOW, MIN_SCALE_WINDOW, window_levels
from lossscale.demo import plots
from lossscale.demo.diagnostics import magnitude_report
from lossscale.demo.headroom import NOISE_POINTS, RULES, automatic_section, evenly_spaced
from lossscale.demo.inspection import measure_gradients
from lossscale.demo.runs import _unweighted
from lossscale_models import create_model

INSPECT_SCALES = (1.0, 65536.0)
TEST_IMAGES = 359
UNWEIGHTED = ", weight 1"  # the label suffix of compare's control runs, without the loss weight


def command_line(args, page):
    """The ``compare`` command that reproduces ``args``, writing the page to ``page``."""
    return (
        f"python -m lossscale compare --model {args.model} --precision {args.precision} --epochs {args.epochs} "
        f"--batch-size {args.batch_size} --lr {args.lr:g} --seed {args.seed} --loss-weight {args.loss_weight:g} "
        f"--fixed-scale {args.fixed_scale:g} --scale-window {args.scale_window} --results {page}"
    )


def machine_description():
    """CPU model and count, Python, MindSpore and NumPy versions (for the page's header)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            info = handle.read().splitlines()
    except OSError:
        info = []
    names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    # The vector extensions decide how CPU kernels round, so runs agree bit for bit only where they match.
    extensions = " ".join(flag for flag in ("avx2", "fma", "avx512f") if flag in flags)
    cpu = ", ".join(part for part in ((names[0] if names else cpu), extensions) if part)
    versions = []
    for package in ("mindspore", "numpy"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, {', '.join(versions)}, "
        f"{platform.system()}"
    )


def _comparison_rows(runs):
    rows = [
        "| run | test acc % | final loss | grad lost % | skipped steps | scale (first -> last) |",
        "|---|---|---|---|---|---|",
    ]
    for label, result in runs:
        summary = result["summary"]
        scales = f"{format_scale(result['records'][0]['loss_scale'])} -> {format_scale(summary['final_loss_scale'])}"
        rows.append(
            f"| {label} | {100 * result['test_accuracy']:.2f} | "
            f"{result['final_loss'] / result['config']['loss_weight']:.4f} | "
            f"{100 * result['gradient_lost_fraction']:.3f} | {summary['skipped_steps']} of {summary['steps']} "
            f"| {scales} |"
        )
    return rows


def _inspect_rows(measurements, precision):
    rows = [f"| loss scale | flushed to zero in fp16 | subnormal | measured lost in {precision} |", "|---|---|---|---|"]
    for scale, report, lost in measurements:
        rows.append(
            f"| {format_scale(scale)} | {100 * report['flushed']:.2f}% | {100 * report['subnormal']:.2f}% | "
            f"{100 * lost:.2f}% |"
        )
    return rows


def comparison_verdict(runs, tolerance=0.5):
    """One sentence: dynamic scaling's test accuracy against fp32's, with the direction spelled out.

    Example:
        >>> runs = [("fp32", {"test_accuracy": 0.9666}), ("fp16 dynamic", {"test_accuracy": 0.961})]
        >>> comparison_verdict(runs)
        'fp16 dynamic reaches 96.10% test accuracy, 0.56 percentage points below fp32 (96.66%): more than 0.5 below'
    """
    results = dict(runs)
    fp32, dynamic = 100 * results["fp32"]["test_accuracy"], 100 * results["fp16 dynamic"]["test_accuracy"]
    gap = dynamic - fp32
    if abs(gap) < 0.005:
        relation = "the same as"
    else:
        relation = f"{abs(gap):.2f} percentage points {'above' if gap > 0 else 'below'}"
    verdict = f"more than {tolerance:g} below" if gap < -tolerance else f"not more than {tolerance:g} below"
    return f"fp16 dynamic reaches {dynamic:.2f}% test accuracy, {relation} fp32 ({fp32:.2f}%): {verdict}"


def render_page(args, runs, measurements, page, machine, date):
    """The page as markdown (pure: numbers in, text out)."""
    weighted = [(label, result) for label, result in runs if not label.endswith(UNWEIGHTED)]
    controls = [(label, result) for label, result in runs if label.endswith(UNWEIGHTED)]
    sections = (
        _introduction(args, page, machine, date),
        _gradient_section(args, measurements),
        _comparison_section(weighted),
        _window_section(weighted),
        automatic_section(rule_groups(args, runs), args.precision),
        _unweighted_section(controls) if controls else [],
    )
    return "\n".join(line for section in sections for line in section)


def _unweighted_section(controls, noise=NOISE_POINTS):
    """fp32, fp16 without scaling and fp16 dynamic again at loss weight 1, and what they say plainly: whether
    scaling gains anything on this model without the weight (a gap within ``noise`` points, about five test
    images, is nothing measurable)."""
    results = {label[: -len(UNWEIGHTED)]: result for label, result in controls}
    fp32, unscaled, dynamic = (100 * results[label]["test_accuracy"] for label in CONTROL_LABELS)
    lost = 100 * results["fp16 no scaling"]["gradient_lost_fraction"]
    gain = dynamic - unscaled
    if abs(gain) < noise and abs(unscaled - fp32) < noise:
        finding = (
            "Loss scaling gains nothing measurable here: without it fp16 trains as well as fp32, within the noise "
            f"of the test set ({noise:g} points)."
        )
    else:
        direction = "above" if gain > 0 else "below"
        finding = f"Dynamic loss scaling ends {abs(gain):.2f} points {direction} fp16 without it."
    return [
        "## Without the loss weight",
        "",
        "The same seed and data at loss weight 1:",
        "",
        *_comparison_rows(controls),
        "",
        f"At loss weight 1 fp32 reaches {fp32:.2f}%, fp16 without scaling {unscaled:.2f}% (it loses {lost:.3f}% of "
        f"the gradient elements at its final weights) and fp16 dynamic {dynamic:.2f}%. {finding} These small models "
        "on small data keep their gradients within float16's range; the comparison above rests on the loss weight, "
        "which stands for a loss averaged over many tokens or pixels.",
        "",
    ]


CONTROL_LABELS = ("fp32", "fp16 no scaling", "fp16 dynamic")


def _introduction(args, page, machine, date):
    """The title, the command that wrote the page, and the configuration and why."""
    return [
        "# Results: does fp16 with lossscale train as well as fp32?",
        "",
        "This page is generated; do not edit it by hand. It was written by",
        "",
        f"    {command_line(args, page)}",
        "",
        f"on {machine}, on {date}. Rerun that command to regenerate it (figures included);",
        "`tests/demo/test_results_page.py` reruns it and checks the page against the fresh run.",
        "",
        "## The configuration and why",
        "",
        "Micikevicius et al. (ICLR 2018) found that most activation gradients of the SSD detector lay",
        "below the float16 range, and that the detector trained in fp16 only with loss scaling. Small",
        "models on small data rarely reach that regime by themselves, so the loss here is multiplied",
        f"by {args.loss_weight:g}, which is what a loss normalised by a large token count, an accumulation",
        "factor or a small auxiliary-loss weight looks like. Adam is nearly invariant to such a constant",
        "in fp32 (only its `eps` sees it); in fp16 it pushes most gradients below 2**-24.",
        "",
        f"Model {args.model}, {args.precision} for the fp16 runs, {args.epochs} epochs of batch {args.batch_size}, "
        f"Adam {args.lr:g}, seed {args.seed}; dynamic scaling is `DynamicLossScaleManager(scale_window="
        f"{args.scale_window})` (MindSpore's initial 2**24), adaptive scaling MindFormers' adaptive window "
        f"(`AdaptiveLossScaleManager()`: the same initial scale, windows from {MIN_SCALE_WINDOW} to "
        f"{MAX_SCALE_WINDOW} steps, starting at {MIN_SCALE_WINDOW}). The test set has {TEST_IMAGES} held-out "
        f"digits, so one image is {100 / TEST_IMAGES:.2f} percentage points.",
        "",
    ]


def _gradient_section(args, measurements):
    """Where the gradients at the initial weights fall in float16, with its figure."""
    return [
        "## Gradients at the initial weights",
        "",
        f"Where the fp32 weight gradients of the first 4 training batches fall in float16, and what an "
        f"{args.precision} backward pass actually loses:",
        "",
        *_inspect_rows(measurements, args.precision),
        "",
        f"![log2 |gradient| of {args.model} against the float16 range](images/inspect-{args.model}.png)",
        "",
    ]


def _comparison_section(runs):
    """The comparison table, the verdict and the training figure."""
    results = dict(runs)
    fp32, unscaled, dynamic = results["fp32"], results["fp16 no scaling"], results["fp16 dynamic"]
    dynamic_summary = dynamic["summary"]
    return [
        "## The comparison",
        "",
        *_comparison_rows(runs),
        "",
        '"grad lost" is the fraction of gradient elements that are zero in the run\'s precision but',
        'nonzero in fp32, at the run\'s final weights and final scale, on 4 training batches. "final loss"',
        "is the last training loss divided by the loss weight.",
        "",
        f"**{comparison_verdict(runs)}.** Without scaling, fp16 ends at "
        f"{100 * unscaled['test_accuracy']:.2f}% and loses {100 * unscaled['gradient_lost_fraction']:.1f}% of the "
        f"gradient elements at its final weights (fp32: {100 * fp32['test_accuracy']:.2f}%). The dynamic scale "
        f"went from {format_scale(dynamic['records'][0]['loss_scale'])} to "
        f"{format_scale(dynamic_summary['final_loss_scale'])} "
        f"(between {format_scale(dynamic_summary['min_loss_scale'])} "
        f"and {format_scale(dynamic_summary['max_loss_scale'])}), skipping {dynamic_summary['skipped_steps']} of "
        f"{dynamic_summary['steps']} steps.",
        "",
        "![fp32 vs fp16 training loss and loss scale](images/compare.png)",
        "",
        f"Differences of a few tenths of a point are within the noise of a {TEST_IMAGES}-image test set; the",
        "gradient-lost column is the robust measurement. Step times are not on this page: on CPU, fp16",
        "kernels are not faster than fp32 (see performance.md).",
        "",
    ]


def scale_changes(records):
    """``(growths, back-offs)``: how often the scale rose and fell between consecutive steps of ``records``.

    Example:
        >>> scale_changes([{"loss_scale": s} for s in (8.0, 16.0, 8.0, 8.0, 4.0)])
        (1, 2)
    """
    scales = [record["loss_scale"] for record in records]
    steps = list(zip(scales, scales[1:]))
    return sum(new > old for old, new in steps), sum(new < old for old, new in steps)


def _trajectory_rows(runs, samples=8):
    """The scale of each run at ``samples`` evenly spaced steps (the first and the last included)."""
    picked = evenly_spaced(len(runs[0][1]["records"]), samples)
    rows = ["| step | " + " | ".join(label for label, _ in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for index in picked:
        scales = " | ".join(format_scale(result["records"][index]["loss_scale"]) for _, result in runs)
        rows.append(f"| {index + 1} | {scales} |")
    return rows


def _window_section(runs):
    """The fixed-window and the adaptive dynamic scale side by side: changes, skipped steps, trajectory."""
    results = dict(runs)
    pair = [(label, results[label]) for label in ("fp16 dynamic", "fp16 adaptive")]
    lines = ["## A fixed window against the adaptive window", ""]
    for label, result in pair:
        growths, backoffs = scale_changes(result["records"])
        summary = result["summary"]
        lines.append(
            f"- {label}: growths {growths}, back-offs {backoffs}, skipped steps {summary['skipped_steps']} of "
            f"{summary['steps']}, the scale between {format_scale(summary['min_loss_scale'])} and "
            f"{format_scale(summary['max_loss_scale'])}, ending at {format_scale(summary['final_loss_scale'])}."
        )
    return [
        *lines,
        "",
        "The scale used at each step, on the same seed and data:",
        "",
        *_trajectory_rows(pair),
        "",
        f"The adaptive window grows every {MIN_SCALE_WINDOW} clean steps at first and, after three growths, moves up "
        f"a level (its windows: {', '.join(map(str, window_levels(MAX_SCALE_WINDOW, MIN_SCALE_WINDOW)))} steps); "
        "three back-offs without a growth drop it to a window of 1 step.",
        "",
    ]


def rule_groups(args, runs):
    """``[(loss weight, {label: result}, image)]``: the runs at the loss weight and, if there are, the controls at
    weight 1 (labels without their suffix), with their figures' file names (automatic loss scaling's section)."""
    groups = [(args.loss_weight, dict(runs), "automatic.png")]
    controls = {label[: -len(UNWEIGHTED)]: result for label, result in runs if label.endswith(UNWEIGHTED)}
    return groups + ([(1.0, controls, "automatic-weight1.png")] if controls else [])


def measure_initial_gradients(args):
    """``[(scale, magnitude report, measured lost fraction)]`` at the initial weights, and the fp32 gradients."""
    measurements, reference = [], None
    for scale in INSPECT_SCALES:
        ms.set_seed(args.seed)
        network = create_model(args.model)
        probe_args = argparse.Namespace(**dict(vars(args), scale=scale, batches=4))
        reference, lost, _ = measure_gradients(probe_args, network)
        measurements.append((scale, magnitude_report(reference, scale), lost))
    return measurements, reference


def write_results_page(args, runs, page):
    """Write the page and its figures (in ``images/`` next to it); return the page's path."""
    folder = os.path.dirname(os.path.abspath(page))
    images = os.path.join(folder, "images")
    os.makedirs(images, exist_ok=True)
    measurements, reference = measure_initial_gradients(args)
    magnitudes = np.abs(np.concatenate([g.ravel() for g in reference]))
    try:
        plots.plot_histogram(
            np.log2(magnitudes[magnitudes > 0]),
            1.0,
            os.path.join(images, f"inspect-{args.model}.png"),
            f"{args.model}: fp32 weight gradients at the initial weights vs the float16 range",
        )
        plots.plot_comparison(
            {label: _unweighted(result) for label, result in runs if not label.endswith(UNWEIGHTED)},
            os.path.join(images, "compare.png"),
            f"{args.model}: fp32 vs fp16 ({args.precision}) loss scaling",
        )
        for weight, results, image in rule_groups(args, runs):
            plots.plot_headroom(
                {label: (results[label]["records"], results[label]["largest_safe_scales"]) for label in RULES},
                os.path.join(images, image),
                f"{args.model} ({args.precision}, loss weight {weight:g}): loss scale against the largest safe scale",
            )
    except plots.PlotUnavailable as reason:
        print(f"plot: {reason}", file=sys.stderr)
    text = render_page(args, runs, measurements, page, machine_description(), datetime.date.today().isoformat())
    with open(page, "w", encoding="utf-8") as handle:
        handle.write(text)
    return page
