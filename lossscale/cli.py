"""Command line: ``python -m lossscale {train,compare,inspect}`` (also the ``lossscale`` console script).

- ``train``: train a reference model on the bundled digits data with a chosen
  precision and loss scaling; progress bar per epoch (loss, scale, skipped steps);
  test accuracy and a loss-scale summary at the end; ``metrics.csv``,
  ``summary.json`` and ``training.png`` in the output folder.
- ``compare``: fp32, fp16 without scaling, fp16 with a fixed scale and fp16 with
  dynamic scaling on the same seed and data; a table and ``compare.png``.
- ``inspect``: histogram of log2|gradient| against the float16 range, the
  fraction lost at a given scale and the largest safe static scale.

Errors in the arguments or the output folder print one line and exit with code 2.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

PRECISIONS = {"fp32": "O0", "O0": "O0", "O2": "O2", "O3": "O3"}
DEFAULTS = {"model": "lenet5", "precision": "O2", "loss_scale": "dynamic", "epochs": 6, "batch_size": 32,
            "lr": 1e-3, "seed": 0, "scale_window": 100, "loss_weight": 1.0}


# The documented comparison (docs/results.md): a loss weighted by 1e-4, as a loss normalised by a large
# token count would be, makes most LeNet5 gradients underflow in fp16 while fp32 Adam is unaffected.
COMPARE_DEFAULTS = {"loss_weight": 1e-4, "epochs": 12}


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CliError(message)


# ---- argument parsing ----------------------------------------------------------------------

def parse_loss_scale(spec, scale_window=DEFAULTS["scale_window"]):
    """Turn ``none`` / ``fixed:S`` / ``dynamic`` / ``preset:NAME`` into ``(label, manager_factory)``.

    ``none`` still uses the lossscale cell (scale 1, every step applied) so that
    overflows are reported; ``dynamic`` is MindSpore's ``DynamicLossScaleManager``
    defaults with ``scale_window`` clean steps per growth; ``preset:NAME`` is a rule of
    :mod:`lossscale.presets` (e.g. ``preset:pytorch``), also with ``scale_window``.

    Example:
        >>> label, factory = parse_loss_scale("fixed:1024")
        >>> label, factory().get_loss_scale()
        ('fixed:1024', 1024.0)
    """
    from lossscale.managers import DynamicLossScaleManager, FixedLossScaleManager

    if spec == "none":
        return "none", lambda: FixedLossScaleManager(1.0, drop_overflow_update=False)
    if spec == "dynamic":
        return "dynamic", lambda: DynamicLossScaleManager(scale_window=scale_window)
    if spec.startswith("fixed:"):
        text = spec[len("fixed:"):]
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value >= 1.0):
            raise CliError(f"--loss-scale fixed:S needs a finite number S >= 1, but got {text!r}")
        return f"fixed:{value:g}", lambda: FixedLossScaleManager(value)
    if spec.startswith("preset:"):
        from lossscale.presets import PRESET_NAMES, get_preset

        name = spec[len("preset:"):]
        if name not in PRESET_NAMES:
            raise CliError(f"unknown preset {name!r}; choose one of: {', '.join(PRESET_NAMES)}")
        policy = get_preset(name, growth_interval=scale_window)
        return spec, lambda: DynamicLossScaleManager.from_policy(policy)
    raise CliError(f"--loss-scale must be 'none', 'fixed:S', 'dynamic' or 'preset:NAME', but got {spec!r}")


def prepare_output(path):
    """Create ``path`` if needed and check it is writable; return its absolute path."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as error:
        raise CliError(f"cannot write to output folder {path!r}: {error.strerror or error}") from None
    return os.path.abspath(path)


def _check_model(name):
    from models import MODELS

    if name not in MODELS:
        raise CliError(f"unknown model {name!r}; choose one of: {', '.join(sorted(MODELS))}")
    return name


