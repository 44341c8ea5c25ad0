"""``LossScaleMonitor``: a MindSpore callback that records loss scaling step by step.

It reads the ``(loss, overflow, loss_scale)`` outputs of the train network, which
``Model`` hands to callbacks anyway, so it adds no device work; converting those
three scalars to Python numbers syncs the host once per step.
"""
import csv
import math
import sys

import numpy as np
from mindspore.train import Callback

FIELDS = ("step", "epoch", "loss", "loss_scale", "overflow", "skipped_steps")


def _scalar(value):
    """A Python float from a Tensor, numpy value or number."""
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    return float(np.asarray(value).reshape(-1)[0])


class LossScaleMonitor(Callback):
    """Record, per training step, the loss, the loss scale, the overflow flag and the running skip count.

    Works with any train network whose outputs are ``(loss, overflow, loss_scale)``
    (:class:`lossscale.TrainOneStepWithLossScaleCell`, MindSpore's own cell);
    with a plain ``TrainOneStepCell`` it records the loss with scale 1 and no overflow.

    Args:
        csv_path (str, optional): write the records there at the end of training.
        print_summary (bool): print a one-paragraph summary at the end. Default True.
        stream: where the summary goes (default ``sys.stdout``).

    Attributes:
        records (list[dict]): one dict per step with keys :data:`FIELDS`.
        device_counters (dict or None): at the end of training, the train cell's in-graph
            counters (:meth:`lossscale.TrainOneStepWithLossScaleCell.overflow_counters`).

    Host syncs: one per step (three scalars read together).

    Example:
        >>> monitor = LossScaleMonitor(print_summary=False)
        >>> monitor.record(epoch=1, loss=0.5, loss_scale=1024.0, overflow=True)
        >>> monitor.summary()["skipped_steps"]
        1
    """

    def __init__(self, csv_path=None, print_summary=True, stream=None):
        super().__init__()
        self.csv_path = csv_path
        self.print_summary = print_summary
        self.stream = stream
        self.records = []
        self.device_counters = None

    # ---- recording -------------------------------------------------------------------------
    def record(self, epoch, loss, loss_scale, overflow):
        """Append one step (also usable from a custom training loop)."""
        skipped = (self.records[-1]["skipped_steps"] if self.records else 0) + int(bool(overflow))
        self.records.append({"step": len(self.records) + 1, "epoch": int(epoch), "loss": _scalar(loss),
                             "loss_scale": _scalar(loss_scale), "overflow": bool(overflow),
                             "skipped_steps": skipped})

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        outputs = params.net_outputs
        if isinstance(outputs, (tuple, list)) and len(outputs) >= 3:
            loss, overflow, scale = outputs[0], bool(_scalar(outputs[1])), outputs[2]
        else:
            loss, overflow, scale = outputs, False, 1.0
        self.record(params.cur_epoch_num, loss, scale, overflow)

    def on_train_end(self, run_context):
        train_network = getattr(run_context.original_args(), "train_network", None)
        if hasattr(train_network, "overflow_counters"):
            self.device_counters = train_network.overflow_counters()
        if self.csv_path:
            self.write_csv(self.csv_path)
        if self.print_summary:
            print(self.format_summary(), file=self.stream or sys.stdout)

    # ---- reporting -------------------------------------------------------------------------
    def summary(self):
        """Totals: steps, skipped steps, overflow events (runs of consecutive overflows), min/max/final scale."""
        scales = [r["loss_scale"] for r in self.records]
        flags = [r["overflow"] for r in self.records]
        events = sum(1 for i, flag in enumerate(flags) if flag and (i == 0 or not flags[i - 1]))
        finite_losses = [r["loss"] for r in self.records if math.isfinite(r["loss"])]
        return {
            "steps": len(self.records),
            "skipped_steps": sum(flags),
            "overflow_events": events,
            "min_loss_scale": min(scales) if scales else None,
            "max_loss_scale": max(scales) if scales else None,
            "final_loss_scale": scales[-1] if scales else None,
            "final_loss": finite_losses[-1] if finite_losses else None,
        }

    def format_summary(self):
        """The summary as a short human-readable paragraph."""
        s = self.summary()
        if not s["steps"]:
            return "loss scaling: no steps recorded"
        share = 100.0 * s["skipped_steps"] / s["steps"]
        text = (f"loss scaling: {s['steps']} steps, {s['skipped_steps']} skipped ({share:.1f}%) in "
                f"{s['overflow_events']} overflow events; scale min {s['min_loss_scale']:g}, "
                f"max {s['max_loss_scale']:g}, final {s['final_loss_scale']:g}")
        if self.device_counters:
            c = self.device_counters
            text += (f"\ndevice counters: {c['steps']} optimizer steps, {c['skipped_steps']} skipped, "
                     f"{c['consecutive_overflows']} consecutive overflows now, last overflow at step "
                     f"{c['last_overflow_step'] or 'none'}")
        return text

    def write_csv(self, path):
        """Write :attr:`records` as CSV with the columns :data:`FIELDS`."""
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(self.records)
