"""Command line: ``python -m lossscale {train,compare,inspect}`` (also the ``lossscale`` console script).

- ``train``: train a reference model on the bundled digits data with a chosen precision and
  loss scaling; a progress bar per epoch (loss, scale, skipped steps); the test accuracy and a
  loss-scale summary at the end; ``metrics.csv``, ``summary.json`` and ``training.png`` in the
  output folder. A run whose steps are mostly skipped because of overflow says so on stderr.
- ``compare``: fp32, fp16 without scaling, fp16 with a fixed scale and fp16 with dynamic scaling
  on the same seed and data; a table and ``compare.png``. ``--results PAGE.md`` also writes the
  results page of the documentation (docs/results.md) with its figures.
- ``inspect``: histogram of log2|gradient| against the float16 range, the fraction lost at a
  given scale, and the largest scale without overflow, at the initial weights or along training.

Exit codes: 0 success; 1 training stopped by persistent overflow (``--overflow-policy raise``) or a
``train`` run in which no step was applied (every step overflowed); 2 a usage error, an unavailable
device or an unwritable output folder (one line on stderr).
MindSpore and NumPy are imported only once a command runs, so ``--help`` and ``--version`` are
immediate. Unless the environment sets ``ONEDNN_MAX_CPU_ISA``, a command limits oneDNN's CPU kernels to AVX2: with
MindSpore 2.10 on an AVX-512 CPU, convolutions are then about 25 times faster (:mod:`lossscale._cpu_kernels`).
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings

from lossscale._cpu_kernels import prefer_fast_cpu_convolutions
from lossscale._text import format_scale, plural
from lossscale._validation import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX

EXIT_OK, EXIT_STALLED, EXIT_USAGE = 0, 1, 2
PRECISIONS = {"fp32": "O0", "O0": "O0", "O2": "O2", "O3": "O3"}
FP16_PRECISIONS = ("O2", "O3")
MODEL_NAMES = ("mlp", "lenet5", "resnet", "transformer")  # lossscale_models.MODELS, without importing MindSpore
OVERFLOW_POLICIES = ("skip", "warn", "raise")
# A run that skips this share of its steps is reported as stalled by overflow.
STALLED_SHARE = 0.10
DEFAULTS = {"model": "lenet5", "precision": "O2", "loss_scale": "dynamic", "epochs": 6, "batch_size": 32,
            "lr": 1e-3, "seed": 0, "scale_window": 100, "loss_weight": 1.0}
# The documented comparison (docs/results.md): LeNet5 in O3 with the loss weighted by 1e-4, as a loss
# normalised by a large token count would be, so that most gradients underflow in float16.
COMPARE_DEFAULTS = {"precision": "O3", "loss_weight": 1e-4, "epochs": 3, "fixed_scale": 1024.0}
OUTPUT_FILES = {"train": ("metrics.csv", "summary.json", "training.png"),
                "compare": ("compare.txt", "compare.json", "compare.png"),
                "inspect": ("inspect.json", "gradients.png")}


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class TrainingStalled(Exception):
    """Training stopped by ``--overflow-policy raise``: printed as one line, exit code 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CliError(message)


class _Formatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, unless its help text says it already or there is none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


# ---- values ---------------------------------------------------------------------------------