def _positive(convert, description):
    """An argparse type: ``convert(text)``, which must be finite and > 0."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be {description}, got {text!r}")
        return value

    return parse


_positive_int = _positive(int, "a positive integer")
_positive_float = _positive(float, "a finite number > 0")


def _add_common_arguments(parser, precision_default):
    parser.add_argument("--model", default=DEFAULTS["model"], help="mlp, lenet5, resnet or transformer "
                        "(default: %(default)s)")
    parser.add_argument("--precision", default=precision_default, choices=sorted(PRECISIONS),
                        help="fp32 (=O0), O2 (fp16, BatchNorm fp32) or O3 (all fp16) (default: %(default)s)")
    parser.add_argument("--epochs", type=_positive_int, default=DEFAULTS["epochs"])
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULTS["batch_size"])
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--scale-window", type=_positive_int, default=DEFAULTS["scale_window"],
                        help="clean steps before the dynamic scale grows (default: %(default)s)")
    parser.add_argument("--loss-weight", type=_positive_float, default=DEFAULTS["loss_weight"],
                        help="multiply the loss by this constant, like a loss normalised by a large token "
                             "count or accumulation factor; Adam is invariant to it in fp32 (default: 1)")
    parser.add_argument("--device", choices=("CPU", "GPU", "Ascend"), default=None,
                        help="MindSpore device target (default: MindSpore's own default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser():
    parser = _Parser(prog="lossscale", description="Loss-scaled float16 training with MindSpore on the "
                                                    "bundled handwritten digits.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = commands.add_parser("train", help="train one configuration")
    _add_common_arguments(train, DEFAULTS["precision"])
    train.add_argument("--loss-scale", default=DEFAULTS["loss_scale"], help="none, fixed:S, dynamic or preset:NAME (pytorch, paddle, keras, jmp, megatron, ...) "
                       "(default: %(default)s)")
    train.add_argument("--output", default=None, help="output folder (default: runs/train-MODEL-PRECISION)")
    train.add_argument("--workers", type=_positive_int, default=1,
                       help="data-parallel processes on this machine, launched with msrun; --batch-size is "
                            "per process (default: 1, no msrun)")

    compare = commands.add_parser("compare", help="fp32 vs fp16 without, with fixed and with dynamic scaling")
    _add_common_arguments(compare, "O3")
    compare.add_argument("--fixed-scale", type=float, default=1024.0)
    compare.set_defaults(**COMPARE_DEFAULTS)
    compare.add_argument("--output", default=None, help="output folder (default: runs/compare-MODEL)")

    inspect = commands.add_parser("inspect", help="gradient magnitudes against the float16 range")
    _add_common_arguments(inspect, "O3")
    inspect.add_argument("--scale", type=float, default=1.0, help="loss scale to evaluate (default: 1)")
    inspect.add_argument("--batches", type=_positive_int, default=4, help="training batches to sample")
    inspect.add_argument("--output", default=None, help="output folder (default: runs/inspect-MODEL)")
    inspect.set_defaults(epochs=0)
    return parser


# ---- training ------------------------------------------------------------------------------

def _progress_callback(monitor, steps_per_epoch, epochs, enabled):
    from mindspore.train import Callback
    from tqdm import tqdm

    class ProgressBar(Callback):
        """One tqdm bar per epoch showing loss, current loss scale and skipped steps."""

        def __init__(self):
            super().__init__()
            self.bar = None

        def on_train_epoch_begin(self, run_context):
            epoch = run_context.original_args().cur_epoch_num
            self.bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{epochs}", unit="step",
                            disable=not enabled, file=sys.stderr, dynamic_ncols=True)

        def on_train_step_end(self, run_context):
            last = monitor.records[-1]
            self.bar.set_postfix(loss=f"{last['loss']:.4f}", scale=f"{last['loss_scale']:g}",
                                 skipped=last["skipped_steps"], refresh=False)
            self.bar.update(1)

        def on_train_epoch_end(self, run_context):
            self.bar.close()

    return ProgressBar()


def _step_timer():
    from mindspore.train import Callback

    class StepTimer(Callback):
        """Wall time between consecutive step ends (the first step, which compiles, is kept apart)."""

        def __init__(self):
            super().__init__()
            self.start = None
            self.ends = []

        def on_train_begin(self, run_context):
            self.start = time.perf_counter()

        def on_train_step_end(self, run_context):
            self.ends.append(time.perf_counter())

        def first_step_seconds(self):
            return self.ends[0] - self.start if self.ends else float("nan")

        def median_step_seconds(self):
            gaps = np.diff(self.ends)
            return float(np.median(gaps)) if len(gaps) else float("nan")

    return StepTimer()


def _weighted_loss(loss_weight):
    """Softmax cross-entropy (mean over the batch) multiplied by ``loss_weight``."""
    from mindspore import nn

    class WeightedCrossEntropy(nn.Cell):
        def __init__(self):
            super().__init__()
            self.base = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            self.weight = loss_weight

        def construct(self, logits, labels):
            return self.base(logits, labels) * self.weight

    return WeightedCrossEntropy() if loss_weight != 1.0 else nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                                             reduction="mean")


def run_training(model="lenet5", precision="O2", loss_scale="dynamic", epochs=6, batch_size=32, lr=1e-3, seed=0,
                 scale_window=100, loss_weight=1.0, progress=True, print_summary=True, shard=None):
    """Train one configuration on the digits data and return a result dict (also the CLI's engine).

    Keys: ``config``, ``records`` (per-step monitor rows), ``summary`` (monitor totals),
    ``test_accuracy``, ``final_loss``, ``seconds_per_step``, ``first_step_seconds``,
    ``model`` (the trained ``lossscale.Model``), ``network`` (the trained backbone).
    ``shard=(rank, size)`` trains on this rank's share of every epoch (data parallel).
    """
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Accuracy

    from lossscale.integration import Model
    from lossscale.monitor import LossScaleMonitor
    from models import create_model, load_digits, make_dataset, train_test_split

    _check_model(model)
    label, manager_factory = parse_loss_scale(loss_scale, scale_window)
    ms.set_seed(seed)
    images, labels = load_digits()
    (x_train, y_train), (x_test, y_test) = train_test_split(images, labels, seed=0)
    network = create_model(model)
    train_data = make_dataset(x_train, y_train, batch_size, network.input_layout, shuffle=True, seed=seed,
                              shard=shard)
    steps_per_epoch = train_data.get_dataset_size()
    if steps_per_epoch == 0:
        raise CliError(f"--batch-size {batch_size} is larger than the {len(y_train)} training images")
    optimizer = nn.Adam(network.trainable_params(), learning_rate=lr)
    loss_fn = _weighted_loss(loss_weight)
    trained = Model(network, loss_fn, optimizer, metrics={"accuracy": Accuracy()},
                    amp_level=PRECISIONS[precision], loss_scale_manager=manager_factory())
    monitor = LossScaleMonitor(print_summary=False)
    timer = _step_timer()
    trained.train(epochs, train_data, callbacks=[monitor, _progress_callback(monitor, steps_per_epoch, epochs,
                                                                              progress), timer])
    test_data = make_dataset(x_test, y_test, 64, network.input_layout, drop_remainder=False)
    accuracy = float(trained.eval(test_data)["accuracy"])
    summary = monitor.summary()
    if print_summary:
        print(monitor.format_summary())
    return {
        "config": {"model": model, "precision": precision, "loss_scale": label, "epochs": epochs,
                   "batch_size": batch_size, "lr": lr, "seed": seed, "scale_window": scale_window,
                   "loss_weight": loss_weight},
        "records": monitor.records,
        "summary": summary,
        "test_accuracy": accuracy,
        "final_loss": summary["final_loss"],
        "seconds_per_step": timer.median_step_seconds(),
        "first_step_seconds": timer.first_step_seconds(),
        "model": trained,
        "network": network,
    }


def _unweighted(result):
    """The run's monitor records with the loss divided by the loss weight (for plots)."""
    weight = result["config"]["loss_weight"]
    return [dict(record, loss=record["loss"] / weight) for record in result["records"]]


def _public(result):
    """The JSON-serialisable part of a :func:`run_training` result."""
    return {k: v for k, v in result.items() if k not in ("model", "network", "records")}


def _write_json(path, payload):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)


