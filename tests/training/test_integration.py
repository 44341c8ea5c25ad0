"""lossscale.Model and build_train_network on CPU; compatibility with MindSpore's own classes."""

import re

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Accuracy, CheckpointConfig, LossMonitor, ModelCheckpoint
from nets import StepRecorder, keras_step, regression_batches, regression_net, snapshot, with_inf

from lossscale import (
    AdaptiveLossScaleManager,
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    GradScaler,
    LossScaleOptimizer,
    Model,
    PersistentOverflowError,
    TrainOneStepWithLossScaleCell,
    build_train_network,
    get_preset,
)
from lossscale.core.adaptive import run_adaptive
from lossscale.core.policy import run

BAD_ROW = 20  # in batch 2 (batch size 8) of every epoch


def _classification_data():
    rng = np.random.RandomState(0)
    x = rng.randn(64, 8).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return x, y


def _classification_data_with_inf():
    """``(x, x_bad, y)``: x_bad is x with inf in row BAD_ROW, so batch 2 of every epoch overflows."""
    x, y = _classification_data()
    x_bad = x.copy()
    x_bad[BAD_ROW, 3] = np.inf
    return x, x_bad, y


def _dataset(x, y):
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def _loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@pytest.mark.parametrize("amp_level", ["O0", "O2"])
def test_model_trains_on_cpu_with_dynamic_scaling_and_an_overflowing_batch(amp_level, capsys):
    x, x_bad, y = _classification_data_with_inf()
    net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    model = Model(
        net,
        _loss_fn(),
        nn.Momentum(net.trainable_params(), 0.05, 0.9),
        metrics={"acc": Accuracy()},
        amp_level=amp_level,
        loss_scale_manager=manager,
    )
    assert isinstance(model.train_network, TrainOneStepWithLossScaleCell)
    recorder = StepRecorder()
    model.train(2, _dataset(x_bad, y), callbacks=[LossMonitor(8), recorder])

    flags = [overflow for overflow, _ in recorder.rows]
    assert flags == [step % 8 == 2 for step in range(16)]
    assert [scale for _, scale in recorder.rows] == [s.scale for s in run(manager.policy, flags)]
    assert manager.get_loss_scale() == recorder.rows[-1][1] == model.train_network.get_loss_scale()
    assert "loss is" in capsys.readouterr().out
    assert model.eval(_dataset(x, y))["acc"] >= 0.9


def test_model_accepts_mindspore_own_manager_on_cpu():
    x, x_bad, y = _classification_data_with_inf()
    net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    manager = ms.amp.DynamicLossScaleManager(2**10, 2, 2)
    model = Model(net, _loss_fn(), nn.Momentum(net.trainable_params(), 0.05, 0.9), loss_scale_manager=manager)
    assert isinstance(model.train_network.loss_scaling_manager, nn.DynamicLossScaleUpdateCell)
    recorder = StepRecorder()
    model.train(2, _dataset(x_bad, y), callbacks=[recorder])

    flags = [overflow for overflow, _ in recorder.rows]
    assert flags == [step % 8 == 2 for step in range(16)]
    same_rule = DynamicLossScaleManager(2**10, 2, 2).policy  # below the ceiling the two rules agree
    assert [scale for _, scale in recorder.rows] == [state.scale for state in run(same_rule, flags)]
    assert manager.get_loss_scale() == recorder.rows[-1][1]


