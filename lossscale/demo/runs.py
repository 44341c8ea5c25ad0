"""One training run of the demo (``train``, and each run of ``compare``): the reference model on the digits
data, with a progress bar, the monitor's records and timings; and what the command line says about it.
"""

import json
import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Accuracy, Callback
from tqdm import tqdm

from lossscale.core._text import format_scale, plural
from lossscale.demo import msrun, plots
from lossscale.demo.options import (
    EXIT_OK,
    PRECISIONS,
    CliError,
    TrainingStalled,
    _check_model,
    _refuse_empty_epoch,
    default_output,
    parse_loss_scale,
    prepare_output,
)
from lossscale.training.bookkeeping import PERSISTENT_OVERFLOW_ADVICE, PersistentOverflowError
from lossscale.training.integration import Model
from lossscale.training.monitor import LossScaleMonitor
from lossscale_models import create_model, load_digits, make_dataset, train_test_split

# A run that skips this share of its steps is reported as stalled by overflow.
STALLED_SHARE = 0.10


def _progress_callback(monitor, steps_per_epoch, epochs, enabled, loss_weight):
    class ProgressBar(Callback):
        """One tqdm bar per epoch showing the (unweighted) loss, the current loss scale and skipped steps."""

        def __init__(self):
            super().__init__()
            self.bar = None

        def on_train_epoch_begin(self, run_context):
            epoch = run_context.original_args().cur_epoch_num
            self.bar = tqdm(
                total=steps_per_epoch,
                desc=f"epoch {epoch}/{epochs}",
                unit="step",
                disable=not enabled,
                file=sys.stderr,
                dynamic_ncols=True,
            )

        def on_train_step_end(self, run_context):
            last = monitor.records[-1]
            self.bar.set_postfix(
                loss=f"{last['loss'] / loss_weight:.4f}",
                scale=format_scale(last["next_loss_scale"]),
                skipped=last["skipped_steps"],
                refresh=False,
            )
            self.bar.update(1)

        def on_train_epoch_end(self, run_context):
            self.bar.close()

    return ProgressBar()


def _step_timer():
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


def _epoch_probe(callback):
    """A MindSpore callback calling ``callback(epoch)`` at the end of every epoch."""

    class EpochProbe(Callback):
        def on_train_epoch_end(self, run_context):
            callback(run_context.original_args().cur_epoch_num)

    return EpochProbe()


def _weighted_loss(loss_weight):
    """Softmax cross-entropy (mean over the batch) multiplied by ``loss_weight``."""

    class WeightedCrossEntropy(nn.Cell):
        def __init__(self):
            super().__init__()
            self.base = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            self.weight = loss_weight

        def construct(self, logits, labels):
            return self.base(logits, labels) * self.weight

    return (
        WeightedCrossEntropy()
        if loss_weight != 1.0
        else nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    )


def _copy_of(model_name, network):
    """A freshly built ``model_name`` holding ``network``'s current weights."""
    copy = create_model(model_name)
    ms.load_param_into_net(copy, {p.name: ms.Parameter(p.data.copy(), name=p.name) for p in network.get_parameters()})
    return copy


def _first_training_batches(batch_size, layout, count):
    """The first ``count`` ``(x, y)`` batches of the (unshuffled) digits training split."""
    (x_train, y_train), _ = train_test_split(*load_digits(), seed=0)
    data = make_dataset(x_train, y_train, batch_size, layout)
    return [batch for _, batch in zip(range(count), data.create_tuple_iterator())]


_CONFIG_KEYS = ("model", "precision", "loss_scale", "epochs", "batch_size", "lr", "seed", "scale_window", "loss_weight")


def _model(network, precision, manager, lr, loss_weight, policy):
    """The ``lossscale.Model`` of one run: Adam, the weighted loss, accuracy, the precision's amp level."""
    return Model(
        network,
        _weighted_loss(loss_weight),
        nn.Adam(network.trainable_params(), learning_rate=lr),
        metrics={"accuracy": Accuracy()},
        amp_level=PRECISIONS[precision],
        loss_scale_manager=manager,
        **policy,
    )


def _datasets(network, batch_size, seed, shard):
    """``(train, test)`` datasets of the digits for ``network``; ``shard=(rank, size)``: this rank's share of the
    training images. Refuses a batch size that leaves an epoch empty."""
    images, labels = load_digits()
    (x_train, y_train), (x_test, y_test) = train_test_split(images, labels, seed=0)
    train_data = make_dataset(x_train, y_train, batch_size, network.input_layout, shuffle=True, seed=seed, shard=shard)
    _refuse_empty_epoch(batch_size, len(y_train), 1 if shard is None else shard[1], train_data.get_dataset_size())
    return train_data, make_dataset(x_test, y_test, 64, network.input_layout, drop_remainder=False)


