"""LossScaleMonitor: records, summary, CSV, and what it sees inside Model.train."""

import csv
import io
import math

import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback

from lossscale import DynamicLossScaleManager, Model, PersistentOverflowError
from lossscale.core.policy import run
from lossscale.training.monitor import FIELDS, LossScaleMonitor


def test_record_counts_skips_and_events():
    monitor = LossScaleMonitor(print_summary=False)
    flags = [False, True, True, False, True, False]
    for step, flag in enumerate(flags):
        monitor.record(epoch=1, loss=Tensor(np.float32(1.0 / (step + 1))), loss_scale=2.0 ** (10 - step), overflow=flag)
    assert [r["skipped_steps"] for r in monitor.records] == [0, 1, 2, 2, 3, 3]
    summary = monitor.summary()
    assert (summary["steps"], summary["skipped_steps"], summary["overflow_events"]) == (6, 3, 2)
    assert (summary["min_loss_scale"], summary["max_loss_scale"], summary["final_loss_scale"]) == (32.0, 1024.0, 32.0)
    assert "6 steps, 3 skipped (50.0%) in 2 overflow events" in monitor.format_summary()
    growing = LossScaleMonitor(print_summary=False)  # the first step used the smallest scale, the last the largest
    for scale in (8.0, 16.0, 32.0):
        growing.record(epoch=1, loss=1.0, loss_scale=scale, overflow=False, next_loss_scale=2 * scale)
    summary = growing.summary()
    assert (summary["min_loss_scale"], summary["max_loss_scale"], summary["final_loss_scale"]) == (8.0, 32.0, 64.0)


@pytest.mark.parametrize(
    "flags, events",
    [
        ([True, False, True], 2),
        ([True, True, False, True, True], 2),
        ([False, True, True], 1),
        ([True], 1),
        ([False, False], 0),
    ],
)
def test_overflow_events_are_runs_of_overflows(flags, events):
    """A run that starts at the first step counts, whatever the last step was."""
    monitor = LossScaleMonitor(print_summary=False)
    for flag in flags:
        monitor.record(1, 0.5, 8.0, flag)
    assert monitor.summary()["overflow_events"] == events


@pytest.mark.parametrize("print_summary", [True, False])
def test_print_summary_decides_whether_the_end_of_training_prints(print_summary, capsys):
    monitor = LossScaleMonitor(print_summary=print_summary)
    monitor.record(1, 0.5, 8.0, True)
    monitor.on_train_end(_context(Tensor(np.float32(0.5)), None))
    assert capsys.readouterr().out == (monitor.format_summary() + "\n" if print_summary else "")


def test_final_loss_ignores_non_finite_losses():
    monitor = LossScaleMonitor(print_summary=False)
    monitor.record(1, 0.5, 8.0, False)
    monitor.record(1, float("inf"), 4.0, True)
    assert monitor.summary()["final_loss"] == 0.5


def test_empty_summary():
    assert LossScaleMonitor().format_summary() == "loss scaling: no steps recorded"


def _classifier(x, **model_options):
    """A ``Model`` of a Dense(4, 2) classifier (SGD, ``model_options``) and the batches of 8 rows of ``x``, each row
    labelled by the sign of its first column."""
    data = ds.NumpySlicesDataset({"data": x, "label": (x[:, 0] > 0).astype(np.int32)}, shuffle=False).batch(8)
    net = nn.Dense(4, 2)
    model = Model(
        net,
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        nn.SGD(net.trainable_params(), 0.1),
        **model_options,
    )
    return model, data