def _number(convert, description, check):
    """An argparse type: ``convert(text)`` that passes ``check``; else a one-line error naming the rule."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {description}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"must be {description}, got {text!r}")
        return value

    return parse


# Counts (epochs, windows, batches, workers) and factors (learning rate, loss weight) as MindSpore holds them: int32
# and float32 (a larger epoch count failed inside MindSpore's dataset, a loss weight of 1e39 was inf).
_positive_int = _number(int, f"an integer in [1, {INT32_MAX}]", lambda v: 1 <= v <= INT32_MAX)
_non_negative_int = _number(int, f"an integer in [0, {INT32_MAX}]", lambda v: 0 <= v <= INT32_MAX)
_seed = _number(int, "an integer in [0, 2**32-1]", lambda v: 0 <= v < 2**32)
_positive_float = _number(float, "a number in [1.2e-38, 3.4e38] (float32's normal range)",
                          lambda v: FLOAT32_TINY <= v <= FLOAT32_MAX)
# A loss scale is a float32 Parameter: a larger number would be inf.
_scale_value = _number(float, "a number in [1, 3.4e38] (float32's range)", lambda v: 1 <= v <= FLOAT32_MAX)
_probe_scale = _number(float, "a number in (0, 3.4e38] (float32's range)", lambda v: 0 < v <= FLOAT32_MAX)


def parse_loss_scale(spec, scale_window=DEFAULTS["scale_window"]):
    """Turn ``none`` / ``fixed:S`` / ``dynamic`` / ``preset:NAME`` into ``(label, manager_factory)``.

    ``none`` still uses the lossscale cell (scale 1, every step applied) so that overflows are
    reported; ``dynamic`` is MindSpore's ``DynamicLossScaleManager`` defaults with
    ``scale_window`` clean steps per growth; ``preset:NAME`` is a rule of
    :mod:`lossscale.presets` (e.g. ``preset:pytorch``), also with ``scale_window``.

    Example:
        >>> label, factory = parse_loss_scale("fixed:1024")
        >>> label, factory().get_loss_scale()
        ('fixed:1024', 1024.0)
    """
    from lossscale.presets import PRESET_NAMES  # pylint: disable=import-outside-toplevel

    if spec == "none":
        return "none", _manager("fixed", 1.0, drop=False)
    if spec == "dynamic":
        return "dynamic", _manager("dynamic", scale_window)
    if spec.startswith("fixed:"):
        text = spec[len("fixed:"):]
        try:
            value = _scale_value(text)
        except argparse.ArgumentTypeError:
            raise CliError(f"--loss-scale fixed:S needs a number S in [1, 3.4e38] (float32's range), "
                           f"but got {text!r}") from None
        return f"fixed:{value:g}", _manager("fixed", value)
    if spec.startswith("preset:"):
        name = spec[len("preset:"):]
        if name not in PRESET_NAMES:
            raise CliError(f"unknown preset {name!r}; choose one of: {', '.join(PRESET_NAMES)}")
        return spec, _manager("preset", (name, scale_window))
    raise CliError(f"--loss-scale must be 'none', 'fixed:S', 'dynamic' or 'preset:NAME', but got {spec!r}")


def _manager(kind, value, drop=True):
    """A factory of the loss-scale manager for a parsed ``--loss-scale``."""
    def build():
        # pylint: disable=import-outside-toplevel
        from lossscale.managers import DynamicLossScaleManager, FixedLossScaleManager
        from lossscale.presets import get_preset

        if kind == "fixed":
            return FixedLossScaleManager(value, drop_overflow_update=drop)
        if kind == "dynamic":
            return DynamicLossScaleManager(scale_window=value)
        name, window = value
        return DynamicLossScaleManager.from_policy(get_preset(name, growth_interval=window))

    return build


def prepare_output(path, command, announce=True):
    """Create ``path`` if needed and check it is writable; say which earlier results it replaces (unless not
    ``announce``: the workers that ``--workers`` launches, whose launcher said it already), then remove them, so
    that a file this run does not write (a plot it could not draw) never sits beside its results."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as error:
        raise CliError(f"cannot write to output folder {path!r}: {error.strerror or error}") from None
    replaced = [name for name in OUTPUT_FILES[command] if os.path.exists(os.path.join(path, name))]
    if replaced and announce:
        print(f"note: replacing {', '.join(replaced)} in {path}", file=sys.stderr)
    for name in replaced:
        os.remove(os.path.join(path, name))
    return os.path.abspath(path)


def _check_model(name):
    if name not in MODEL_NAMES:
        raise CliError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    return name


def _check_batch_size(batch_size, workers=1):
    """Every command needs one full batch of the training split on each worker (batches are whole): refused
    before any work."""
    from lossscale_models import load_digits, train_test_split  # pylint: disable=import-outside-toplevel

    (_, y_train), _ = train_test_split(*load_digits(), seed=0)
    _refuse_empty_epoch(batch_size, len(y_train), workers, steps_per_epoch=None)
    return batch_size