def _train(trained, epochs, train_data, callbacks):
    """``trained.train(...)``; persistent overflow becomes :class:`TrainingStalled` with the CLI's advice."""
    try:
        trained.train(epochs, train_data, callbacks=callbacks)
    except PersistentOverflowError as error:
        raise TrainingStalled(command_line_advice(str(error))) from None


def run_training(
    model="lenet5",
    precision="O2",
    loss_scale="dynamic",
    epochs=6,
    batch_size=32,
    lr=1e-3,
    seed=0,
    scale_window=100,
    loss_weight=1.0,
    progress=True,
    print_summary=True,
    shard=None,
    overflow_policy="skip",
    max_consecutive_overflows=None,
    epoch_callback=None,
    step_callbacks=(),
):
    """Train one configuration on the digits data and return a result dict (also the CLI's engine).

    Keys: ``config``, ``records`` (per-step monitor rows), ``summary`` (monitor totals),
    ``test_accuracy``, ``final_loss``, ``seconds_per_step``, ``first_step_seconds``,
    ``model`` (the trained ``lossscale.Model``), ``network`` (the trained backbone).
    ``shard=(rank, size)`` trains on this rank's share of every epoch (data parallel);
    ``epoch_callback(epoch, network)`` runs after every epoch; ``step_callbacks`` are more MindSpore callbacks.
    """
    _check_model(model)
    label, manager_factory = parse_loss_scale(loss_scale, scale_window)
    ms.set_seed(seed)
    network = create_model(model)
    train_data, test_data = _datasets(network, batch_size, seed, shard)
    steps_per_epoch = train_data.get_dataset_size()
    policy = {"overflow_policy": overflow_policy, "max_consecutive_overflows": max_consecutive_overflows}
    policy = {} if overflow_policy == "skip" else policy
    trained = _model(network, precision, manager_factory(), lr, loss_weight, policy)
    monitor, timer = LossScaleMonitor(print_summary=False), _step_timer()
    callbacks = [monitor, _progress_callback(monitor, steps_per_epoch, epochs, progress, loss_weight), timer]
    callbacks += list(step_callbacks)
    if epoch_callback is not None:
        callbacks.append(_epoch_probe(lambda epoch: epoch_callback(epoch, network)))
    _train(trained, epochs, train_data, callbacks)
    accuracy = float(trained.eval(test_data)["accuracy"])
    summary = monitor.summary()
    if print_summary:
        print(monitor.format_summary())
    config = dict(zip(_CONFIG_KEYS, (model, precision, label, epochs, batch_size, lr, seed, scale_window, loss_weight)))
    timing = {"seconds_per_step": timer.median_step_seconds(), "first_step_seconds": timer.first_step_seconds()}
    outcome = {"summary": summary, "test_accuracy": accuracy, "final_loss": summary["final_loss"], **timing}
    return {"config": config, "records": monitor.records, **outcome, "model": trained, "network": network}


# What to try when overflow stalls training, in the command line's own options.
CLI_OVERFLOW_ADVICE = (
    "Try: lossscale inspect (where the gradients fall in the float16 range), a lower --lr, "
    "--loss-scale dynamic or a smaller fixed:S, or --precision fp32 to compare."
)


def command_line_advice(message):
    """A library message about persistent overflow with its advice and its argument names (the library's)
    replaced by the command line's (:data:`CLI_OVERFLOW_ADVICE`, ``--max-consecutive-overflows``)."""
    return message.replace(PERSISTENT_OVERFLOW_ADVICE, CLI_OVERFLOW_ADVICE).replace(
        "(max_consecutive_overflows=", "(--max-consecutive-overflows "
    )


