"""The command line's options: the parser, the value types, the defaults, and the output folder.

Imports neither MindSpore nor NumPy, so that ``--help`` and ``--version`` answer at once.

Example:
    >>> build_parser().parse_args(["train", "--epochs", "2"]).epochs
    2
"""

import argparse
import os
import re
import sys
import tempfile

from lossscale.core._validation import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX

EXIT_OK, EXIT_STALLED, EXIT_USAGE = 0, 1, 2
PRECISIONS = {"fp32": "O0", "O0": "O0", "O2": "O2", "O3": "O3"}
FP16_PRECISIONS = ("O2", "O3")
MODEL_NAMES = ("mlp", "lenet5", "resnet", "transformer")  # lossscale_models.MODELS, without importing MindSpore
OVERFLOW_POLICIES = ("skip", "warn", "raise")
# A run that skips this share of its steps is reported as stalled by overflow.
STALLED_SHARE = 0.10
DEFAULTS = {
    "model": "lenet5",
    "precision": "O2",
    "loss_scale": "dynamic",
    "epochs": 6,
    "batch_size": 32,
    "lr": 1e-3,
    "seed": 0,
    "scale_window": 100,
    "loss_weight": 1.0,
}
# The documented comparison (docs/results.md): LeNet5 in O3 with the loss weighted by 1e-4, as a loss
# normalised by a large token count would be, so that most gradients underflow in float16.
COMPARE_DEFAULTS = {"precision": "O3", "loss_weight": 1e-4, "epochs": 3, "fixed_scale": 1024.0}
OUTPUT_FILES = {
    "train": ("metrics.csv", "summary.json", "training.png"),
    "compare": ("compare.txt", "compare.json", "compare.png"),
    "inspect": ("inspect.json", "gradients.png"),
}


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
        if (
            "default" in text
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
        ):
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
_positive_float = _number(
    float, "a number in [1.2e-38, 3.4e38] (float32's normal range)", lambda v: FLOAT32_TINY <= v <= FLOAT32_MAX
)
# A loss scale is a float32 Parameter: a larger number would be inf.
_scale_value = _number(float, "a number in [1, 3.4e38] (float32's range)", lambda v: 1 <= v <= FLOAT32_MAX)
_probe_scale = _number(float, "a number in (0, 3.4e38] (float32's range)", lambda v: 0 < v <= FLOAT32_MAX)


def parse_loss_scale(spec, scale_window=DEFAULTS["scale_window"]):
    """Turn ``none`` / ``fixed:S`` / ``dynamic`` / ``adaptive[:MIN:MAX]`` / ``automatic[:PERIOD]`` / ``preset:NAME``
    into ``(label, manager_factory)``.

    ``none`` still uses the lossscale cell (scale 1, every step applied) so that overflows are
    reported; ``dynamic`` is MindSpore's ``DynamicLossScaleManager`` defaults with
    ``scale_window`` clean steps per growth; ``adaptive`` is MindFormers' adaptive window
    (:class:`lossscale.AdaptiveLossScaleManager`) starting at ``scale_window``, its levels between MIN and MAX
    (default 20 and 1000); ``automatic`` is Graphcore's automatic loss scaling
    (:class:`lossscale.core.automatic.AutomaticLossScaleRule`), updating every PERIOD steps (default 1, PopART's);
    ``preset:NAME`` is a rule of
    :mod:`lossscale.core.presets` (e.g. ``preset:pytorch``), also with ``scale_window`` (the starting window of
    ``preset:mindformers``, MindFormers' adaptive window).

    Example:
        >>> label, factory = parse_loss_scale("fixed:1024")
        >>> label, factory().get_loss_scale()
        ('fixed:1024', 1024.0)
    """
    from lossscale.core.presets import PRESET_NAMES

    if spec == "none":
        return "none", _manager("fixed", 1.0, drop=False)
    if spec == "dynamic":
        return "dynamic", _manager("dynamic", scale_window)
    if spec.startswith("fixed:"):
        text = spec[len("fixed:") :]
        try:
            value = _scale_value(text)
        except argparse.ArgumentTypeError:
            raise CliError(
                f"--loss-scale fixed:S needs a number S in [1, 3.4e38] (float32's range), but got {text!r}"
            ) from None
        return f"fixed:{value:g}", _manager("fixed", value)
    if spec == "adaptive" or spec.startswith("adaptive:"):
        return spec, _manager("adaptive", (scale_window, *_window_bounds(spec)))
    if spec == "automatic" or spec.startswith("automatic:"):
        return spec, _manager("automatic", _update_period(spec))
    if spec.startswith("preset:"):
        name = spec[len("preset:") :]
        if name not in PRESET_NAMES:
            raise CliError(f"unknown preset {name!r}; choose one of: {', '.join(PRESET_NAMES)}")
        return spec, _manager("preset", (name, scale_window))
    raise CliError(
        f"--loss-scale must be 'none', 'fixed:S', 'dynamic', 'adaptive[:MIN:MAX]', 'automatic[:PERIOD]' or "
        f"'preset:NAME', but got {spec!r}"
    )