def _refuse_empty_epoch(batch_size, images, workers, steps_per_epoch):
    """CliError when a worker's share of the ``images`` training images (``ceil(images / workers)``, as MindSpore
    shards them) holds no full batch; ``steps_per_epoch``, when known, is the dataset's own count."""
    share = -(-images // workers)
    empty = batch_size > share if steps_per_epoch is None else steps_per_epoch == 0
    if empty:
        where = f"the {images} training images" if workers == 1 else (
            f"the {share} training images of each of the {workers} workers ({images} in all)")
        raise CliError(f"--batch-size {batch_size} is larger than {where}")


# ---- the parser -------------------------------------------------------------------------------

def _version():
    from importlib import metadata  # pylint: disable=import-outside-toplevel

    from lossscale import __version__  # pylint: disable=import-outside-toplevel

    try:
        mindspore = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        mindspore = "not installed"
    return f"lossscale {__version__} (MindSpore {mindspore})"


def _add_model_and_data(parser, defaults, batch_help="images per step"):
    parser.add_argument("--model", default=DEFAULTS["model"], help=f"network: {', '.join(MODEL_NAMES)}")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULTS["batch_size"], help=batch_help)
    parser.add_argument("--seed", type=_seed, default=DEFAULTS["seed"],
                        help="initialisation and data order")
    parser.add_argument("--loss-weight", type=_positive_float, default=defaults["loss_weight"],
                        help="multiply the loss by this constant, like a loss normalised by a large token count; "
                             "Adam is nearly invariant to it in fp32, float16 gradients are not")
    parser.add_argument("--device", choices=("CPU", "GPU", "Ascend"), default=None,
                        help="MindSpore device target (default: MindSpore's own)")


def _add_training(parser, epochs, epochs_help="passes over the 1438 training images", lr_help="Adam learning rate"):
    parser.add_argument("--epochs", type=_positive_int if epochs else _non_negative_int, default=epochs,
                        help=epochs_help)
    parser.add_argument("--lr", type=_positive_float, default=DEFAULTS["lr"], help=lr_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser():
    parser = _Parser(prog="lossscale", description="Loss-scaled float16 training with MindSpore on the bundled "
                     "handwritten digits.", formatter_class=_Formatter)
    parser.add_argument("--version", action="store_true", help="print the versions of lossscale and MindSpore")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = commands.add_parser("train", help="train one configuration", formatter_class=_Formatter,
                                description="Train one configuration and report the loss scaling.")
    _add_model_and_data(train, DEFAULTS, "images per step (per process with --workers)")
    train.add_argument("--precision", default=DEFAULTS["precision"], choices=sorted(PRECISIONS),
                       help="fp32 (= O0), O2 (fp16 compute, BatchNorm fp32) or O3 (all fp16)")
    train.add_argument("--loss-scale", default=DEFAULTS["loss_scale"],
                       help="none, fixed:S, dynamic or preset:NAME (pytorch, paddle, keras, jmp, megatron, ...)")
    train.add_argument("--scale-window", type=_positive_int, default=DEFAULTS["scale_window"],
                       help="clean steps before a dynamic scale grows")
    _add_training(train, DEFAULTS["epochs"])
    train.add_argument("--overflow-policy", choices=OVERFLOW_POLICIES, default="warn",
                       help="when overflows persist (--max-consecutive-overflows in a row, or at the minimum "
                            "scale): keep skipping, warn once, or stop with exit code 1")
    train.add_argument("--max-consecutive-overflows", type=_positive_int, default=50,
                       help="consecutive skipped steps that count as persistent overflow")
    train.add_argument("--workers", type=_positive_int, default=1,
                       help="data-parallel processes on this machine, launched with msrun")
    train.add_argument("--output", default=None, help="output folder (default: runs/train-MODEL-PRECISION)")

    compare = commands.add_parser("compare", help="fp32 vs fp16 without, with fixed and with dynamic scaling",
                                  formatter_class=_Formatter,
                                  description="Train fp32, fp16 without scaling, fp16 with a fixed scale and fp16 "
                                              "with dynamic scaling on the same seed and data.")
    _add_model_and_data(compare, COMPARE_DEFAULTS)
    compare.add_argument("--precision", default=COMPARE_DEFAULTS["precision"], choices=FP16_PRECISIONS,
                         help="the fp16 level of the three fp16 runs (the first run is always fp32)")
    compare.add_argument("--fixed-scale", type=_scale_value, default=COMPARE_DEFAULTS["fixed_scale"],
                         help="the scale of the fixed-scale run")
    compare.add_argument("--scale-window", type=_positive_int, default=DEFAULTS["scale_window"],
                         help="clean steps before the dynamic scale grows")
    _add_training(compare, COMPARE_DEFAULTS["epochs"])
    compare.add_argument("--output", default=None, help="output folder (default: runs/compare-MODEL)")
    compare.add_argument("--results", default=None, metavar="PAGE.md",
                         help="also write the results page (markdown, with its figures in images/ next to it), "
                              "as docs/results.md is made")

    inspect = commands.add_parser("inspect", help="gradient magnitudes against the float16 range",
                                  formatter_class=_Formatter,
                                  description="Where the fp32 weight gradients fall in the float16 range at a loss "
                                              "scale, and the largest scale without overflow.")
    _add_model_and_data(inspect, DEFAULTS)
    inspect.add_argument("--precision", default="O3", choices=FP16_PRECISIONS,
                         help="the fp16 level whose gradients are measured at --scale")
    inspect.add_argument("--scale", type=_probe_scale, default=1.0, help="loss scale to evaluate")
    inspect.add_argument("--batches", type=_positive_int, default=4, help="training batches to sample")
    _add_training(inspect, 0, "train in fp32 for this many epochs first, measuring the largest scale without "
                  "overflow at the start and after every epoch (0: the untrained network only)",
                  "Adam learning rate of the training with --epochs")
    inspect.add_argument("--output", default=None, help="output folder (default: runs/inspect-MODEL)")
    return parser


# ---- training ---------------------------------------------------------------------------------

def _progress_callback(monitor, steps_per_epoch, epochs, enabled, loss_weight):
    from mindspore.train import Callback  # pylint: disable=import-outside-toplevel
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    class ProgressBar(Callback):
        """One tqdm bar per epoch showing the (unweighted) loss, the current loss scale and skipped steps."""

        def __init__(self):
            super().__init__()
            self.bar = None

        def on_train_epoch_begin(self, run_context):
            epoch = run_context.original_args().cur_epoch_num
            self.bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{epochs}", unit="step",
                            disable=not enabled, file=sys.stderr, dynamic_ncols=True)

        def on_train_step_end(self, run_context):
            last = monitor.records[-1]
            self.bar.set_postfix(loss=f"{last['loss'] / loss_weight:.4f}", scale=format_scale(last["next_loss_scale"]),
                                 skipped=last["skipped_steps"], refresh=False)
            self.bar.update(1)

        def on_train_epoch_end(self, run_context):
            self.bar.close()

    return ProgressBar()