def _try_plot(function, *args):
    """Call a plot function; print where the PNG went, or the one-line reason there is none."""
    from lossscale.plots import PlotUnavailable

    try:
        print(f"plot: {function(*args)}")
    except PlotUnavailable as reason:
        print(f"plot: {reason}")


# ---- commands ------------------------------------------------------------------------------

def launch_workers(args, output):
    """Re-run this command under msrun with ``args.workers`` processes; print rank 0's report."""
    from lossscale.distributed import launch_environment, msrun_command, run_msrun

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
    argv = [a for a in (args.argv or []) if a]
    log_dir = os.path.join(output, "msrun_logs")
    command = msrun_command(script, argv, workers=args.workers, log_dir=log_dir)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"launching {args.workers} data-parallel workers: {' '.join(command)}", flush=True)
    done = run_msrun(command, timeout=None, env=launch_environment(package_root))
    rank0 = os.path.join(log_dir, "worker_0.log")
    if os.path.exists(rank0):
        with open(rank0, encoding="utf-8", errors="replace") as handle:
            print("".join(line for line in handle if not line.startswith(("[WARNING]", "[INFO]"))), end="")
    if done.returncode != 0:
        raise CliError(f"msrun failed with exit code {done.returncode}; worker logs are in {log_dir}")
    return 0