def test_model_refuses_mindspores_own_manager_with_accumulation():
    """MindSpore's manager counts every update_loss_scale call as an optimizer step: under accumulation its host
    scale grew ahead of the device's (16384 against 4096 after 8 calls with a window of 2) and its stop never came.
    Refused when the Model is built, naming the replacement; without accumulation it is accepted (above)."""
    net = nn.Dense(8, 2)
    with pytest.raises(
        ValueError,
        match=r"accumulation_steps=2 with MindSpore's DynamicLossScaleManager.*Use "
        r"lossscale.DynamicLossScaleManager",
    ):
        Model(
            net,
            _loss_fn(),
            nn.Momentum(net.trainable_params(), 0.05, 0.9),
            accumulation_steps=2,
            loss_scale_manager=ms.amp.DynamicLossScaleManager(2**10, 2, 2),
        )
    Model(
        net,
        _loss_fn(),
        nn.Momentum(net.trainable_params(), 0.05, 0.9),
        accumulation_steps=2,
        loss_scale_manager=ms.amp.FixedLossScaleManager(2**10, drop_overflow_update=True),
    )  # no host rule


def test_model_stops_after_too_many_overflows_in_a_row_as_mindspores_does():
    """MindSpore's Model calls manager.update_loss_scale after every step (outside sink mode), and its manager
    raises once more than bad_step_max steps in a row overflowed: a run that overflows for good stops. Ours does
    the same (here bad_step_max=3, for speed): the fourth overflowing step in a row raises, skipped like the others."""
    x, _, y = _classification_data_with_inf()
    x = x.copy()
    x[8:48, 0] = np.nan  # batches 2 to 6 of 8 overflow
    net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    manager.bad_step_max = 3
    model = Model(net, _loss_fn(), nn.Momentum(net.trainable_params(), 0.05, 0.9), loss_scale_manager=manager)
    recorder = StepRecorder()
    with pytest.raises(RuntimeError, match="Dynamic loss scale Continuous overflow 4 times") as raised:
        model.train(1, _dataset(x, y), callbacks=[recorder], dataset_sink_mode=False)
    assert isinstance(raised.value, PersistentOverflowError)  # what the command line reports as a stalled run
    assert [overflow for overflow, _ in recorder.rows] == [False, True, True, True]  # the fifth raised before
    assert (manager.cur_iter, manager.last_overflow_iter, manager.bad_step) == (5, 5, 4)
    assert model.train_network.overflow_counters()["skipped_steps"] == 4
    assert manager.get_loss_scale() == 2.0**10 / 2**4


def test_model_with_accumulation_counts_overflowing_windows_in_a_row_not_calls():
    """With accumulation_steps=2 the train cell decides once per window and reports False on a window's first
    micro-batch (no decision yet). The manager's bad_step counts decisions: a False that decides nothing must not
    reset it (it did: a run that overflowed for good never stopped). Windows 1-4 overflow; the fourth raises."""
    x, _, y = _classification_data_with_inf()
    x = x.copy()
    x[8:64, 0] = np.nan  # micro-batches 2 to 8 overflow, so every window does
    net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    manager.bad_step_max = 3
    model = Model(
        net,
        _loss_fn(),
        nn.Momentum(net.trainable_params(), 0.05, 0.9),
        loss_scale_manager=manager,
        accumulation_steps=2,
    )
    recorder = StepRecorder()
    with pytest.raises(PersistentOverflowError, match="Dynamic loss scale Continuous overflow 4 times"):
        model.train(1, _dataset(x, y), callbacks=[recorder], dataset_sink_mode=False)
    assert [overflow for overflow, _ in recorder.rows] == [False, True] * 3 + [False]  # the eighth call raised
    assert (manager.cur_iter, manager.last_overflow_iter, manager.bad_step) == (8, 8, 4)
    assert model.train_network.overflow_counters()["skipped_steps"] == 4
    assert manager.get_loss_scale() == 2.0**10 / 2**4


