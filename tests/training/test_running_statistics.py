"""A skipped step leaves the network's BatchNorm running statistics as they were.

BatchNorm updates its moving mean and variance in the forward pass, before any check. A batch whose forward
pass overflows makes them inf/nan for good in MindSpore's and PyTorch's loss scaling (training goes on with
batch statistics, every evaluation returns nan). The train cell writes them back on a skipped step."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn
from nets import BatchNormNet, jit_if

from lossscale import DynamicLossScaleManager, FixedLossScaleManager, Model, TrainOneStepWithLossScaleCell
from lossscale.training.running_statistics import RunningStatistics

BATCHES = [
    (
        np.random.RandomState(seed).randn(8, 4).astype(np.float32),
        np.random.RandomState(seed + 100).randn(8, 1).astype(np.float32),
    )
    for seed in range(4)
]


def _cell(manager, **options):
    net = BatchNormNet()
    scale_sense = manager.get_update_cell() if manager is not None else Tensor(np.float32(1024.0))
    step = TrainOneStepWithLossScaleCell(
        nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.05, 0.9), scale_sense, **options
    )
    step.set_train()
    return net, step


def _state(net):
    """Every Parameter of the network (weights and statistics), by name."""
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def _statistics(net):
    return {name: value for name, value in _state(net).items() if "moving" in name or "running" in name}


def _bad(x, y, kind):
    """A batch whose forward pass overflows (inf input: inf/nan activations) or whose loss alone does (a target
    of 1e20 squares to inf; the activations, and so the statistics, stay finite)."""
    x, y = x.copy(), y.copy()
    if kind == "inf_input":
        x[0, 0] = np.inf
    else:
        y[0, 0] = 1e20
    return x, y


def _train(step, batches):
    return [bool(step(Tensor(x), Tensor(y))[1].asnumpy()) for x, y in batches]


@pytest.fixture(params=["graph", "pynative"], name="mode")
def _mode(request):
    if request.param == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.parametrize("kind", ["inf_input", "inf_loss"])
@pytest.mark.slow
def test_a_skipped_step_leaves_the_whole_network_as_a_run_that_never_saw_the_batch(kind, mode):
    net, step = _cell(FixedLossScaleManager(1024.0, drop_overflow_update=True))
    control_net, control = _cell(FixedLossScaleManager(1024.0, drop_overflow_update=True))
    x, y = BATCHES[0]
    assert _train(step, [BATCHES[0], _bad(x, y, kind), BATCHES[1]]) == [False, True, False]
    assert _train(control, [BATCHES[0], BATCHES[1]]) == [False, False]
    ours, theirs = _state(net), _state(control_net)
    assert set(ours) == set(theirs) and any("running" in n or "moving" in n for n in ours)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)
    net.set_train(False)
    assert np.isfinite(net(Tensor(x)).asnumpy()).all()


def test_without_the_restore_the_statistics_would_be_poisoned():
    """The premise: MindSpore's BatchNorm makes its statistics non-finite in the forward pass of such a batch."""
    net = BatchNormNet()
    net.set_train()
    x, y = _bad(*BATCHES[0], "inf_input")
    net(Tensor(x))
    assert not all(np.isfinite(v).all() for v in _statistics(net).values())


def test_an_applied_overflowing_step_keeps_its_statistics():
    """drop_overflow_update=False applies every step (MindSpore's documented meaning), so nothing is restored."""
    net, step = _cell(None, drop_overflow_update=False)
    assert step.running_statistics is None
    x, y = _bad(*BATCHES[0], "inf_input")
    assert _train(step, [(x, y)]) == [True]
    assert not all(np.isfinite(v).all() for v in _statistics(net).values())


@pytest.mark.slow
def test_dynamic_scale_clean_steps_update_the_statistics_as_mindspores_cell():
    net, step = _cell(DynamicLossScaleManager(2.0**10, 2, 2))
    control_net = BatchNormNet()
    control = nn.TrainOneStepCell(
        nn.WithLossCell(control_net, nn.MSELoss()), nn.Momentum(control_net.trainable_params(), 0.05, 0.9)
    )
    control.set_train()
    assert _train(step, BATCHES) == [False] * 4
    for x, y in BATCHES:
        control(Tensor(x), Tensor(y))
    for name, value in _statistics(control_net).items():
        np.testing.assert_allclose(_statistics(net)[name], value, rtol=1e-6, err_msg=name)