def _update_period(spec):
    """The update period of ``automatic`` (1) or ``automatic:PERIOD``."""
    period = spec.split(":", 1)[1] if ":" in spec else "1"
    if not (period.isdigit() and 0 < int(period) <= 2**31 - 1):
        raise CliError(f"--loss-scale automatic:PERIOD needs a whole number of steps >= 1, but got {spec!r}")
    return int(period)


def _window_bounds(spec):
    """``(min_scale_window, max_scale_window)`` of ``adaptive`` (MindFormers' 20 and 1000) or ``adaptive:MIN:MAX``."""
    if spec == "adaptive":
        from lossscale.core.adaptive import MAX_SCALE_WINDOW, MIN_SCALE_WINDOW

        return MIN_SCALE_WINDOW, MAX_SCALE_WINDOW
    parts = spec.split(":")[1:]
    if len(parts) != 2 or not all(part.isdigit() and 0 < int(part) <= 2**31 - 1 for part in parts):
        raise CliError(f"--loss-scale adaptive:MIN:MAX needs two whole numbers of steps >= 1, but got {spec!r}")
    low, high = (int(part) for part in parts)
    if low >= high:
        raise CliError(f"--loss-scale adaptive:MIN:MAX needs MIN < MAX (the window levels), but got {spec!r}")
    return low, high


def _manager(kind, value, drop=True):
    """A factory of the loss-scale manager for a parsed ``--loss-scale``."""

    def build():
        from lossscale.core.presets import get_preset
        from lossscale.training.managers import AdaptiveLossScaleManager, DynamicLossScaleManager, FixedLossScaleManager

        if kind == "fixed":
            return FixedLossScaleManager(value, drop_overflow_update=drop)
        if kind == "dynamic":
            return DynamicLossScaleManager(scale_window=value)
        if kind == "adaptive":
            window, low, high = value
            return AdaptiveLossScaleManager(scale_window=window, min_scale_window=low, max_scale_window=high)
        if kind == "automatic":
            return DynamicLossScaleManager.from_policy(get_preset("graphcore", update_period=value))
        name, window = value
        return DynamicLossScaleManager.from_policy(get_preset(name, window=window))

    return build


def default_output(command, args):
    """``runs/<command>-<configuration>``, the folder a run writes to without ``--output``: the model, the precision
    and, for ``train``, the loss-scale mode and the number of workers, so that runs of other configurations keep
    their results.

    Example:
        >>> from argparse import Namespace
        >>> default_output("train", Namespace(model="lenet5", precision="O2", loss_scale="fixed:1024", workers=2))
        'runs/train-lenet5-O2-fixed-1024-2workers'
    """
    parts = [command, args.model, args.precision]
    if command == "train":
        parts.append(re.sub(r"[^A-Za-z0-9.]+", "-", args.loss_scale).strip("-"))
        if args.workers > 1:
            parts.append(f"{args.workers}workers")
    return os.path.join("runs", "-".join(parts))


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
    from lossscale_models import load_digits, train_test_split

    (_, y_train), _ = train_test_split(*load_digits(), seed=0)
    _refuse_empty_epoch(batch_size, len(y_train), workers, steps_per_epoch=None)
    return batch_size