def _step_timer():
    from mindspore.train import Callback  # pylint: disable=import-outside-toplevel

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
            import numpy as np  # pylint: disable=import-outside-toplevel

            gaps = np.diff(self.ends)
            return float(np.median(gaps)) if len(gaps) else float("nan")

    return StepTimer()


def _epoch_probe(callback):
    """A MindSpore callback calling ``callback(epoch)`` at the end of every epoch."""
    from mindspore.train import Callback  # pylint: disable=import-outside-toplevel

    class EpochProbe(Callback):
        def on_train_epoch_end(self, run_context):
            callback(run_context.original_args().cur_epoch_num)

    return EpochProbe()


def _weighted_loss(loss_weight):
    """Softmax cross-entropy (mean over the batch) multiplied by ``loss_weight``."""
    from mindspore import nn  # pylint: disable=import-outside-toplevel

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
                 scale_window=100, loss_weight=1.0, progress=True, print_summary=True, shard=None,
                 overflow_policy="skip", max_consecutive_overflows=None, epoch_callback=None):
    """Train one configuration on the digits data and return a result dict (also the CLI's engine).

    Keys: ``config``, ``records`` (per-step monitor rows), ``summary`` (monitor totals),
    ``test_accuracy``, ``final_loss``, ``seconds_per_step``, ``first_step_seconds``,
    ``model`` (the trained ``lossscale.Model``), ``network`` (the trained backbone).
    ``shard=(rank, size)`` trains on this rank's share of every epoch (data parallel);
    ``epoch_callback(epoch, network)`` runs after every epoch.
    """
    # pylint: disable=import-outside-toplevel
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Accuracy

    from lossscale.bookkeeping import PersistentOverflowError
    from lossscale.integration import Model
    from lossscale.monitor import LossScaleMonitor
    from lossscale_models import create_model, load_digits, make_dataset, train_test_split

    _check_model(model)
    label, manager_factory = parse_loss_scale(loss_scale, scale_window)
    ms.set_seed(seed)
    images, labels = load_digits()
    (x_train, y_train), (x_test, y_test) = train_test_split(images, labels, seed=0)
    network = create_model(model)
    train_data = make_dataset(x_train, y_train, batch_size, network.input_layout, shuffle=True, seed=seed,
                              shard=shard)
    steps_per_epoch = train_data.get_dataset_size()
    _refuse_empty_epoch(batch_size, len(y_train), 1 if shard is None else shard[1], steps_per_epoch)
    optimizer = nn.Adam(network.trainable_params(), learning_rate=lr)
    policy = {} if overflow_policy == "skip" else {"overflow_policy": overflow_policy,
                                                   "max_consecutive_overflows": max_consecutive_overflows}
    trained = Model(network, _weighted_loss(loss_weight), optimizer, metrics={"accuracy": Accuracy()},
                    amp_level=PRECISIONS[precision], loss_scale_manager=manager_factory(), **policy)
    monitor = LossScaleMonitor(print_summary=False)
    timer = _step_timer()
    callbacks = [monitor, _progress_callback(monitor, steps_per_epoch, epochs, progress, loss_weight), timer]
    if epoch_callback is not None:
        callbacks.append(_epoch_probe(lambda epoch: epoch_callback(epoch, network)))
    try:
        trained.train(epochs, train_data, callbacks=callbacks)
    except PersistentOverflowError as error:
        raise TrainingStalled(command_line_advice(str(error))) from None
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