def nothing_trained(result):
    """The one-line error for a run in which no step was applied (every step overflowed), or None.

    Example:
        >>> print(nothing_trained({"records": [{"overflow": True}]}))
        nothing was trained: the 1 step overflowed and was skipped. Try: lossscale inspect (where the gradients ...
    """
    flags = [record["overflow"] for record in result["records"]]
    if not flags or not all(flags):
        return None
    steps = (
        "the 1 step overflowed and was skipped"
        if len(flags) == 1
        else (f"all {len(flags)} steps overflowed and were skipped")
    )
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
        WARNING: overflow stalled training: 9 of 12 steps (75%) were skipped, so the weights were updated on 3 ...
    """
    flags = [record["overflow"] for record in result["records"]]
    skipped = sum(flags)
    if False not in flags:
        return None  # nothing applied, or nothing run: nothing_trained() says so
    later = flags[flags.index(False) :]
    if sum(later) < max(5, STALLED_SHARE * len(later)):
        return None
    label = result["config"]["loss_scale"]
    if label.startswith("fixed:"):
        advice = (
            f"The scale {label} is too large for this model's gradients: use --loss-scale dynamic, a smaller "
            f"fixed scale, or lossscale inspect --epochs N to measure one."
        )
    else:
        advice = "Look for inf/nan in the data or the model (a lower --lr often helps), or train in fp32 to compare."
    return (
        f"WARNING: overflow stalled training: {skipped} of {plural(len(flags), 'step')} "
        f"({100 * skipped / len(flags):.0f}%) were skipped, so the weights were updated on "
        f"{plural(len(flags) - skipped, 'step')} only. {advice}"
    )


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
    try:
        path = function(*args)
    except plots.PlotUnavailable as reason:
        print(f"plot: {reason}")
        return None
    print(f"plot: {path}")
    return path


# ---- the train command ---------------------------------------------------------------------------


def launch_workers(args, output):
    """Re-run this command under msrun with ``args.workers`` processes; print rank 0's report."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__main__.py")
    argv = [a for a in (args.argv or []) if a]
    log_dir = os.path.join(output, "msrun_logs")
    command = msrun.msrun_command(script, argv, workers=args.workers, log_dir=log_dir)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(f"launching {args.workers} data-parallel workers: {' '.join(command)}", flush=True)
    done = msrun.run_msrun(command, timeout=None, env=msrun.launch_environment(package_root))
    rank0 = os.path.join(log_dir, "worker_0.log")
    if os.path.exists(rank0):
        with open(rank0, encoding="utf-8", errors="replace") as handle:
            print("".join(line for line in handle if not line.startswith(("[WARNING]", "[INFO]"))), end="")
    if done.returncode != 0:
        raise CliError(f"msrun failed with exit code {done.returncode}; worker logs are in {log_dir}")
    return EXIT_OK


def command_train(args):
    parse_loss_scale(args.loss_scale, args.scale_window)
    output = prepare_output(
        args.output or default_output("train", args),
        "train",
        announce=not msrun.launched_by_us(),
    )
    shard, rank = None, 0
    if args.workers > 1:
        if not msrun.inside_msrun():
            if msrun.launched_by_us():
                raise CliError("started by msrun but MS_ROLE is not set; refusing to launch msrun again")
            return launch_workers(args, output)
        rank, size = msrun.init_data_parallel()
        shard = (rank, size)
        print(f"rank {rank} of {size}: per-rank batch {args.batch_size}, global batch {args.batch_size * size}")
    result = run_training(
        args.model,
        args.precision,
        args.loss_scale,
        args.epochs,
        args.batch_size,
        args.lr,
        args.seed,
        args.scale_window,
        args.loss_weight,
        progress=not args.no_progress and rank == 0,
        shard=shard,
        overflow_policy=args.overflow_policy,
        max_consecutive_overflows=args.max_consecutive_overflows,
    )
    if rank != 0:
        return EXIT_OK
    return _report_training(result, output)


def _report_training(result, output):
    """Rank 0's report of a training run: metrics.csv, summary.json, the plot and the printed summary; stalled
    runs warn, and a run that applied no step raises :class:`TrainingStalled`."""
    monitor = LossScaleMonitor(print_summary=False)
    monitor.records = result["records"]
    monitor.write_csv(os.path.join(output, "metrics.csv"))
    warning, nothing = stall_warning(result), nothing_trained(result)
    stalled = warning is not None or nothing is not None
    _write_json(os.path.join(output, "summary.json"), dict(_public(result), stalled_by_overflow=stalled))
    config = result["config"]
    final_loss = result["final_loss"] / config["loss_weight"] if result["final_loss"] is not None else float("nan")
    print(
        f"test accuracy: {100 * result['test_accuracy']:.2f}%   final loss: {final_loss:.4f}   "
        f"time/step: {1e3 * result['seconds_per_step']:.2f} ms"
    )
    print(f"metrics: {os.path.join(output, 'metrics.csv')}  summary: {os.path.join(output, 'summary.json')}")
    title = f"{config['model']} {config['precision']} loss scale {config['loss_scale']}"
    _try_plot(plots.plot_training, _unweighted(result), os.path.join(output, "training.png"), title)
    if warning:
        print(warning, file=sys.stderr)
    if nothing:
        raise TrainingStalled(nothing)
    return EXIT_OK