def _refuse_empty_epoch(batch_size, images, workers, steps_per_epoch):
    """CliError when a worker's share of the ``images`` training images (``ceil(images / workers)``, as MindSpore
    shards them) holds no full batch; ``steps_per_epoch``, when known, is the dataset's own count."""
    share = -(-images // workers)
    empty = batch_size > share if steps_per_epoch is None else steps_per_epoch == 0
    if empty:
        where = (
            f"the {images} training images"
            if workers == 1
            else (f"the {share} training images of each of the {workers} workers ({images} in all)")
        )
        raise CliError(f"--batch-size {batch_size} is larger than {where}")


# ---- the parser -------------------------------------------------------------------------------


def _version():
    from importlib import metadata

    from lossscale import __version__

    try:
        mindspore = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        mindspore = "not installed"
    return f"lossscale {__version__} (MindSpore {mindspore})"


def _add_model_and_data(parser, defaults, batch_help="images per step"):
    parser.add_argument("--model", default=DEFAULTS["model"], help=f"network: {', '.join(MODEL_NAMES)}")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULTS["batch_size"], help=batch_help)
    parser.add_argument("--seed", type=_seed, default=DEFAULTS["seed"], help="initialisation and data order")
    parser.add_argument(
        "--loss-weight",
        type=_positive_float,
        default=defaults["loss_weight"],
        help="multiply the loss by this constant, like a loss normalised by a large token count; "
        "Adam is nearly invariant to it in fp32, float16 gradients are not",
    )
    parser.add_argument(
        "--device",
        choices=("CPU", "GPU", "Ascend"),
        default=None,
        help="MindSpore device target (default: MindSpore's own)",
    )