def command_train(args):
    from lossscale.distributed import init_data_parallel, inside_msrun, launched_by_us
    from lossscale.monitor import LossScaleMonitor
    from lossscale.plots import plot_training

    _check_model(args.model)
    parse_loss_scale(args.loss_scale, args.scale_window)
    output = prepare_output(args.output or os.path.join("runs", f"train-{args.model}-{args.precision}"))
    shard, rank = None, 0
    if args.workers > 1:
        if not inside_msrun():
            if launched_by_us():
                raise CliError("started by msrun but MS_ROLE is not set; refusing to launch msrun again")
            return launch_workers(args, output)
        rank, size = init_data_parallel()
        shard = (rank, size)
        print(f"rank {rank} of {size}: per-rank batch {args.batch_size}, global batch {args.batch_size * size}")
    result = run_training(args.model, args.precision, args.loss_scale, args.epochs, args.batch_size, args.lr,
                          args.seed, args.scale_window, args.loss_weight,
                          progress=not args.no_progress and rank == 0, shard=shard)
    if rank != 0:
        return 0
    monitor = LossScaleMonitor(print_summary=False)
    monitor.records = result["records"]
    monitor.write_csv(os.path.join(output, "metrics.csv"))
    _write_json(os.path.join(output, "summary.json"), _public(result))
    config = result["config"]
    final_loss = result["final_loss"] / result["config"]["loss_weight"]
    print(f"test accuracy: {100 * result['test_accuracy']:.2f}%   final loss: {final_loss:.4f}   "
          f"time/step: {1e3 * result['seconds_per_step']:.2f} ms")
    print(f"metrics: {os.path.join(output, 'metrics.csv')}  summary: {os.path.join(output, 'summary.json')}")
    title = f"{config['model']} {config['precision']} loss scale {config['loss_scale']}"
    _try_plot(plot_training, _unweighted(result), os.path.join(output, "training.png"), title)
    return 0