# What to try when overflow stalls training, in the command line's own options.
CLI_OVERFLOW_ADVICE = ("Try: lossscale inspect (where the gradients fall in the float16 range), a lower --lr, "
                       "--loss-scale dynamic or a smaller fixed:S, or --precision fp32 to compare.")


def command_line_advice(message):
    """A library message about persistent overflow with its advice and its argument names (the library's)
    replaced by the command line's (:data:`CLI_OVERFLOW_ADVICE`, ``--max-consecutive-overflows``)."""
    from lossscale.bookkeeping import PERSISTENT_OVERFLOW_ADVICE  # pylint: disable=import-outside-toplevel

    return message.replace(PERSISTENT_OVERFLOW_ADVICE, CLI_OVERFLOW_ADVICE).replace(
        "(max_consecutive_overflows=", "(--max-consecutive-overflows ")


def nothing_trained(result):
    """The one-line error for a run in which no step was applied (every step overflowed), or None.

    Example:
        >>> print(nothing_trained({"records": [{"overflow": True}]}))
        nothing was trained: the 1 step overflowed and was skipped. Try: lossscale inspect (where the gradients fall in the float16 range), a lower --lr, --loss-scale dynamic or a smaller fixed:S, or --precision fp32 to compare.
    """
    flags = [record["overflow"] for record in result["records"]]
    if not flags or not all(flags):
        return None
    steps = "the 1 step overflowed and was skipped" if len(flags) == 1 else (
        f"all {len(flags)} steps overflowed and were skipped")
    return f"nothing was trained: {steps}. {CLI_OVERFLOW_ADVICE}"


def stall_warning(result):
    """The warning for a run whose steps were mostly skipped by overflow, or None.

    The backoffs of a dynamic scale at the start of training (from 2**24, say) are how it finds its
    level, so steps are counted from the first applied one. A run is stalled when at least
    :data:`STALLED_SHARE` of the later steps (and at least 5) were skipped; a run in which no step was applied
    is :func:`nothing_trained`'s.

    Example:
        >>> records = [{"overflow": flag} for flag in [True] * 3 + [False, True, True] * 3]
        >>> print(stall_warning({"records": records, "config": {"loss_scale": "fixed:524288"}}))
        WARNING: overflow stalled training: 9 of 12 steps (75%) were skipped, so the weights were updated on 3 steps only. The scale fixed:524288 is too large for this model's gradients: use --loss-scale dynamic, a smaller fixed scale, or lossscale inspect --epochs N to measure one.
    """
    flags = [record["overflow"] for record in result["records"]]
    skipped = sum(flags)
    if False not in flags:
        return None  # nothing applied, or nothing run: nothing_trained() says so
    later = flags[flags.index(False):]
    if sum(later) < max(5, STALLED_SHARE * len(later)):
        return None
    label = result["config"]["loss_scale"]
    if label.startswith("fixed:"):
        advice = (f"The scale {label} is too large for this model's gradients: use --loss-scale dynamic, a smaller "
                  f"fixed scale, or lossscale inspect --epochs N to measure one.")
    else:
        advice = ("Look for inf/nan in the data or the model (a lower --lr often helps), or train in fp32 to "
                  "compare.")
    return (f"WARNING: overflow stalled training: {skipped} of {plural(len(flags), 'step')} "
            f"({100 * skipped / len(flags):.0f}%) were skipped, so the weights were updated on "
            f"{plural(len(flags) - skipped, 'step')} only. {advice}")


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
    from lossscale.plots import PlotUnavailable  # pylint: disable=import-outside-toplevel

    try:
        path = function(*args)
    except PlotUnavailable as reason:
        print(f"plot: {reason}")
        return None
    print(f"plot: {path}")
    return path