def test_monitor_inside_model_train(tmp_path, capsys):
    rng = np.random.RandomState(0)
    x = rng.randn(40, 4).astype(np.float32)
    x[13, 1] = np.nan  # row 13 lies in the second batch (batch size 8) of every epoch
    manager = DynamicLossScaleManager(init_loss_scale=2**8, scale_window=2)
    model, data = _classifier(x, loss_scale_manager=manager)
    path = tmp_path / "runs" / "new" / "steps.csv"  # folders that do not exist yet: the end of training made them
    monitor = LossScaleMonitor(csv_path=str(path))
    model.train(2, data, callbacks=[monitor])
    flags = [r["overflow"] for r in monitor.records]
    assert flags == [i % 5 == 1 for i in range(10)]  # row 13 is in the second batch of each epoch
    after = [s.scale for s in run(manager.policy, flags)]
    assert [r["next_loss_scale"] for r in monitor.records] == after
    assert [r["loss_scale"] for r in monitor.records] == [256.0] + after[:-1]  # the scale each step used
    assert [r["epoch"] for r in monitor.records] == [1] * 5 + [2] * 5
    assert "10 steps, 2 skipped" in capsys.readouterr().out
    with open(path, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == FIELDS and len(rows) == 10 and rows[-1]["skipped_steps"] == "2"


def test_a_training_stopped_by_persistent_overflow_keeps_its_records(tmp_path, capsys):
    """overflow_policy="raise" stops Model.train with PersistentOverflowError, and MindSpore then skips
    on_train_end: the CSV and the summary of the steps so far, the ones that explain the stop, were lost."""
    x = np.random.RandomState(0).randn(40, 4).astype(np.float32)
    x[8:24, 1] = np.nan  # batches 2 and 3 (of 8 rows) overflow: two in a row
    model, data = _classifier(
        x,
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**8),
        overflow_policy="raise",
        max_consecutive_overflows=2,
    )
    path = tmp_path / "steps.csv"
    monitor = LossScaleMonitor(csv_path=str(path))
    with pytest.raises(PersistentOverflowError):
        model.train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    # The step that raised returned no outputs to record; the device counters have it.
    assert [r["overflow"] for r in monitor.records] == [False, True]
    assert (monitor.device_counters["steps"], monitor.device_counters["skipped_steps"]) == (3, 2)
    printed = capsys.readouterr().out
    assert "2 steps, 1 skipped" in printed and "device counters: 3 optimizer steps, 2 skipped" in printed
    with open(path, encoding="utf-8") as handle:
        assert [row["overflow"] for row in csv.DictReader(handle)] == ["False", "True"]


def test_an_error_after_the_end_of_training_does_not_repeat_the_summary(tmp_path, capsys):
    """A callback after the monitor fails at the end of training (a full disk for a checkpoint): MindSpore leaves
    the callbacks' context with that error after the monitor's on_train_end, and the summary must not come twice."""

    class FailsAtEnd(Callback):
        def on_train_end(self, run_context):
            raise OSError("disk full")

    model, data = _classifier(
        np.random.RandomState(0).randn(16, 4).astype(np.float32),
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**8),
    )
    monitor = LossScaleMonitor(csv_path=str(tmp_path / "steps.csv"))
    with pytest.raises(OSError, match="disk full"):
        model.train(1, data, callbacks=[monitor, FailsAtEnd()], dataset_sink_mode=False)
    assert capsys.readouterr().out.count("loss scaling: 2 steps") == 1


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
    assert monitor.records == [
        {
            "step": 1,
            "epoch": 3,
            "loss": 0.25,
            "loss_scale": 1.0,
            "overflow": False,
            "skipped_steps": 0,
            "next_loss_scale": 1.0,
        }
    ]


@pytest.mark.parametrize("value", [Tensor(np.array([2.5], np.float32)), np.float32(2.5), 2.5])
def test_record_accepts_tensors_numpy_and_floats(value):
    monitor = LossScaleMonitor(print_summary=False)
    monitor.record(1, value, value, False)
    assert monitor.records[0]["loss"] == monitor.records[0]["loss_scale"] == 2.5


def _context(outputs, train_network, epoch=1):
    class Args:
        net_outputs = outputs
        cur_epoch_num = epoch

    Args.train_network = train_network

    class Context:
        @staticmethod
        def original_args():
            return Args

    return Context


class LossOnlyStep(nn.TrainOneStepWithLossScaleCell):
    """mindcv's and mindone's style: MindSpore's cell subclassed, returning the loss (and the overflow flag)."""

    def __init__(self, outputs):
        super().__init__(
            nn.WithLossCell(nn.Dense(2, 1), nn.MSELoss()),
            nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1),
            Tensor(np.float32(1024.0)),
        )
        self.outputs = outputs


class NumberScaleStep:
    """A train network that holds its scale as a Python number."""

    scale_sense = 1024


def _mindspore_plain_cell(outputs):
    """MindSpore's nn.TrainOneStepCell with a fixed sens (its loss scale, a Python number): returns the loss."""
    net = nn.WithLossCell(nn.Dense(2, 1), nn.MSELoss())
    return nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1), sens=1024.0)


