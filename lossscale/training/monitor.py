"""``LossScaleMonitor``: a MindSpore callback that records loss scaling optimizer step by optimizer step.

It reads the train network's outputs, which ``Model`` hands to callbacks anyway: ``(loss,
overflow, loss_scale)`` from lossscale's or MindSpore's cell, ``(loss, overflow)`` or just the
loss from cells in the style of mindcv and mindone, whose scale it then reads from the cell's
``scale_sense`` Parameter. Under gradient accumulation it records one row per optimizer step
(the window), not per micro-batch. Converting the scalars to Python numbers syncs the host once
per call.
"""

import csv
import math
import numbers
import os
import sys

import numpy as np
from mindspore import Tensor
from mindspore.train import Callback

from lossscale.core._parameters import host_array, host_flags
from lossscale.core._text import format_scale, plural
from lossscale.core._validation import check_bool, check_int_in_range
from lossscale.training.accumulation import GradientAccumulation

FIELDS = ("step", "epoch", "loss", "loss_scale", "overflow", "skipped_steps", "next_loss_scale")


def _array(name, value, allow_bool=False):
    """``value`` (a Tensor, NumPy value or number) as a non-empty numeric NumPy array (bools only if
    ``allow_bool``: a flag); TypeError naming ``name``."""
    array = host_array(value)
    if array.size == 0 or not (np.issubdtype(array.dtype, np.number) or (allow_bool and array.dtype == np.bool_)):
        raise TypeError(
            f"'{name}' must be a number or a Tensor of numbers, but got {value!r} of type {type(value).__name__}."
        )
    return array


def _scalar(value, name="value", allow_bool=False):
    """A Python float from a one-value Tensor, NumPy value or number (one host sync for a Tensor)."""
    array = _array(name, value, allow_bool)
    if array.size != 1:
        raise ValueError(f"'{name}' must hold one value, but got shape {array.shape}.")
    return float(array.reshape(-1)[0])


def _loss(value):
    """The loss as a Python float: the mean of its values, as MindSpore's ``LossMonitor`` reads a loss that is not
    a scalar (a per-sample loss); nan and inf stay."""
    return float(np.mean(_array("loss", value), dtype=np.float64))


def _overflow(value):
    """An overflow flag: a bool, a NumPy bool or a one-value bool Tensor (a truthy string or None is refused)."""
    flags = host_flags(value)
    if flags is None or flags.size != 1:
        raise TypeError(
            f"'overflow' must be a bool (or a one-value bool Tensor), but got {value!r} of type {type(value).__name__}."
        )
    return bool(flags.reshape(-1)[0])


def _scale(name, value):
    """A loss scale as a Python float >= 0: what a train cell can hold, 0 (a rule without a floor) and inf
    (MindSpore's own cell grows to it) included, since the callback records what it sees; nan or < 0 refused."""
    scale = _scalar(value, name)
    if not scale >= 0.0:
        raise ValueError(f"'{name}' must be a loss scale, a number >= 0 (inf included), but got {scale!r}.")
    return scale


def cell_loss_scale(train_network):
    """The scale a train cell holds now (its ``scale_sense`` Parameter or Tensor, or the ``sens`` of MindSpore's
    ``nn.TrainOneStepCell``), or None (one sync).

    Example:
        >>> cell_loss_scale(object()) is None
        True
    """
    scale = getattr(train_network, "scale_sense", None)
    if scale is None:
        scale = getattr(train_network, "sens", None)
    if isinstance(scale, Tensor):
        return _scalar(scale, "scale_sense")
    if isinstance(scale, numbers.Real):
        return float(scale)
    return None


def _accumulation_window(train_network):
    """``(micro-step Parameter, steps)`` of a lossscale train cell that accumulates, else None."""
    window = getattr(train_network, "accumulation", None)
    if not isinstance(window, GradientAccumulation):
        return None
    return window.micro_step, window.steps


def _check_csv_path(csv_path):
    if csv_path is not None and (isinstance(csv_path, bool) or not isinstance(csv_path, (str, os.PathLike))):
        raise TypeError(
            f"'csv_path' must be a file path (str or os.PathLike) or None, but got {csv_path!r} of type "
            f"{type(csv_path).__name__}."
        )
    if csv_path is not None and not os.fspath(csv_path):
        raise ValueError("'csv_path' must be a file path or None, but got '' (no CSV would be written).")
    return csv_path


def _check_stream(stream):
    if stream is not None and not callable(getattr(stream, "write", None)):
        raise TypeError(
            f"'stream' must have a write() method (a text file) or be None, but got {type(stream).__name__}."
        )
    return stream