# ---- commands ---------------------------------------------------------------------------------

def launch_workers(args, output):
    """Re-run this command under msrun with ``args.workers`` processes; print rank 0's report."""
    from lossscale.distributed import launch_environment, msrun_command, run_msrun  # pylint: disable=import-outside-toplevel

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
    return EXIT_OK


def command_train(args):
    # pylint: disable=import-outside-toplevel
    from lossscale.distributed import init_data_parallel, inside_msrun, launched_by_us
    from lossscale.monitor import LossScaleMonitor
    from lossscale.plots import plot_training

    parse_loss_scale(args.loss_scale, args.scale_window)
    output = prepare_output(args.output or os.path.join("runs", f"train-{args.model}-{args.precision}"), "train",
                            announce=not launched_by_us())
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
                          progress=not args.no_progress and rank == 0, shard=shard,
                          overflow_policy=args.overflow_policy,
                          max_consecutive_overflows=args.max_consecutive_overflows)
    if rank != 0:
        return EXIT_OK
    monitor = LossScaleMonitor(print_summary=False)
    monitor.records = result["records"]
    monitor.write_csv(os.path.join(output, "metrics.csv"))
    warning = stall_warning(result)
    stalled = warning is not None or nothing_trained(result) is not None
    _write_json(os.path.join(output, "summary.json"), dict(_public(result), stalled_by_overflow=stalled))
    config = result["config"]
    final_loss = result["final_loss"] / config["loss_weight"] if result["final_loss"] is not None else float("nan")
    print(f"test accuracy: {100 * result['test_accuracy']:.2f}%   final loss: {final_loss:.4f}   "
          f"time/step: {1e3 * result['seconds_per_step']:.2f} ms")
    print(f"metrics: {os.path.join(output, 'metrics.csv')}  summary: {os.path.join(output, 'summary.json')}")
    title = f"{config['model']} {config['precision']} loss scale {config['loss_scale']}"
    _try_plot(plot_training, _unweighted(result), os.path.join(output, "training.png"), title)
    if warning:
        print(warning, file=sys.stderr)
    nothing = nothing_trained(result)
    if nothing:
        raise TrainingStalled(nothing)
    return EXIT_OK


def _copy_of(model_name, network):
    """A freshly built ``model_name`` holding ``network``'s current weights."""
    # pylint: disable=import-outside-toplevel
    import mindspore as ms

    from lossscale_models import create_model

    copy = create_model(model_name)
    ms.load_param_into_net(copy, {p.name: ms.Parameter(p.data.copy(), name=p.name)
                                  for p in network.get_parameters()})
    return copy


def _first_training_batches(batch_size, layout, count):
    """The first ``count`` ``(x, y)`` batches of the (unshuffled) digits training split."""
    from lossscale_models import load_digits, make_dataset, train_test_split  # pylint: disable=import-outside-toplevel

    (x_train, y_train), _ = train_test_split(*load_digits(), seed=0)
    data = make_dataset(x_train, y_train, batch_size, layout)
    return [batch for _, batch in zip(range(count), data.create_tuple_iterator())]


def gradient_loss_at_end(result, batches=4):
    """Fraction of gradient elements zero in the run's precision but nonzero in fp32, at its final weights
    and final loss scale, averaged over the first ``batches`` training batches."""
    # pylint: disable=import-outside-toplevel
    import numpy as np
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


def compare_plan(args):
    """``[(label, precision, loss_scale)]``: the four runs of ``compare``."""
    return [("fp32", "fp32", "none"), ("fp16 no scaling", args.precision, "none"),
            (f"fp16 fixed {args.fixed_scale:g}", args.precision, f"fixed:{args.fixed_scale:g}"),
            ("fp16 dynamic", args.precision, "dynamic")]


def compare_runs(args):
    """Run the four configurations of ``compare``; return ``[(label, result)]``."""
    runs = []
    for label, precision, loss_scale in compare_plan(args):
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