@pytest.mark.parametrize(
    "make_cell",
    [LossOnlyStep, lambda outputs: NumberScaleStep(), _mindspore_plain_cell],
    ids=["scale_parameter", "scale_number", "mindspore_sens"],
)
@pytest.mark.parametrize(
    "outputs", [Tensor(np.float32(0.5)), (Tensor(np.float32(0.5)), Tensor(True))], ids=["loss", "loss_overflow"]
)
def test_scale_is_read_from_a_cell_that_does_not_return_it(outputs, make_cell):
    monitor = LossScaleMonitor(print_summary=False)
    cell = make_cell(outputs)
    monitor.on_train_begin(_context(None, cell))
    monitor.on_train_step_end(_context(outputs, cell))
    record = monitor.records[0]
    assert record["loss_scale"] == record["next_loss_scale"] == 1024.0
    assert record["overflow"] == isinstance(outputs, tuple)


class ZooAccumulationStep(LossOnlyStep):
    """Model-zoo accumulation cells (TrainAccuStepsWithLossScaleCell) keep a bool flag named ``accumulation``."""

    def __init__(self, outputs):
        super().__init__(outputs)
        self.accumulation = False


def test_a_cell_whose_accumulation_is_a_flag_of_its_own_gets_a_row_per_call():
    monitor = LossScaleMonitor(print_summary=False)
    cell = ZooAccumulationStep(None)
    monitor.on_train_begin(_context(None, cell))
    for overflow in (False, True):
        monitor.on_train_step_end(_context((Tensor(np.float32(0.5)), Tensor(overflow), Tensor(np.float32(8.0))), cell))
    monitor.on_train_end(_context(None, cell))
    assert [record["overflow"] for record in monitor.records] == [False, True] and monitor.open_window is None


def test_one_row_per_optimizer_step_under_accumulation():
    """4 micro-batches per step, an inf in windows 1 and 3 of 4: 2 of 4 optimizer steps skipped (50%), where
    counting calls would give 2 of 16 (12.5%)."""
    from nets import regression_batches, regression_net, with_inf

    from lossscale import TrainOneStepWithLossScaleCell

    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.01),
        DynamicLossScaleManager(init_loss_scale=2**10).get_update_cell(),
        accumulation_steps=4,
    )
    monitor = LossScaleMonitor(print_summary=False)
    monitor.on_train_begin(_context(None, step))
    losses = []
    for call, (x, y) in enumerate(regression_batches(16)):
        if call in (2, 9):
            x = with_inf(x)
        outputs = step(Tensor(x), Tensor(y))
        losses.append(float(outputs[0].asnumpy()))
        monitor.on_train_step_end(_context(outputs, step))
    assert [r["overflow"] for r in monitor.records] == [True, False, True, False]
    np.testing.assert_allclose(
        [r["loss"] for r in monitor.records],  # a row's loss: its window's mean loss
        np.reshape(losses, (4, 4)).mean(axis=1),
        rtol=1e-6,
    )
    assert [r["loss_scale"] for r in monitor.records] == [1024.0, 512.0, 512.0, 256.0]
    assert "4 steps, 2 skipped (50.0%)" in monitor.format_summary()
    assert step.overflow_counters()["skipped_steps"] == 2
    monitor.on_train_end(_context(None, step))
    assert monitor.open_window is None and "accumulation window" not in monitor.format_summary()
    ended_inside = LossScaleMonitor(print_summary=False)  # a run that stops after a window's first micro-batch
    ended_inside.on_train_begin(_context(None, step))
    x, y = regression_batches(1)[0]
    ended_inside.on_train_step_end(_context(step(Tensor(x), Tensor(y)), step))
    ended_inside.on_train_end(_context(None, step))
    assert ended_inside.records == [] and ended_inside.open_window == (1, 4)
    assert (
        "training ended inside an accumulation window: 1 of 4 micro-batches accumulated, not applied yet"
        in ended_inside.format_summary()
    )