def _add_training(parser, epochs, epochs_help="passes over the 1438 training images", lr_help="Adam learning rate"):
    parser.add_argument(
        "--epochs", type=_positive_int if epochs else _non_negative_int, default=epochs, help=epochs_help
    )
    parser.add_argument("--lr", type=_positive_float, default=DEFAULTS["lr"], help=lr_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_overflow_options(train):
    """``--overflow-policy`` and ``--max-consecutive-overflows`` of ``train``."""
    train.add_argument(
        "--overflow-policy",
        choices=OVERFLOW_POLICIES,
        default="warn",
        help="when overflows persist (--max-consecutive-overflows in a row, or at the minimum "
        "scale): keep skipping, warn once, or stop with exit code 1",
    )
    train.add_argument(
        "--max-consecutive-overflows",
        type=_positive_int,
        default=50,
        help="consecutive skipped steps that count as persistent overflow",
    )


def _add_train_command(commands):
    """``lossscale train``: one configuration."""
    train = commands.add_parser(
        "train",
        help="train one configuration",
        formatter_class=_Formatter,
        description="Train one configuration and report the loss scaling.",
    )
    _add_model_and_data(train, DEFAULTS, "images per step (per process with --workers)")
    train.add_argument(
        "--precision",
        default=DEFAULTS["precision"],
        choices=sorted(PRECISIONS),
        help="fp32 (= O0), O2 (fp16 compute, BatchNorm fp32) or O3 (all fp16)",
    )
    train.add_argument(
        "--loss-scale",
        default=DEFAULTS["loss_scale"],
        help="none, fixed:S, dynamic, adaptive[:MIN:MAX] (MindFormers' adaptive window, its levels from MIN to MAX "
        "steps, default 20:1000), automatic[:PERIOD] (Graphcore's automatic loss scaling from the gradients' range, "
        "updated every PERIOD steps, default 1) or preset:NAME (pytorch, paddle, keras, jmp, megatron, graphcore, ...)",
    )
    train.add_argument(
        "--scale-window",
        type=_positive_int,
        default=DEFAULTS["scale_window"],
        help="clean steps before a dynamic scale grows",
    )
    _add_training(train, DEFAULTS["epochs"])
    _add_overflow_options(train)
    train.add_argument(
        "--workers", type=_positive_int, default=1, help="data-parallel processes on this machine, launched with msrun"
    )
    train.add_argument(
        "--output",
        default=None,
        help="output folder (default: runs/train-MODEL-PRECISION-LOSS_SCALE, and -Nworkers with --workers N)",
    )


def _add_compare_command(commands):
    """``lossscale compare``: fp32 and fp16 without, with fixed, with dynamic and with adaptive-window scaling."""
    compare = commands.add_parser(
        "compare",
        help="fp32 vs fp16 without, with fixed, with dynamic and with adaptive-window scaling",
        formatter_class=_Formatter,
        description="Train fp32, fp16 without scaling, fp16 with a fixed scale, fp16 with dynamic scaling and "
        "fp16 with MindFormers' adaptive window on the same seed and data.",
    )
    _add_model_and_data(compare, COMPARE_DEFAULTS)
    compare.add_argument(
        "--precision",
        default=COMPARE_DEFAULTS["precision"],
        choices=FP16_PRECISIONS,
        help="the fp16 level of the three fp16 runs (the first run is always fp32)",
    )
    compare.add_argument(
        "--fixed-scale",
        type=_scale_value,
        default=COMPARE_DEFAULTS["fixed_scale"],
        help="the scale of the fixed-scale run",
    )
    compare.add_argument(
        "--scale-window",
        type=_positive_int,
        default=DEFAULTS["scale_window"],
        help="clean steps before the dynamic scale grows",
    )
    _add_training(compare, COMPARE_DEFAULTS["epochs"])
    compare.add_argument("--output", default=None, help="output folder (default: runs/compare-MODEL-PRECISION)")
    compare.add_argument(
        "--results",
        default=None,
        metavar="PAGE.md",
        help="also write the results page (markdown, with its figures in images/ next to it), "
        "as docs/results.md is made",
    )


def _add_inspect_command(commands):
    """``lossscale inspect``: gradient magnitudes against the float16 range."""
    inspect = commands.add_parser(
        "inspect",
        help="gradient magnitudes against the float16 range",
        formatter_class=_Formatter,
        description="Where the fp32 weight gradients fall in the float16 range at a loss "
        "scale, and the largest scale without overflow.",
    )
    _add_model_and_data(inspect, DEFAULTS)
    inspect.add_argument(
        "--precision",
        default="O3",
        choices=FP16_PRECISIONS,
        help="the fp16 level whose gradients are measured at --scale",
    )
    inspect.add_argument("--scale", type=_probe_scale, default=1.0, help="loss scale to evaluate")
    inspect.add_argument("--batches", type=_positive_int, default=4, help="training batches to sample")
    _add_training(
        inspect,
        0,
        "train in fp32 for this many epochs first, measuring the largest scale without "
        "overflow at the start and after every epoch (0: the untrained network only)",
        "Adam learning rate of the training with --epochs",
    )
    inspect.add_argument("--output", default=None, help="output folder (default: runs/inspect-MODEL-PRECISION)")


def build_parser():
    """The CLI's parser: ``train``, ``compare`` and ``inspect``."""
    parser = _Parser(
        prog="lossscale",
        description="Loss-scaled float16 training with MindSpore on the bundled handwritten digits.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="store_true", help="print the versions of lossscale and MindSpore")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train_command(commands)
    _add_compare_command(commands)
    _add_inspect_command(commands)
    return parser