def comparison_verdict(runs, tolerance=0.5):
    """One sentence: dynamic scaling's test accuracy against fp32's, with the direction spelled out.

    Example:
        >>> runs = [("fp32", {"test_accuracy": 0.9666}), ("fp16 dynamic", {"test_accuracy": 0.961})]
        >>> comparison_verdict(runs)
        'fp16 dynamic reaches 96.10% test accuracy, 0.56 percentage points below fp32 (96.66%): more than 0.5 below'
    """
    fp32, dynamic = 100 * runs[0][1]["test_accuracy"], 100 * runs[-1][1]["test_accuracy"]
    gap = dynamic - fp32
    if abs(gap) < 0.005:
        relation = "the same as"
    else:
        relation = f"{abs(gap):.2f} percentage points {'above' if gap > 0 else 'below'}"
    verdict = f"more than {tolerance:g} below" if gap < -tolerance else f"not more than {tolerance:g} below"
    return f"fp16 dynamic reaches {dynamic:.2f}% test accuracy, {relation} fp32 ({fp32:.2f}%): {verdict}"


def command_compare(args):
    # pylint: disable=import-outside-toplevel
    from lossscale.plots import plot_comparison
    from lossscale.results import write_results_page

    output = prepare_output(args.output or os.path.join("runs", f"compare-{args.model}"), "compare")
    runs = compare_runs(args)
    table, verdict = format_comparison(runs), comparison_verdict(runs)
    print(table)
    print(verdict)
    with open(os.path.join(output, "compare.txt"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n" + verdict + "\n")
    _write_json(os.path.join(output, "compare.json"), {label: _public(result) for label, result in runs})
    title = f"{args.model}: fp32 vs fp16 ({args.precision}) loss scaling"
    _try_plot(plot_comparison, {label: _unweighted(result) for label, result in runs},
              os.path.join(output, "compare.png"), title)
    if args.results:
        print(f"results page: {write_results_page(args, runs, args.results)}")
    return EXIT_OK


def measure_gradients(args, network):
    """``(fp32 gradients, measured lost fraction at --scale, batches used)`` of ``network`` on the first
    ``--batches`` batches (fewer if the training split has fewer)."""
    # pylint: disable=import-outside-toplevel
    import numpy as np
    from mindspore import nn

    from lossscale.diagnostics import GradientProbe, lost_fraction, unscaled_gradients
    from lossscale.integration import build_train_network

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
    return reference, float(np.mean(lost)), len(lost)


def largest_safe_along_training(args):
    """Train fp32 for ``args.epochs`` and return ``(network, [(epoch, largest safe scale)])``, measured at the
    start and after every epoch on the first ``args.batches`` training batches (epoch 0: untrained)."""
    # pylint: disable=import-outside-toplevel
    import mindspore as ms
    from mindspore import nn

    from lossscale.diagnostics import GradientProbe, magnitude_report, unscaled_gradients
    from lossscale_models import create_model

    ms.set_seed(args.seed)
    network = create_model(args.model)
    batches = _first_training_batches(args.batch_size, network.input_layout, args.batches)

    def largest_safe(candidate):
        probe = GradientProbe(nn.WithLossCell(candidate, _weighted_loss(args.loss_weight)))
        grads = [g for batch in batches for g in unscaled_gradients(probe, batch, 1.0)]
        return magnitude_report(grads, 1.0)["largest_safe_scale"]

    trajectory = [(0, largest_safe(network))]
    if args.epochs:
        network = run_training(args.model, "fp32", "none", args.epochs, args.batch_size, args.lr, args.seed,
                               DEFAULTS["scale_window"], args.loss_weight, progress=not args.no_progress,
                               print_summary=False,
                               epoch_callback=lambda epoch, net: trajectory.append((epoch, largest_safe(net))))[
                                   "network"]
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
        largest scale without float16 overflow at the untrained weights: 2**19. Not a fixed scale to train with: gradients grow as the network trains. Use --loss-scale dynamic, or measure along training with --epochs N.
    """
    if len(trajectory) == 1:
        return (f"largest scale without float16 overflow at the untrained weights: {format_scale(trajectory[0][1])}. "
                f"Not a fixed scale to train with: gradients grow as the network trains. Use --loss-scale dynamic, "
                f"or measure along training with --epochs N.")
    smallest = min(scale for _, scale in trajectory)
    worst = min(trajectory, key=lambda item: item[1])[0]
    suggested = suggested_fixed_scale(trajectory)
    return (f"largest scale without float16 overflow along {trajectory[-1][0]} epochs of fp32 training: "
            f"{', '.join(f'{format_scale(s)} (epoch {e})' for e, s in trajectory)}; the smallest, "
            f"{format_scale(smallest)}, at epoch {worst}. Suggested fixed scale: {format_scale(suggested)} (half of it), "
            f"for this model, data, seed, learning rate and number of epochs; longer training or other settings "
            f"need --loss-scale dynamic or a new measurement.")


def command_inspect(args):
    # pylint: disable=import-outside-toplevel
    import numpy as np

    from lossscale.diagnostics import magnitude_report
    from lossscale.plots import plot_histogram

    output = prepare_output(args.output or os.path.join("runs", f"inspect-{args.model}"), "inspect")
    network, trajectory = largest_safe_along_training(args)
    reference, lost, batches = measure_gradients(args, network)
    report = magnitude_report(reference, args.scale)
    magnitudes = np.abs(np.concatenate([g.ravel() for g in reference]))
    log2 = np.log2(magnitudes[magnitudes > 0])
    weights = "untrained" if not args.epochs else f"after {args.epochs} epochs of fp32 training"
    print(f"{report['count']} nonzero fp32 weight-gradient elements ({args.model}, {weights}, "
          f"{batches} batches)")
    print(f"at loss scale {format_scale(args.scale)}: {100 * report['flushed']:.3f}% flush to zero in fp16, "
          f"{100 * report['subnormal']:.3f}% subnormal, {100 * report['overflow']:.3f}% overflow")
    print(f"measured with {args.precision} gradients at that scale: {100 * lost:.3f}% of the nonzero fp32 "
          f"gradient elements are zero")
    print(scale_advice(trajectory))
    _write_json(os.path.join(output, "inspect.json"), dict(
        report, scale=args.scale, model=args.model, epochs=args.epochs, batches=batches,
        measured_lost_fraction=lost,
        largest_safe_along_training=[[e, s] for e, s in trajectory],
        suggested_fixed_scale=suggested_fixed_scale(trajectory)))
    _try_plot(plot_histogram, log2, args.scale, os.path.join(output, "gradients.png"),
              f"{args.model}: fp32 weight gradients vs the float16 range ({weights})")
    return EXIT_OK


COMMANDS = {"train": command_train, "compare": command_compare, "inspect": command_inspect}


def _set_device(device):
    """Select ``device`` in MindSpore, or raise CliError if this MindSpore cannot use it."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel

    ms.set_context(mode=ms.GRAPH_MODE)
    if device is None:
        return
    available = getattr(getattr(ms, "hal", None), "is_available", None)
    if available is not None and not available(device):
        supported = [name for name in ("CPU", "GPU", "Ascend") if available(name)]
        raise CliError(f"--device {device} is not available: this MindSpore installation can use "
                       f"{', '.join(supported) or 'no device'}")
    try:
        if hasattr(ms, "set_device"):
            ms.set_device(device)
        else:  # pragma: no cover - MindSpore before set_device
            ms.set_context(device_target=device)
    except (RuntimeError, ValueError) as error:
        raise CliError(f"--device {device} is not available: {str(error).splitlines()[0]}") from None


def _quiet_mindspore():
    """MindSpore's own warnings off unless GLOG_v says otherwise: deprecations of kernels we do not call, such as
    the FusedSparseAdam that MindSpore 2.10's nn.Adam builds. MindSpore reads GLOG_v when it logs for the first
    time (importing it may), so this must run before MindSpore is imported; in a process that imported it
    already, it changes nothing."""
    os.environ.setdefault("GLOG_v", "3")


def _show_warning(message, category, filename, lineno, file=None, line=None):  # pylint: disable=unused-argument
    """Warnings during a command as one line each, without the source location, advising the command line's
    options."""
    print(f"lossscale: warning: {command_line_advice(str(message))}", file=sys.stderr)


def main(argv=None):
    """Entry point; returns the process exit code (see the module docstring)."""
    try:
        _quiet_mindspore()  # before anything imports MindSpore (the batch-size check does): it reads GLOG_v once
        prefer_fast_cpu_convolutions()  # before MindSpore's first CPU operation
        parser = build_parser()
        if argv is None:
            argv = sys.argv[1:]
        if argv[:1] == ["--version"]:
            print(_version())
            return EXIT_OK
        args = parser.parse_args(argv)
        args.argv = list(argv)
        _check_model(args.model)
        _check_batch_size(args.batch_size, getattr(args, "workers", 1))
        _set_device(args.device)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return COMMANDS[args.command](args)
    except CliError as error:
        print(f"lossscale: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingStalled as error:
        print(f"lossscale: training stopped: {error}", file=sys.stderr)
        return EXIT_STALLED