def _copy_of(model_name, network):
    """A freshly built ``model_name`` holding ``network``'s current weights."""
    import mindspore as ms

    from models import create_model

    copy = create_model(model_name)
    ms.load_param_into_net(copy, {p.name: ms.Parameter(p.data.copy(), name=p.name)
                                  for p in network.get_parameters()})
    return copy


def _first_training_batches(batch_size, layout, count):
    """The first ``count`` ``(x, y)`` batches of the (unshuffled) digits training split."""
    from models import load_digits, make_dataset, train_test_split

    (x_train, y_train), _ = train_test_split(*load_digits(), seed=0)
    data = make_dataset(x_train, y_train, batch_size, layout)
    return [batch for _, batch in zip(range(count), data.create_tuple_iterator())]


def gradient_loss_at_end(result, batches=4):
    """Fraction of gradient elements zero in the run's precision but nonzero in fp32, at its final weights
    and final loss scale, averaged over the first ``batches`` training batches."""
    from mindspore import nn

    from lossscale.diagnostics import GradientProbe, lost_fraction, unscaled_gradients

    config = result["config"]
    reference = _copy_of(config["model"], result["network"])
    reference_probe = GradientProbe(nn.WithLossCell(reference, _weighted_loss(config["loss_weight"])))
    run_probe = GradientProbe(result["model"].train_network.network)
    scale = result["summary"]["final_loss_scale"] or 1.0
    fractions = [lost_fraction(unscaled_gradients(reference_probe, batch, 1.0),
                               unscaled_gradients(run_probe, batch, scale))
                 for batch in _first_training_batches(config["batch_size"], reference.input_layout, batches)]
    return float(np.mean(fractions))


def compare_runs(args):
    """Run the four configurations of ``compare``; return ``[(label, result)]``."""
    fp16 = args.precision if args.precision != "fp32" else "O3"
    plan = [("fp32", "fp32", "none"), ("fp16 no scaling", fp16, "none"),
            (f"fp16 fixed {args.fixed_scale:g}", fp16, f"fixed:{args.fixed_scale:g}"),
            ("fp16 dynamic", fp16, "dynamic")]
    runs = []
    for label, precision, loss_scale in plan:
        print(f"== {label} ({precision}, loss scale {loss_scale})")
        result = run_training(args.model, precision, loss_scale, args.epochs, args.batch_size, args.lr, args.seed,
                              args.scale_window, args.loss_weight, progress=not args.no_progress)
        result["gradient_lost_fraction"] = gradient_loss_at_end(result)
        runs.append((label, result))
    return runs


def format_comparison(runs):
    """The comparison table as text (final loss divided by the loss weight)."""
    header = (f"{'run':<22}{'test acc %':>11}{'final loss':>12}{'grad lost %':>13}{'skipped':>9}"
              f"{'ms/step':>9}")
    lines = [header, "-" * len(header)]
    for label, result in runs:
        final_loss = result["final_loss"] / result["config"]["loss_weight"]
        lines.append(f"{label:<22}{100 * result['test_accuracy']:>11.2f}{final_loss:>12.4f}"
                     f"{100 * result['gradient_lost_fraction']:>13.3f}{result['summary']['skipped_steps']:>9d}"
                     f"{1e3 * result['seconds_per_step']:>9.2f}")
    return "\n".join(lines)