def test_model_skipped_batches_match_a_model_that_never_saw_them():
    x, x_bad, y = _classification_data_with_inf()
    keep = np.ones(64, bool)
    keep[16:24] = False  # the batch holding BAD_ROW

    def train(data_x, data_y, manager):
        net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
        Model(net, _loss_fn(), nn.SGD(net.trainable_params(), 0.1), loss_scale_manager=manager).train(
            1, _dataset(data_x, data_y)
        )
        return snapshot(net)

    scaled = train(x_bad, y, DynamicLossScaleManager(init_loss_scale=2**8, scale_window=1000))
    control = train(x[keep], y[keep], FixedLossScaleManager(1.0, drop_overflow_update=False))
    for name, value in control.items():
        np.testing.assert_allclose(scaled[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow
def test_model_in_dataset_sink_mode_matches_step_by_step_training():
    """On CPU MindSpore's Model trains without sinking: the same steps, and callbacks still see every one."""
    x, x_bad, y = _classification_data_with_inf()

    def train(sink):
        net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
        manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=3)
        model = Model(net, _loss_fn(), nn.Momentum(net.trainable_params(), 0.05, 0.9), loss_scale_manager=manager)
        recorder = StepRecorder()
        model.train(2, _dataset(x_bad, y), callbacks=[recorder], dataset_sink_mode=sink)
        return snapshot(net), manager, model.train_network, recorder.rows

    sunk, manager, train_network, sunk_rows = train(sink=True)
    stepped, _, _, stepped_rows = train(sink=False)
    flags = [step % 8 == 2 for step in range(16)]
    assert sunk_rows == stepped_rows and [overflow for overflow, _ in sunk_rows] == flags
    assert train_network.overflow_counters() == {
        "steps": 16,
        "skipped_steps": 2,
        "consecutive_overflows": 0,
        "last_overflow_step": 11,
    }
    assert manager.get_loss_scale() == run(manager.policy, flags)[-1].scale
    for name, value in stepped.items():
        np.testing.assert_array_equal(sunk[name], value, err_msg=name)


def test_model_keeps_inputs_declared_dynamic_so_a_short_last_batch_does_not_recompile():
    """MindSpore's Model carries ``set_inputs`` of the network and loss over to its train network; ours must too,
    or every batch of another size compiles the train cell again."""
    x, x_bad, y = _classification_data_with_inf()
    rows = 60  # batches of 8, the last of 4

    def train(data_x, data_y, manager):
        net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
        loss = _loss_fn()
        net.set_inputs(Tensor(shape=[None, 8], dtype=ms.float32))
        loss.set_inputs(Tensor(shape=[None, 2], dtype=ms.float32), Tensor(shape=[None], dtype=ms.int32))
        model = Model(net, loss, nn.SGD(net.trainable_params(), 0.1), loss_scale_manager=manager)
        recorder = StepRecorder()
        model.train(1, _dataset(data_x, data_y), callbacks=[recorder], dataset_sink_mode=False)
        return snapshot(net), model.train_network, recorder.rows

    scaled, train_network, rows_seen = train(x_bad[:rows], y[:rows], DynamicLossScaleManager(2**8, scale_window=1000))
    keep = np.ones(rows, bool)
    keep[16:24] = False  # the batch holding BAD_ROW
    control, _, _ = train(x[:rows][keep], y[:rows][keep], FixedLossScaleManager(1.0, drop_overflow_update=False))

    assert [overflow for overflow, _ in rows_seen] == [step == 2 for step in range(8)]
    assert [tuple(t.shape) for t in train_network.get_inputs()] == [(-1, 8), (-1,)]
    assert len(train_network.compile_cache) == 1
    for name, value in control.items():
        np.testing.assert_allclose(scaled[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow
def test_model_resumed_from_a_model_checkpoint_file_continues_as_the_uninterrupted_run(tmp_path):
    """MindSpore's ModelCheckpoint callback saves the train network: weights, optimizer state, the scale and the
    counters. Loaded into a new Model's train network, the second epoch replays the uninterrupted one exactly."""
    _, x_bad, y = _classification_data_with_inf()

    def model():
        net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
        return Model(
            net,
            _loss_fn(),
            nn.Momentum(net.trainable_params(), 0.05, 0.9),
            loss_scale_manager=DynamicLossScaleManager(2**10, scale_window=3),
        )

    uninterrupted, recorder = model(), StepRecorder()
    uninterrupted.train(2, _dataset(x_bad, y), callbacks=[recorder], dataset_sink_mode=False)
    first = model()
    first.train(
        1,
        _dataset(x_bad, y),
        dataset_sink_mode=False,
        callbacks=[ModelCheckpoint("run", str(tmp_path), CheckpointConfig(save_checkpoint_steps=8))],
    )
    resumed, resumed_recorder = model(), StepRecorder()
    assert ms.load_param_into_net(resumed.train_network, ms.load_checkpoint(str(tmp_path / "run-1_8.ckpt"))) == ([], [])
    resumed.train(1, _dataset(x_bad, y), callbacks=[resumed_recorder], dataset_sink_mode=False)

    assert resumed_recorder.rows == recorder.rows[8:]
    assert recorder.rows[8:] != recorder.rows[:8]  # the scale of epoch 2 starts where epoch 1 left it
    expected = snapshot(uninterrupted.train_network)
    for name, value in snapshot(resumed.train_network).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_mindspore_model_refuses_dynamic_scaling_on_cpu_but_accepts_our_manager_type():
    net = nn.Dense(8, 2)
    with pytest.raises(ValueError, match="supported on device `CPU`"):
        ms.train.Model(
            net,
            _loss_fn(),
            nn.Momentum(net.trainable_params(), 0.05, 0.9),
            loss_scale_manager=DynamicLossScaleManager(),
        )


class _CpuMindSporeCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's own train cell with a CPU overflow check, to exercise our update cell's contract."""

    def get_overflow_status(self, status, compute_output):
        flags = [ops.logical_not(ops.isfinite(g).all()) for g in compute_output]
        return ops.stack(flags).any()


UPDATE_CELL_MANAGERS = {  # the manager, and its rule's trajectory
    "dynamic": (
        lambda: DynamicLossScaleManager(init_loss_scale=2**6, scale_window=2, hysteresis=2),
        lambda manager, flags: run(manager.policy, flags),
    ),
    "adaptive": (  # MindFormers' cell, whose own train cell has MindSpore's contract
        lambda: AdaptiveLossScaleManager(init_loss_scale=2**6, scale_window=2, max_scale_window=4, min_scale_window=2),
        lambda manager, flags: run_adaptive(manager.rule, flags),
    ),
}


@pytest.mark.parametrize("kind", sorted(UPDATE_CELL_MANAGERS))
def test_our_update_cell_drives_mindspore_own_train_cell(kind):
    make, trajectory = UPDATE_CELL_MANAGERS[kind]
    manager = make()
    net = regression_net()
    step = _CpuMindSporeCell(net, nn.SGD(net.trainable_params(), 0.01), manager.get_update_cell())
    rng = np.random.RandomState(5)
    flags = [False, True, True, False, False, False, True, False] + [False] * 6 + [True] * 3 + [False] * 3
    scales = []
    for flag in flags:
        x = rng.randn(4, 6).astype(np.float32)
        if flag:
            x[0, 0] = np.inf
        _, overflow, _ = step(Tensor(x), Tensor(rng.randn(4, 3).astype(np.float32)))
        assert bool(overflow.asnumpy()) == flag
        scales.append(float(step.scale_sense.asnumpy()))
    assert scales == [state.scale for state in trajectory(manager, flags)]


@pytest.mark.parametrize(
    "level, manager, expected_type",
    [
        ("O0", None, nn.TrainOneStepCell),
        ("O2", None, TrainOneStepWithLossScaleCell),
        ("O3", DynamicLossScaleManager(), TrainOneStepWithLossScaleCell),
        ("O0", FixedLossScaleManager(), TrainOneStepWithLossScaleCell),
    ],
)
def test_build_train_network_levels(level, manager, expected_type):
    net = nn.Dense(8, 2)
    kwargs = {} if manager is None else {"loss_scale_manager": manager}
    train_net = build_train_network(net, nn.SGD(net.trainable_params(), 0.1), _loss_fn(), level=level, **kwargs)
    assert type(train_net) is expected_type
    if level == "O2" and manager is None:  # MindSpore's O2 default manager, as ours (never MindSpore's own cell)
        assert type(train_net.loss_scaling_manager) is DynamicLossScaleUpdateCell
        assert train_net.loss_scaling_manager.policy == DynamicLossScaleManager().policy
    x, y = _classification_data()
    outputs = train_net(Tensor(x[:8]), Tensor(y[:8]))
    loss = outputs[0] if isinstance(outputs, tuple) else outputs
    assert np.isfinite(loss.asnumpy())


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(level="O4"), ValueError, "'level'.*'O4'"),
        (dict(level="O0", boost=True), ValueError, "'boost'"),
        (dict(loss_scale_manager="dynamic"), TypeError, "'loss_scale_manager'.*str"),
    ],
)
def test_build_train_network_bad_arguments(kwargs, error, pattern):
    net = nn.Dense(8, 2)
    with pytest.raises(error, match=pattern):
        build_train_network(net, nn.SGD(net.trainable_params(), 0.1), _loss_fn(), **kwargs)


def test_build_train_network_rejects_a_non_optimizer():
    with pytest.raises(TypeError, match="'optimizer'"):
        build_train_network(nn.Dense(8, 2), "sgd")


def test_model_without_manager_is_mindspore_default():
    net = nn.Dense(8, 2)
    model = Model(net, _loss_fn(), nn.SGD(net.trainable_params(), 0.1))
    assert type(model.train_network) is nn.TrainOneStepCell


@pytest.mark.parametrize("keep_batchnorm_fp32", [None, True, False])
def test_model_o2_without_manager_scales_dynamically_and_passes_keep_batchnorm_fp32(keep_batchnorm_fp32):
    """amp_level="O2" alone trains with our dynamic update cell at MindSpore's defaults; keep_batchnorm_fp32 reaches
    the amp level (None: the level's default, True: the BatchNorm is wrapped to run in float32)."""
    net = nn.SequentialCell(nn.Dense(4, 4), nn.BatchNorm1d(4), nn.Dense(4, 2))
    kwargs = {} if keep_batchnorm_fp32 is None else {"keep_batchnorm_fp32": keep_batchnorm_fp32}
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), amp_level="O2", **kwargs)
    train_net = model.train_network
    assert type(train_net) is TrainOneStepWithLossScaleCell
    assert type(train_net.loss_scaling_manager) is DynamicLossScaleUpdateCell
    assert train_net.loss_scaling_manager.policy == DynamicLossScaleManager().policy
    batch_norm_position = dict(train_net.cells_and_names())["network._backbone.1"]
    assert isinstance(batch_norm_position, nn.BatchNorm1d) == (keep_batchnorm_fp32 is False)


def _functional_run(make_scaler, step_with):
    """MindSpore's functional mixed-precision loop (value_and_grad + jit) on regression batches, an inf in batch 2;
    returns the weights and the scale after each step."""
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.02, 0.9)
    scaler = make_scaler()

    def forward(x, y):
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def train_step(x, y):
        _, grads = grad_fn(x, y)
        return step_with(scaler, optimizer, grads)

    scales = []
    for i, (x, y) in enumerate(regression_batches(8, seed=3)):
        x = with_inf(x) if i == 2 else x
        train_step(Tensor(x), Tensor(y))
        scales.append(float(scaler.scale_value.asnumpy()) if hasattr(scaler, "scale_value") else scaler.get_scale())
    return snapshot(net), scales


def _mindspore_step(scaler, optimizer, grads):
    is_finite = ms.amp.all_finite(grads)
    if is_finite:
        optimizer(scaler.unscale(grads))
    scaler.adjust(is_finite)
    return is_finite


def _lossscale_step(scaler, optimizer, grads):
    skipped = scaler.step(optimizer, grads)
    scaler.update()
    return skipped


def test_mindspore_functional_loop_translates_to_grad_scaler_with_the_mindspore_preset():
    """mindspore.amp.DynamicLossScaler + all_finite (MindSpore's functional recipe) against the translation of
    docs/migration.md: the same scales and weights (a power-of-two factor: MindSpore's scaler divides by the
    factor where the rule multiplies by its reciprocal, which is exact only then)."""
    theirs, their_scales = _functional_run(lambda: ms.amp.DynamicLossScaler(2**10, 2, 3), _mindspore_step)
    ours, our_scales = _functional_run(
        lambda: GradScaler(policy=get_preset("mindspore", init_scale=2**10, growth_factor=2.0, growth_interval=3)),
        _lossscale_step,
    )
    assert our_scales == their_scales == [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 1024.0, 1024.0]
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_a_loss_scale_optimizer_given_to_model_is_refused_with_the_translation_that_trains_alike():
    """Keras' model.compile(optimizer=LossScaleOptimizer(opt)): Keras' fit scales for the wrapper, MindSpore's Model
    through loss_scale_manager. Refused with the translation (not MindSpore's "The type of 'optimizer' should be one
    of ..."), which trains as the wrapper does in a tf.keras-style step: same skips and scales."""
    x, x_bad, y = _classification_data_with_inf()
    net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    wrapper = LossScaleOptimizer(
        nn.Momentum(net.trainable_params(), 0.05, 0.9), initial_scale=2**10, dynamic_growth_steps=3
    )
    translation = (
        "optimizer=opt.inner_optimizer, loss_scale_manager=DynamicLossScaleManager.from_policy("
        "get_preset('tf_keras', init_scale=1024.0, growth_interval=3))"
    )
    with pytest.raises(TypeError, match=re.escape(translation)):
        Model(net, _loss_fn(), wrapper)
    with pytest.raises(TypeError, match="'optimizer' is a LossScaleOptimizer"):
        build_train_network(net, wrapper, _loss_fn(), level="O2")
    with pytest.raises(TypeError, match=re.escape("loss_scale_manager=FixedLossScaleManager(64.0)")):
        Model(
            net, _loss_fn(), LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), dynamic=False, initial_scale=64.0)
        )
    with pytest.raises(TypeError, match=re.escape(f"DynamicLossScaleManager.from_policy({get_preset('keras')!r})")):
        Model(net, _loss_fn(), LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), policy="keras"))
    adaptive = get_preset("mindformers")
    with pytest.raises(TypeError, match=re.escape(f"DynamicLossScaleManager.from_policy({adaptive!r})")):
        Model(net, _loss_fn(), LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), policy=adaptive))

    manager = DynamicLossScaleManager.from_policy(get_preset("tf_keras", init_scale=1024.0, growth_interval=3))
    model = Model(net, _loss_fn(), wrapper.inner_optimizer, loss_scale_manager=manager)
    recorder = StepRecorder()
    model.train(1, _dataset(x_bad, y), callbacks=[recorder], dataset_sink_mode=False)

    keras_net = nn.Dense(8, 2, weight_init="zeros", bias_init="zeros")
    keras_opt = LossScaleOptimizer(
        nn.Momentum(keras_net.trainable_params(), 0.05, 0.9), initial_scale=2**10, dynamic_growth_steps=3
    )
    step = ms.jit(keras_step(nn.WithLossCell(keras_net, _loss_fn()), keras_opt))
    rows = []
    for start in range(0, 64, 8):
        skipped = step(Tensor(x_bad[start : start + 8]), Tensor(y[start : start + 8]))
        rows.append((bool(skipped.asnumpy()), float(keras_opt.loss_scale.asnumpy())))
    assert recorder.rows == rows and [skipped for skipped, _ in rows] == [i == 2 for i in range(8)]
    assert [scale for _, scale in rows] == [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 1024.0, 1024.0]
    for ours, keras in zip(net.trainable_params(), keras_net.trainable_params()):
        np.testing.assert_allclose(ours.asnumpy(), keras.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=ours.name)