def _open_csv(path, mode):
    """``path`` opened as a CSV file in ``mode``, its missing folders created first (as MindSpore's
    ``ModelCheckpoint`` does for its directory)."""
    folder = os.path.dirname(os.fspath(_check_csv_path(path)))
    if folder:
        os.makedirs(folder, exist_ok=True)
    return open(path, mode, newline="", encoding="utf-8")


class LossScaleMonitor(Callback):
    """Record, per optimizer step, the loss, the loss scale used, the overflow flag and the skip count.

    Works with any train network whose outputs are ``(loss, overflow, loss_scale)``
    (:class:`lossscale.TrainOneStepWithLossScaleCell`, MindSpore's own cell), ``(loss, overflow)``
    or the loss alone; a missing scale is read from the cell's ``scale_sense``, or the ``sens`` of
    MindSpore's ``nn.TrainOneStepCell`` (1.0 if it has neither), a missing overflow flag counts as no
    overflow.

    Args:
        csv_path (str or os.PathLike, optional): write the records there at the end of training, also
            when ``Model.train`` stops with an exception (e.g. :class:`lossscale.PersistentOverflowError`).
            It is also opened when training begins (to append, so nothing is written or truncated): a path
            that cannot be written fails before the first step, as Keras' ``CSVLogger`` opens its file then.
        print_summary (bool): print a one-paragraph summary at the end (also then). Default True.
        stream: a text file for the summary (default ``sys.stdout``).

    Attributes:
        records (list[dict]): one dict per optimizer step with keys :data:`FIELDS`: ``loss_scale``
            is the scale the step used, ``next_loss_scale`` the one after its update. Under
            accumulation a row is one window: the mean of its micro-batch losses and the window's
            decision.
        device_counters (dict or None): at the end of training, the train cell's in-graph
            counters (:meth:`lossscale.TrainOneStepWithLossScaleCell.overflow_counters`).
        open_window (tuple or None): at the end of training under accumulation, ``(k, N)`` when it
            ended inside a window: k of N micro-batches accumulated and not applied yet (the cell's
            next call continues the window; a checkpoint keeps them). The summary says so.

    Host syncs: one per call (the outputs read together, plus the micro step under accumulation).
    In dataset sink mode (GPU, Ascend) MindSpore calls it once per sink: a row is then the last of
    ``sink_size`` steps, and only :attr:`device_counters` count every step.

    Example:
        >>> monitor = LossScaleMonitor(print_summary=False)
        >>> monitor.record(epoch=1, loss=0.5, loss_scale=1024.0, overflow=True, next_loss_scale=512.0)
        >>> monitor.summary()["skipped_steps"], monitor.summary()["max_loss_scale"]
        (1, 1024.0)
    """

    def __init__(self, csv_path=None, print_summary=True, stream=None):
        super().__init__()
        self.csv_path = _check_csv_path(csv_path)
        self.print_summary = check_bool("print_summary", print_summary)
        self.stream = _check_stream(stream)
        self.records = []
        self.device_counters = None
        self.open_window = None
        self._scale_before = None
        self._window_losses = []
        self._train_network = None  # between on_train_begin and the end of training

    # ---- recording -------------------------------------------------------------------------
    def record(self, epoch, loss, loss_scale, overflow, next_loss_scale=None):
        """Append one optimizer step (also usable from a custom training loop).

        ``epoch`` an int >= 0; ``loss`` a number or Tensor (the mean of its values is recorded, as
        MindSpore's ``LossMonitor`` does); ``loss_scale`` and ``next_loss_scale`` one value >= 0 (inf included:
        MindSpore's own cell grows to it);
        ``overflow`` a bool or a one-value bool Tensor. Anything else is refused (``TypeError``/``ValueError``
        naming the argument) and nothing is recorded.
        """
        epoch = check_int_in_range("epoch", epoch, low=0)
        loss, overflow = _loss(loss), _overflow(overflow)
        scale = _scale("loss_scale", loss_scale)
        after = scale if next_loss_scale is None else _scale("next_loss_scale", next_loss_scale)
        skipped = (self.records[-1]["skipped_steps"] if self.records else 0) + int(overflow)
        self.records.append(
            {
                "step": len(self.records) + 1,
                "epoch": epoch,
                "loss": loss,
                "loss_scale": scale,
                "overflow": overflow,
                "skipped_steps": skipped,
                "next_loss_scale": after,
            }
        )

    def on_train_begin(self, run_context):
        if self.csv_path:  # an unwritable path fails here, not after the whole training
            _open_csv(self.csv_path, "a").close()
        self._train_network = getattr(run_context.original_args(), "train_network", None)
        self._scale_before = cell_loss_scale(self._train_network)
        self._window_losses = []

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        train_network = getattr(params, "train_network", None)
        loss, overflow, after = self._read_outputs(params.net_outputs, train_network)
        window = _accumulation_window(train_network)
        if window is not None:
            self._window_losses.append(_loss(loss))
            if int(window[0].asnumpy()) != 0:  # inside a window: its optimizer step comes later
                return
            loss, self._window_losses = float(np.mean(self._window_losses)), []
        before = after if self._scale_before is None else self._scale_before
        self.record(params.cur_epoch_num, loss, before, overflow, after)
        self._scale_before = after

    @staticmethod
    def _read_outputs(outputs, train_network):
        """``(loss, overflow, scale after the step)`` from the outputs, completed from the cell."""
        if isinstance(outputs, (tuple, list)):
            loss = outputs[0]
            overflow = bool(_scalar(outputs[1], "overflow", True)) if len(outputs) >= 2 else False
            scale = _scalar(outputs[2], "loss_scale") if len(outputs) >= 3 else None
        else:
            loss, overflow, scale = outputs, False, None
        if scale is None:
            scale = cell_loss_scale(train_network)
        return loss, overflow, 1.0 if scale is None else scale

    def on_train_end(self, run_context):
        self._finish(getattr(run_context.original_args(), "train_network", None))

    def __exit__(self, *error):
        """Training stopped by an exception (a :class:`lossscale.PersistentOverflowError`, an interrupt):
        MindSpore's ``Model`` then skips ``on_train_end`` but leaves its callbacks' context, so the steps
        recorded so far are written and summarised here, where they matter most (the step that raised returned
        no outputs: only the device counters have it)."""
        if error[0] is not None and self._train_network is not None:
            self._finish(self._train_network)

    def _finish(self, train_network):
        """The end of training: the device counters, the CSV and the summary."""
        self._train_network = None  # written once, and the network is not kept alive by the monitor
        if hasattr(train_network, "overflow_counters"):
            self.device_counters = train_network.overflow_counters()
        window = _accumulation_window(train_network)
        accumulated = 0 if window is None else int(window[0].asnumpy())
        self.open_window = (accumulated, window[1]) if accumulated else None
        if self.print_summary:  # first: a CSV that cannot be written must not cost the summary too
            print(self.format_summary(), file=self.stream or sys.stdout)
        if self.csv_path:
            self.write_csv(self.csv_path)

    # ---- reporting -------------------------------------------------------------------------
    def summary(self):
        """Totals: steps, skipped steps, overflow events (runs of consecutive overflows), the smallest and
        largest scale a step used, the scale after the last step, the last finite loss."""
        used = [r["loss_scale"] for r in self.records]
        flags = [r["overflow"] for r in self.records]
        events = sum(1 for i, flag in enumerate(flags) if flag and (i == 0 or not flags[i - 1]))
        finite_losses = [r["loss"] for r in self.records if math.isfinite(r["loss"])]
        return {
            "steps": len(self.records),
            "skipped_steps": sum(flags),
            "overflow_events": events,
            "min_loss_scale": min(used) if used else None,
            "max_loss_scale": max(used) if used else None,
            "final_loss_scale": self.records[-1]["next_loss_scale"] if self.records else None,
            "final_loss": finite_losses[-1] if finite_losses else None,
        }

    def format_summary(self):
        """The summary as a short human-readable paragraph (scales that are powers of two as ``2**k``)."""
        s = self.summary()
        if not s["steps"]:
            return "loss scaling: no steps recorded" + self._open_window_text()
        share = 100.0 * s["skipped_steps"] / s["steps"]
        text = (
            f"loss scaling: {plural(s['steps'], 'step')}, {s['skipped_steps']} skipped ({share:.1f}%) in "
            f"{plural(s['overflow_events'], 'overflow event')}; scale min {format_scale(s['min_loss_scale'])}, "
            f"max {format_scale(s['max_loss_scale'])}, final {format_scale(s['final_loss_scale'])}"
        )
        if self.device_counters:
            c = self.device_counters
            text += (
                f"\ndevice counters: {c['steps']} optimizer steps, {c['skipped_steps']} skipped, "
                f"{c['consecutive_overflows']} consecutive overflows now, last overflow at step "
                f"{c['last_overflow_step'] or 'none'}"
            )
        return text + self._open_window_text()

    def _open_window_text(self):
        if not self.open_window:
            return ""
        return (
            f"\ntraining ended inside an accumulation window: {self.open_window[0]} of {self.open_window[1]} "
            f"micro-batches accumulated, not applied yet (the next call continues the window)"
        )

    def write_csv(self, path):
        """Write :attr:`records` as CSV with the columns :data:`FIELDS`, creating the missing folders (as
        MindSpore's ``ModelCheckpoint`` does for its directory)."""
        with _open_csv(path, "w") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(self.records)