def command_compare(args):
    from lossscale.plots import plot_comparison

    _check_model(args.model)
    parse_loss_scale(f"fixed:{args.fixed_scale}")
    output = prepare_output(args.output or os.path.join("runs", f"compare-{args.model}"))
    runs = compare_runs(args)
    table = format_comparison(runs)
    fp32_accuracy = runs[0][1]["test_accuracy"]
    dynamic_accuracy = runs[-1][1]["test_accuracy"]
    gap = 100 * (fp32_accuracy - dynamic_accuracy)
    verdict = (f"dynamic scaling vs fp32: {gap:+.2f} percentage points "
               f"({'within' if gap <= 0.5 else 'NOT within'} 0.5)")
    print(table)
    print(verdict)
    with open(os.path.join(output, "compare.txt"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n" + verdict + "\n")
    _write_json(os.path.join(output, "compare.json"), {label: _public(result) for label, result in runs})
    title = f"{args.model}: fp32 vs fp16 ({runs[1][1]['config']['precision']}) loss scaling"
    _try_plot(plot_comparison, {label: _unweighted(result) for label, result in runs},
              os.path.join(output, "compare.png"), title)
    return 0


def command_inspect(args):
    import mindspore as ms
    from mindspore import nn

    from lossscale.diagnostics import GradientProbe, lost_fraction, magnitude_report, unscaled_gradients
    from lossscale.integration import build_train_network
    from lossscale.plots import plot_histogram
    from models import create_model

    _check_model(args.model)
    if not (math.isfinite(args.scale) and args.scale > 0):
        raise CliError(f"--scale must be a finite number > 0, but got {args.scale!r}")
    output = prepare_output(args.output or os.path.join("runs", f"inspect-{args.model}"))
    if args.epochs:
        network = run_training(args.model, "fp32", "none", args.epochs, args.batch_size, args.lr, args.seed,
                               args.scale_window, args.loss_weight, progress=not args.no_progress)["network"]
    else:
        ms.set_seed(args.seed)
        network = create_model(args.model)
    loss_fn = _weighted_loss(args.loss_weight)
    reference_probe = GradientProbe(nn.WithLossCell(network, loss_fn))
    fp16_copy = _copy_of(args.model, network)
    fp16_network = build_train_network(fp16_copy, nn.SGD(fp16_copy.trainable_params(), 0.0), loss_fn,
                                       level=PRECISIONS[args.precision],
                                       loss_scale_manager=parse_loss_scale("none")[1]()).network
    fp16_probe = GradientProbe(fp16_network)
    reference, lost = [], []
    for batch in _first_training_batches(args.batch_size, network.input_layout, args.batches):
        grads = unscaled_gradients(reference_probe, batch, 1.0)
        reference.extend(grads)
        lost.append(lost_fraction(grads, unscaled_gradients(fp16_probe, batch, args.scale)))
    report = magnitude_report(reference, args.scale)
    magnitudes = np.abs(np.concatenate([g.ravel() for g in reference]))
    log2 = np.log2(magnitudes[magnitudes > 0])
    print(f"{report['count']} nonzero fp32 weight-gradient elements ({args.model}, {args.batches} batches)")
    print(f"at loss scale {args.scale:g}: {100 * report['flushed']:.3f}% flush to zero in fp16, "
          f"{100 * report['subnormal']:.3f}% subnormal, {100 * report['overflow']:.3f}% overflow")
    print(f"measured with {args.precision} gradients at that scale: {100 * float(np.mean(lost)):.3f}% of the "
          f"nonzero fp32 gradient elements are zero")
    print(f"largest safe static scale (weight gradients stay <= 65504): {report['largest_safe_scale']:g}")
    _write_json(os.path.join(output, "inspect.json"), dict(report, scale=args.scale, model=args.model,
                                                           measured_lost_fraction=float(np.mean(lost))))
    _try_plot(plot_histogram, log2, args.scale, os.path.join(output, "gradients.png"),
              f"{args.model}: fp32 weight gradients vs the float16 range")
    return 0


COMMANDS = {"train": command_train, "compare": command_compare, "inspect": command_inspect}


def main(argv=None):
    """Entry point; returns the process exit code (0 ok, 2 usage or output-folder error)."""
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        import mindspore as ms

        ms.set_context(mode=ms.GRAPH_MODE)
        if args.device:
            ms.set_context(device_target=args.device)
        return COMMANDS[args.command](args)
    except CliError as error:
        print(f"lossscale: error: {error}", file=sys.stderr)
        return 2