@pytest.mark.parametrize(
    "arguments, error, pattern",
    [
        ((1.5, 0.5, 8.0, False), TypeError, "'epoch' must be an int, but got 1.5"),  # was recorded as epoch 1
        ((True, 0.5, 8.0, False), TypeError, "'epoch' must be an int, but got True"),
        ((-1, 0.5, 8.0, False), ValueError, "'epoch' must be an int in \\[0, "),
        ((1, None, 8.0, False), TypeError, "'loss' must be a number or a Tensor of numbers, but got None"),
        ((1, "x", 8.0, False), TypeError, "'loss' must be a number or a Tensor of numbers, but got 'x'"),
        ((1, True, 8.0, False), TypeError, "'loss' must be a number or a Tensor of numbers, but got True"),
        ((1, 0.5, True, False), TypeError, "'loss_scale' must be a number or a Tensor of numbers, but got True"),
        ((1, 0.5, 8.0, "no"), TypeError, "'overflow' must be a bool .*but got 'no'"),  # was recorded as an overflow
        ((1, 0.5, 8.0, None), TypeError, "'overflow' must be a bool .*but got None"),  # was recorded as clean
        ((1, 0.5, 8.0, Tensor(np.array([True, False]))), TypeError, "'overflow' must be a bool"),
        (
            (1, 0.5, -8.0, False),
            ValueError,
            "'loss_scale' must be a loss scale, a number >= 0 \\(inf included\\), but got -8.0",
        ),
        ((1, 0.5, float("nan"), False), ValueError, "'loss_scale' must be a loss scale.*but got nan"),
        ((1, 0.5, Tensor(np.ones(2, np.float32)), False), ValueError, "'loss_scale' must hold one value"),
        ((1, 0.5, 8.0, False, -1.0), ValueError, "'next_loss_scale' must be a loss scale"),
    ],
)
def test_record_refuses_what_is_not_a_step(arguments, error, pattern):
    """record() (for custom loops) took anything: a fractional or bool epoch, a truthy string as an overflow, None
    as a clean step, a negative or nan scale. Each is refused naming the argument; nothing is recorded."""
    monitor = LossScaleMonitor(print_summary=False)
    with pytest.raises(error, match=pattern):
        monitor.record(*arguments)
    assert monitor.records == []


def test_record_takes_the_mean_of_a_loss_and_every_scale_a_cell_can_hold():
    """A per-sample loss (reduction="none") was recorded as its first value; the scales a cell can show (inf from
    MindSpore's own cell, 0 from a rule without floor) are recorded as they are, not refused mid-training."""
    monitor = LossScaleMonitor(print_summary=False)
    monitor.record(1, Tensor(np.array([1.0, 2.0, 6.0], np.float32)), 8.0, Tensor(np.array([False])))
    monitor.record(1, np.float32(np.nan), 8.0, np.bool_(True))  # a non-finite loss is a loss too
    monitor.record(1, 0.5, float("inf"), True, 0.0)  # MindSpore's own cell grows to inf; a rule without floor hits 0
    assert [r["loss"] for r in monitor.records][0] == 3.0 and math.isnan(monitor.records[1]["loss"])
    assert [r["overflow"] for r in monitor.records] == [False, True, True]
    assert (monitor.records[2]["loss_scale"], monitor.records[2]["next_loss_scale"]) == (float("inf"), 0.0)


def test_a_csv_that_cannot_be_written_does_not_cost_the_summary(tmp_path):
    """The CSV was written before the summary was printed: a path that cannot be written (here a folder) raised at
    the end of training and the summary was lost too. The summary comes first now; the records stay in memory."""
    stream = io.StringIO()
    monitor = LossScaleMonitor(csv_path=str(tmp_path), stream=stream)
    monitor.record(1, 0.5, 1024.0, True, 512.0)
    with pytest.raises(OSError):
        monitor.on_train_end(_context(None, None))
    assert "1 step, 1 skipped" in stream.getvalue() and len(monitor.records) == 1


def test_a_csv_path_that_cannot_be_written_fails_before_the_first_step(tmp_path):
    """It failed at the end of training, after every step had run: Model.train raised there, and the lines after
    it in a script (saving the weights) never ran. Now the monitor opens the file when training begins (Keras'
    CSVLogger does too), and a folder given as the path fails before any step. A file already there is kept as it
    is until the end (a run killed in between leaves it)."""
    model, data = _classifier(
        np.random.RandomState(0).randn(16, 4).astype(np.float32),
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**8),
    )
    weights = [p.asnumpy().copy() for p in model.train_network.trainable_params()]
    monitor = LossScaleMonitor(csv_path=str(tmp_path), print_summary=False)
    with pytest.raises(IsADirectoryError):
        model.train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    assert monitor.records == []
    assert all(np.array_equal(p.asnumpy(), w) for p, w in zip(model.train_network.trainable_params(), weights))
    earlier = tmp_path / "earlier.csv"
    earlier.write_text("an earlier run's rows\n", encoding="utf-8")
    LossScaleMonitor(csv_path=str(earlier)).on_train_begin(_context(None, None))
    assert earlier.read_text(encoding="utf-8") == "an earlier run's rows\n"


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"csv_path": ""}, ValueError, "'csv_path' must be a file path or None, but got ''"),
        ({"csv_path": True}, TypeError, "'csv_path' must be a file path"),
        ({"csv_path": 3}, TypeError, "'csv_path' must be a file path"),
        ({"print_summary": "yes"}, TypeError, "'print_summary' must be a bool"),
        ({"stream": "stdout"}, TypeError, "'stream' must have a write"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        LossScaleMonitor(**kwargs)