def test_with_accumulation_an_overflowing_micro_batch_leaves_no_statistics():
    """With accumulation, a micro-batch whose own forward or loss overflowed gives its statistics back; the
    window's finite micro-batches keep theirs (their batches were finite), though the window is skipped."""
    net, step = _cell(DynamicLossScaleManager(2.0**10, 2, 100), accumulation_steps=2)
    x, y = BATCHES[1]
    _train(step, [BATCHES[0]])
    after_first = _statistics(net)
    assert _train(step, [_bad(x, y, "inf_input")]) == [True]  # the window's decision, on its last micro-batch
    for name, value in _statistics(net).items():
        np.testing.assert_array_equal(value, after_first[name], err_msg=name)
    _train(step, [BATCHES[2]])
    assert all(not np.array_equal(after_first[k], v) for k, v in _statistics(net).items())


def test_the_guard_finds_every_batch_norm_statistic_once():
    """Also mint's BatchNorm and MindSpore's InstanceNorm, which have no CPU kernel in MindSpore 2.10 (so only
    found here, not trained); not the normalisations without running statistics."""
    net = nn.SequentialCell(
        nn.Dense(2, 2),
        nn.BatchNorm1d(2),
        nn.ReLU(),
        mint.nn.BatchNorm1d(2),
        nn.LayerNorm((2,)),
        nn.InstanceNorm2d(2),
        nn.GroupNorm(1, 2),
        mint.nn.GroupNorm(1, 2),
    )
    names = [p.name for p in RunningStatistics.of(net).statistics]
    assert names == [
        "1.moving_mean",
        "1.moving_variance",
        "3.running_mean",
        "3.running_var",
        "3.num_batches_tracked",
        "5.moving_mean",
        "5.moving_variance",
    ]
    assert RunningStatistics.of(nn.SequentialCell(nn.Dense(2, 2), nn.LayerNorm((2,)))) is None


@pytest.mark.slow
def test_amp_o1_networks_built_one_after_another_each_keep_their_statistics(tmp_path, monkeypatch):
    """MindSpore's amp O1 rewrite makes BatchNorm1d a generated class that, from the second network built in a
    process on, is no longer a _BatchNorm: the guard finds the statistics by what the layer holds, so a skipped
    step of every network built leaves them finite and as they were."""
    monkeypatch.chdir(tmp_path)  # where amp O1 writes the rewritten source
    for _ in range(3):
        net = BatchNormNet()
        model = Model(
            net,
            nn.MSELoss(),
            nn.Momentum(net.trainable_params(), 0.05, 0.9),
            amp_level="O1",
            loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=True),
        )
        step = model.train_network
        step.set_train()
        assert [p.name for p in step.running_statistics.statistics] == ["norm.moving_mean", "norm.moving_variance"]
        before = _statistics(net)
        assert _train(step, [_bad(*BATCHES[0], "inf_input")]) == [True]
        for name, value in _statistics(net).items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_the_guard_adds_no_parameter_and_renames_none():
    net, step = _cell(DynamicLossScaleManager())
    names = [name for name, _ in step.parameters_and_names()]
    assert len(names) == len(set(names)) and not any("running_statistics" in name for name in names)
    assert {p.name for p in net.get_parameters()} == set(_state(BatchNormNet()))


@pytest.mark.slow
def test_the_grad_scaler_recipe_writes_the_statistics_back_as_the_train_cell(compiled):
    """The functional front-ends leave the forward pass to the caller (as PyTorch does); the documented recipe
    (docs/migration.md) saves the statistics before it and writes them back with the skip flag of ``step``:
    then a skipped step leaves the network as the train cell does."""
    from lossscale import GradScaler

    net = BatchNormNet()
    net.set_train()
    loss_fn = nn.WithLossCell(net, nn.MSELoss())
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    scaler = GradScaler("cpu", init_scale=1024.0)
    statistics = RunningStatistics.of(net)

    def forward(x, y):
        return scaler.scale(loss_fn(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(x, y):
        saved = statistics.save()  # before the forward pass
        _, grads = grad_fn(x, y)
        skipped = scaler.step(optimizer, grads)
        statistics.restore_if(skipped, saved)
        scaler.update()
        return skipped

    train_step = jit_if(compiled, train_step)
    x, y = BATCHES[0]
    bad_x, bad_y = _bad(x, y, "inf_input")
    skips = [bool(train_step(Tensor(a), Tensor(b)).asnumpy()) for a, b in [BATCHES[0], (bad_x, bad_y), BATCHES[1]]]
    assert skips == [False, True, False]
    control_net, control = _cell(FixedLossScaleManager(1024.0, drop_overflow_update=True))
    assert _train(control, [BATCHES[0], BATCHES[1]]) == [False, False]
    for name, value in _state(control_net).items():
        np.testing.assert_allclose(_state(net)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
