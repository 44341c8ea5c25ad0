"""``inspect``: where the fp32 weight gradients fall in the float16 range at a loss scale, and the largest scale
without overflow, at the initial weights or along training.
"""

import os

import mindspore as ms
import numpy as np
from mindspore import nn

from lossscale.core._text import format_scale
from lossscale.demo import plots
from lossscale.demo.diagnostics import GradientProbe, lost_fraction, magnitude_report, unscaled_gradients
from lossscale.demo.options import DEFAULTS, EXIT_OK, PRECISIONS, default_output, parse_loss_scale, prepare_output
from lossscale.demo.runs import _copy_of, _first_training_batches, _try_plot, _weighted_loss, _write_json, run_training
from lossscale.training.integration import build_train_network
from lossscale_models import create_model


def measure_gradients(args, network):
    """``(fp32 gradients, measured lost fraction at --scale, batches used)`` of ``network`` on the first
    ``--batches`` batches (fewer if the training split has fewer)."""
    loss_fn = _weighted_loss(args.loss_weight)
    reference_probe = GradientProbe(nn.WithLossCell(network, loss_fn))
    fp16_copy = _copy_of(args.model, network)
    fp16_network = build_train_network(
        fp16_copy,
        nn.SGD(fp16_copy.trainable_params(), 0.0),
        loss_fn,
        level=PRECISIONS[args.precision],
        loss_scale_manager=parse_loss_scale("none")[1](),
    ).network
    fp16_probe = GradientProbe(fp16_network)
    reference, lost = [], []
    for batch in _first_training_batches(args.batch_size, network.input_layout, args.batches):
        grads = unscaled_gradients(reference_probe, batch, 1.0)
        reference.extend(grads)
        lost.append(lost_fraction(grads, unscaled_gradients(fp16_probe, batch, args.scale)))
    return reference, float(np.mean(lost)), len(lost)


def largest_safe_along_training(args):
    """Train fp32 for ``args.epochs`` and return ``(network, [(epoch, largest safe scale)])``, measured at the
    start and after every epoch on the first ``args.batches`` training batches (epoch 0: untrained)."""
    ms.set_seed(args.seed)
    network = create_model(args.model)
    batches = _first_training_batches(args.batch_size, network.input_layout, args.batches)

    def largest_safe(candidate):
        probe = GradientProbe(nn.WithLossCell(candidate, _weighted_loss(args.loss_weight)))
        grads = [g for batch in batches for g in unscaled_gradients(probe, batch, 1.0)]
        return magnitude_report(grads, 1.0)["largest_safe_scale"]

    trajectory = [(0, largest_safe(network))]
    if args.epochs:
        network = run_training(
            args.model,
            "fp32",
            "none",
            args.epochs,
            args.batch_size,
            args.lr,
            args.seed,
            DEFAULTS["scale_window"],
            args.loss_weight,
            progress=not args.no_progress,
            print_summary=False,
            epoch_callback=lambda epoch, net: trajectory.append((epoch, largest_safe(net))),
        )["network"]
    return network, trajectory


def suggested_fixed_scale(trajectory):
    """Half the smallest largest-safe scale along training, or None for the untrained weights alone.

    Example:
        >>> suggested_fixed_scale([(0, 2.0**19), (1, 2.0**16)]), suggested_fixed_scale([(0, 2.0**19)])
        (32768.0, None)
    """
    if len(trajectory) == 1:
        return None
    return min(scale for _, scale in trajectory) / 2


def scale_advice(trajectory):
    """What ``inspect`` says about a fixed scale, from ``[(epoch, largest safe scale)]``.

    Example:
        >>> print(scale_advice([(0, 2.0**19)]))
        largest scale without float16 overflow at the untrained weights: 2**19. Not a fixed scale to train with: ...
    """
    if len(trajectory) == 1:
        return (
            f"largest scale without float16 overflow at the untrained weights: {format_scale(trajectory[0][1])}. "
            f"Not a fixed scale to train with: gradients grow as the network trains. Use --loss-scale dynamic, "
            f"or measure along training with --epochs N."
        )
    smallest = min(scale for _, scale in trajectory)
    worst = min(trajectory, key=lambda item: item[1])[0]
    suggested = suggested_fixed_scale(trajectory)
    return (
        f"largest scale without float16 overflow along {trajectory[-1][0]} epochs of fp32 training: "
        f"{', '.join(f'{format_scale(s)} (epoch {e})' for e, s in trajectory)}; the smallest, "
        f"{format_scale(smallest)}, at epoch {worst}. Suggested fixed scale: {format_scale(suggested)} (half of it), "
        f"for this model, data, seed, learning rate and number of epochs; longer training or other settings "
        f"need --loss-scale dynamic or a new measurement."
    )


def command_inspect(args):
    output = prepare_output(args.output or default_output("inspect", args), "inspect")
    network, trajectory = largest_safe_along_training(args)
    reference, lost, batches = measure_gradients(args, network)
    report = magnitude_report(reference, args.scale)
    magnitudes = np.abs(np.concatenate([g.ravel() for g in reference]))
    log2 = np.log2(magnitudes[magnitudes > 0])
    weights = "untrained" if not args.epochs else f"after {args.epochs} epochs of fp32 training"
    print(f"{report['count']} nonzero fp32 weight-gradient elements ({args.model}, {weights}, {batches} batches)")
    print(
        f"at loss scale {format_scale(args.scale)}: {100 * report['flushed']:.3f}% flush to zero in fp16, "
        f"{100 * report['subnormal']:.3f}% subnormal, {100 * report['overflow']:.3f}% overflow"
    )
    print(
        f"measured with {args.precision} gradients at that scale: {100 * lost:.3f}% of the nonzero fp32 "
        f"gradient elements are zero"
    )
    print(scale_advice(trajectory))
    _write_json(
        os.path.join(output, "inspect.json"),
        dict(
            report,
            scale=args.scale,
            model=args.model,
            epochs=args.epochs,
            batches=batches,
            measured_lost_fraction=lost,
            largest_safe_along_training=[[e, s] for e, s in trajectory],
            suggested_fixed_scale=suggested_fixed_scale(trajectory),
        ),
    )
    _try_plot(
        plots.plot_histogram,
        log2,
        args.scale,
        os.path.join(output, "gradients.png"),
        f"{args.model}: fp32 weight gradients vs the float16 range ({weights})",
    )
    return EXIT_OK
