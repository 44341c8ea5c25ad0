"""LossScaleMonitor: records, summary, CSV, and what it sees inside Model.train."""
import csv

import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn

from lossscale import DynamicLossScaleManager, Model
from lossscale.monitor import FIELDS, LossScaleMonitor
from lossscale.policy import run


def test_record_counts_skips_and_events():
    monitor = LossScaleMonitor(print_summary=False)
    flags = [False, True, True, False, True, False]
    for step, flag in enumerate(flags):
        monitor.record(epoch=1, loss=Tensor(np.float32(1.0 / (step + 1))), loss_scale=2.0**(10 - step),
                       overflow=flag)
    assert [r["skipped_steps"] for r in monitor.records] == [0, 1, 2, 2, 3, 3]
    summary = monitor.summary()
    assert (summary["steps"], summary["skipped_steps"], summary["overflow_events"]) == (6, 3, 2)
    assert (summary["min_loss_scale"], summary["max_loss_scale"], summary["final_loss_scale"]) == (32.0, 1024.0, 32.0)
    assert "6 steps, 3 skipped (50.0%) in 2 overflow events" in monitor.format_summary()


def test_final_loss_ignores_non_finite_losses():
    monitor = LossScaleMonitor(print_summary=False)
    monitor.record(1, 0.5, 8.0, False)
    monitor.record(1, float("inf"), 4.0, True)
    assert monitor.summary()["final_loss"] == 0.5


def test_empty_summary():
    assert LossScaleMonitor().format_summary() == "loss scaling: no steps recorded"


def test_monitor_inside_model_train(tmp_path, capsys):
    rng = np.random.RandomState(0)
    x = rng.randn(40, 4).astype(np.float32)
    x[13, 1] = np.nan  # row 13 lies in the second batch (batch size 8) of every epoch
    y = (x[:, 0] > 0).astype(np.int32)
    data = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)
    net = nn.Dense(4, 2)
    manager = DynamicLossScaleManager(init_loss_scale=2**8, scale_window=2)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), 0.1), loss_scale_manager=manager)
    path = tmp_path / "steps.csv"
    monitor = LossScaleMonitor(csv_path=str(path))
    model.train(2, data, callbacks=[monitor])
    flags = [r["overflow"] for r in monitor.records]
    assert flags == [i % 5 == 1 for i in range(10)]  # row 13 is in the second batch of each epoch
    assert [r["loss_scale"] for r in monitor.records] == [s.scale for s in run(manager.policy, flags)]
    assert [r["epoch"] for r in monitor.records] == [1] * 5 + [2] * 5
    assert "10 steps, 2 skipped" in capsys.readouterr().out
    with open(path, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == FIELDS and len(rows) == 10 and rows[-1]["skipped_steps"] == "2"


def test_monitor_with_a_plain_train_cell():
    monitor = LossScaleMonitor(print_summary=False)

    class Args:
        net_outputs = Tensor(np.float32(0.25))
        cur_epoch_num = 3

    class Context:
        @staticmethod
        def original_args():
            return Args

    monitor.on_train_step_end(Context)
    assert monitor.records == [{"step": 1, "epoch": 3, "loss": 0.25, "loss_scale": 1.0, "overflow": False,
                                "skipped_steps": 0}]


@pytest.mark.parametrize("value", [Tensor(np.array([2.5], np.float32)), np.float32(2.5), 2.5])
def test_record_accepts_tensors_numpy_and_floats(value):
    monitor = LossScaleMonitor(print_summary=False)
    monitor.record(1, value, value, False)
    assert monitor.records[0]["loss"] == monitor.records[0]["loss_scale"] == 2.5
