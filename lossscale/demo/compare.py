"""``compare``: fp32, fp16 without scaling, fp16 with a fixed scale, fp16 with dynamic scaling, fp16 with
MindFormers' adaptive window and fp16 with automatic loss scaling on the same seed and data; the table, the verdict
and the plot. The three rules that move the scale have every step's largest safe scale measured beside them.
"""

import os

import numpy as np
from mindspore import nn

from lossscale.core.adaptive import MIN_SCALE_WINDOW
from lossscale.demo import plots
from lossscale.demo.diagnostics import GradientProbe, SafeScaleProbe, lost_fraction, unscaled_gradients
from lossscale.demo.headroom import RULES, SAFE_SCALE_EVERY
from lossscale.demo.options import EXIT_OK, default_output, prepare_output
from lossscale.demo.results import CONTROL_LABELS, UNWEIGHTED, comparison_verdict, write_results_page
from lossscale.demo.runs import (
    _copy_of,
    _first_training_batches,
    _public,
    _try_plot,
    _unweighted,
    _weighted_loss,
    _write_json,
    run_training,
)


def gradient_loss_at_end(result, batches=4):
    """Fraction of gradient elements zero in the run's precision but nonzero in fp32, at its final weights
    and final loss scale, averaged over the first ``batches`` training batches."""
    config = result["config"]
    reference = _copy_of(config["model"], result["network"])
    reference_probe = GradientProbe(nn.WithLossCell(reference, _weighted_loss(config["loss_weight"])))
    run_probe = GradientProbe(result["model"].train_network.network)
    scale = result["summary"]["final_loss_scale"] or 1.0
    fractions = [
        lost_fraction(unscaled_gradients(reference_probe, batch, 1.0), unscaled_gradients(run_probe, batch, scale))
        for batch in _first_training_batches(config["batch_size"], reference.input_layout, batches)
    ]
    return float(np.mean(fractions))


def compare_plan(args):
    """``[(label, precision, loss_scale, scale_window, loss_weight)]``: the six runs of ``compare`` and, with a loss
    weight other than 1, fp32, fp16 without scaling and the three rules that move the scale again without it (the
    controls that say what the weight does). The adaptive window starts at its lowest level, as MindFormers'
    documentation configures it: its point is a fast early growth."""
    weight, window = args.loss_weight, args.scale_window
    plan = [
        ("fp32", "fp32", "none", window, weight),
        ("fp16 no scaling", args.precision, "none", window, weight),
        (f"fp16 fixed {args.fixed_scale:g}", args.precision, f"fixed:{args.fixed_scale:g}", window, weight),
        ("fp16 dynamic", args.precision, "dynamic", window, weight),
        ("fp16 adaptive", args.precision, "adaptive", MIN_SCALE_WINDOW, weight),
        ("fp16 automatic", args.precision, "automatic", window, weight),
    ]
    if weight != 1.0:
        controls = CONTROL_LABELS + RULES
        plan += [(label + UNWEIGHTED, *rest[:3], 1.0) for label, *rest in plan if label in controls]
    return plan


def compare_runs(args):
    """Run the configurations of ``compare`` (:func:`compare_plan`); return ``[(label, result)]``. The runs of the
    rules of :data:`lossscale.demo.headroom.RULES` also get ``largest_safe_scales`` (:class:`SafeScaleProbe`)."""
    runs = []
    for label, precision, loss_scale, scale_window, loss_weight in compare_plan(args):
        print(f"== {label} ({precision}, loss scale {loss_scale})")
        probes = [SafeScaleProbe(SAFE_SCALE_EVERY)] if label.removesuffix(UNWEIGHTED) in RULES else []
        result = run_training(
            args.model,
            precision,
            loss_scale,
            args.epochs,
            args.batch_size,
            args.lr,
            args.seed,
            scale_window,
            loss_weight,
            progress=not args.no_progress,
            step_callbacks=probes,
        )
        result["gradient_lost_fraction"] = gradient_loss_at_end(result)
        if probes:
            result["largest_safe_scales"] = probes[0].measured
        runs.append((label, result))
    return runs


def format_comparison(runs):
    """The comparison table as text (final loss divided by the loss weight)."""
    header = f"{'run':<26}{'test acc %':>11}{'final loss':>12}{'grad lost %':>13}{'skipped':>9}{'ms/step':>9}"
    lines = [header, "-" * len(header)]
    for label, result in runs:
        final_loss = result["final_loss"] / result["config"]["loss_weight"]
        lines.append(
            f"{label:<26}{100 * result['test_accuracy']:>11.2f}{final_loss:>12.4f}"
            f"{100 * result['gradient_lost_fraction']:>13.3f}{result['summary']['skipped_steps']:>9d}"
            f"{1e3 * result['seconds_per_step']:>9.2f}"
        )
    return "\n".join(lines)


def command_compare(args):
    output = prepare_output(args.output or default_output("compare", args), "compare")
    runs = compare_runs(args)
    table, verdict = format_comparison(runs), comparison_verdict(runs)
    print(table)
    print(verdict)
    with open(os.path.join(output, "compare.txt"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n" + verdict + "\n")
    _write_json(os.path.join(output, "compare.json"), {label: _public(result) for label, result in runs})
    title = f"{args.model}: fp32 vs fp16 ({args.precision}) loss scaling"
    _try_plot(
        plots.plot_comparison,
        {label: _unweighted(result) for label, result in runs if not label.endswith(UNWEIGHTED)},
        os.path.join(output, "compare.png"),
        title,
    )
    if args.results:
        print(f"results page: {write_results_page(args, runs, args.results)}")
    return EXIT_OK
