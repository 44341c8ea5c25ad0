"""TrainOneStepWithLossScaleCell on CPU: overflow decisions, skip semantics, unscaling, optimizer checks."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, load_checkpoint, load_param_into_net, mint, nn, save_checkpoint
from mindspore.common import dtype as mstype
from nets import (
    Fp16Linear,
    Fp16SquareLoss,
    GradCapture,
    LossPlusInput,
    changed_since,
    regression_batches,
    regression_net,
    snapshot,
    training_state,
    with_inf,
)

from lossscale import (
    DynamicLossScaleManager,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    LossScaleOptimizer,
    Model,
    TrainOneStepWithLossScaleCell,
    build_train_network,
)
from lossscale.core.policy import run


def _tensors(batch):
    return tuple(Tensor(a) for a in batch)


@pytest.fixture(scope="module")
def fp16_square_step():
    net = Fp16SquareLoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.0)
    return TrainOneStepWithLossScaleCell(net, opt, FixedLossScaleUpdateCell(1.0))


def test_fp16_network_overflow_flags(fp16_square_step):
    # (x*w)^2 in float16: 40000^2 and +-inf overflow, 0 and 10 do not.
    inputs = [-np.inf, 0.0, 40000.0, 10.0, np.inf]
    flags = [bool(fp16_square_step(Tensor(np.array([v], np.float16)))[1].asnumpy()) for v in inputs]
    assert flags == [True, False, True, False, True]


def test_nan_gradient_is_an_overflow(fp16_square_step):
    assert bool(fp16_square_step(Tensor(np.array([np.nan], np.float16)))[1].asnumpy())


def test_non_finite_loss_with_finite_gradients_is_an_overflow():
    net = LossPlusInput()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.5)
    step = TrainOneStepWithLossScaleCell(net, opt, FixedLossScaleUpdateCell(8.0))
    y = Tensor(np.ones(3, np.float32))
    before = training_state(step)
    assert bool(step(y, Tensor(np.float32(np.inf)))[1].asnumpy())
    assert changed_since(before, step) == []
    assert step.overflow_counters() == {
        "steps": 1,
        "skipped_steps": 1,
        "consecutive_overflows": 1,
        "last_overflow_step": 1,
    }
    assert not bool(step(y, Tensor(np.float32(1.0)))[1].asnumpy())
    assert not np.array_equal(before["w"], net.w.asnumpy())


def _control_and_scaled(optimizer_factory, scale_sense_factory, batches, inject_at=None):
    """Train a control (TrainOneStepCell, batch ``inject_at`` left out) and a scaled run on the same data."""
    control_net, scaled_net = regression_net(), regression_net()
    control = nn.TrainOneStepCell(control_net, optimizer_factory(control_net))
    scaled = TrainOneStepWithLossScaleCell(scaled_net, optimizer_factory(scaled_net), scale_sense_factory())
    flags = []
    for i, batch in enumerate(batches):
        if i == inject_at:
            x, y = batch
            x = with_inf(x)
            before = training_state(scaled)
            flags.append(bool(scaled(Tensor(x), Tensor(y))[1].asnumpy()))
            assert changed_since(before, scaled) == []
            continue
        control(*_tensors(batch))
        flags.append(bool(scaled(*_tensors(batch))[1].asnumpy()))
    return control, scaled, flags


@pytest.mark.parametrize(
    "optimizer_factory",
    [
        lambda net: nn.Adam(net.trainable_params(), learning_rate=0.01),
        lambda net: nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9),
        # MindSpore's PyTorch-style optimizers (not nn.Optimizer), which MindSpore's own train cells accept
        lambda net: ms.experimental.optim.Adam(net.trainable_params(), lr=0.01),
        lambda net: mint.optim.SGD(net.trainable_params(), lr=0.05, momentum=0.9),
        # state unlike Adam's: the previous gradient's sign and per-element step sizes; an LR and an average that
        # follow global_step (which a skipped step must not advance); accumulated squares; FTRL's linear term
        lambda net: nn.Rprop(net.trainable_params(), learning_rate=0.01),
        lambda net: nn.ASGD(net.trainable_params(), learning_rate=0.05, t0=2.0),
        lambda net: nn.Adadelta(net.trainable_params(), learning_rate=1.0),
        lambda net: nn.FTRL(net.trainable_params(), learning_rate=0.1),
        lambda net: nn.RMSProp(net.trainable_params(), learning_rate=0.01, centered=True),
    ],
    ids=["adam", "momentum", "experimental_adam", "mint_sgd", "rprop", "asgd", "adadelta", "ftrl", "rmsprop_centered"],
)
@pytest.mark.slow
def test_differential_control_vs_scaled_with_injected_inf(optimizer_factory):
    manager = DynamicLossScaleManager(init_loss_scale=2**16, scale_factor=2, scale_window=3)
    batches = regression_batches(12)
    control, scaled, flags = _control_and_scaled(optimizer_factory, manager.get_update_cell, batches, inject_at=5)
    assert flags == [i == 5 for i in range(12)]
    expected_scale = run(manager.policy, flags)[-1].scale
    assert manager.get_loss_scale() == expected_scale
    control_params, scaled_params = snapshot(control), snapshot(scaled)
    for name, value in control_params.items():
        np.testing.assert_allclose(scaled_params[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_skipped_step_leaves_optimizer_state_bit_identical():
    net = regression_net()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=100)
    step = TrainOneStepWithLossScaleCell(net, opt, manager.get_update_cell())
    x, y = regression_batches(1)[0]
    step(Tensor(x), Tensor(y))
    before = training_state(step)
    x[1, 2] = np.nan
    loss, overflow, scale = step(Tensor(x), Tensor(y))
    assert bool(overflow.asnumpy()) and float(scale.asnumpy()) == 512.0
    assert changed_since(before, step) == []
    assert before["global_step"].item() == 1 and step.get_loss_scale() == 512.0  # still the first step's


@pytest.fixture
def pynative_mode():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


def _train_with_injected_inf(batches, inject_at):
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    step = TrainOneStepWithLossScaleCell(
        net, nn.Adam(net.trainable_params(), learning_rate=0.01), manager.get_update_cell(), clip_global_norm=1.0
    )
    flags, scales = [], []
    for index, (x, y) in enumerate(batches):
        if index == inject_at:
            x = with_inf(x)
        _, overflow, scale = step(Tensor(x), Tensor(y))
        flags.append(bool(overflow.asnumpy()))
        scales.append(float(scale.asnumpy()))
    return {
        "flags": flags,
        "scales": scales,
        "counters": step.overflow_counters(),
        "state": snapshot(step),
        "policy": manager.policy,
    }


@pytest.mark.slow
def test_pynative_mode_gives_the_same_steps_as_graph_mode(pynative_mode):
    """MindSpore's default mode is PyNative: the cell runs eagerly there (one host sync per step at the `if`)."""
    batches = regression_batches(5)
    eager = _train_with_injected_inf(batches, inject_at=2)
    ms.set_context(mode=ms.GRAPH_MODE)
    graph = _train_with_injected_inf(batches, inject_at=2)
    assert eager["flags"] == graph["flags"] == [False, False, True, False, False]
    assert eager["scales"] == graph["scales"] == [state.scale for state in run(graph["policy"], graph["flags"])]
    assert eager["counters"] == graph["counters"]
    for name, value in graph["state"].items():
        np.testing.assert_allclose(eager["state"][name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_float16_gradients_unscale_exactly_at_scale_2_pow_25():
    net = Fp16Linear()
    opt = GradCapture(net.trainable_params())
    step = TrainOneStepWithLossScaleCell(net, opt, Tensor(2.0**25, mstype.float32))
    x = np.array([1, 3, -5, 100], np.float16)
    assert not bool(step(Tensor(x))[1].asnumpy())
    captured = opt.captured[0].asnumpy()
    assert captured.dtype == np.float16
    np.testing.assert_array_equal(captured, (x.astype(np.float32) * 2.0**-20).astype(np.float16))
    assert np.all(captured != 0)
    # MindSpore's cell multiplies by reciprocal(scale) cast to float16, which is 0 here:
    assert np.float16(np.float32(1) / np.float32(2.0**25)) == 0


@pytest.mark.slow
def test_returns_loss_overflow_and_updated_scale():
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=4.0, scale_window=1)
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.01), manager.get_update_cell())
    batch = _tensors(regression_batches(1)[0])
    loss, overflow, scale = step(*batch)
    assert loss.shape == () and overflow.dtype == mstype.bool_
    assert float(scale.asnumpy()) == 8.0 == step.get_loss_scale() == manager.get_loss_scale()
    control = float(regression_net()(*batch).asnumpy())
    assert float(loss.asnumpy()) == pytest.approx(control, rel=1e-6)


OPTIONS_FIXED_WHEN_BUILT = {
    "drop_overflow_update": False,
    "optimizer_unscales": True,
    "overflow_check": "isfinite",
    "accumulation_steps": 4,
    "extra_outputs": True,
    "lr_per_micro_batch": True,
    "clip_global_norm": 1.0,
    "overflow_policy": "raise",
    "max_consecutive_overflows": 3,
    "debug_overflow": True,
}


def test_the_options_are_fixed_when_the_cell_is_built():
    """The compiled step would not see a new value: `step.accumulation_steps = 4` or `step.extra_outputs = True`
    on a built cell was accepted and read back, while the step stayed as built. Every option is read-only now."""
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.01), Tensor(np.float32(8.0)))
    built = {name: getattr(step, name) for name in OPTIONS_FIXED_WHEN_BUILT}
    for name, value in OPTIONS_FIXED_WHEN_BUILT.items():
        with pytest.raises(
            AttributeError,
            match=f"TrainOneStepWithLossScaleCell.{name} cannot be assigned: the "
            f"compiled step keeps the value the cell was built with",
        ):
            setattr(step, name, value)
    assert {name: getattr(step, name) for name in OPTIONS_FIXED_WHEN_BUILT} == built
    assert len(step(*_tensors(regression_batches(1)[0]))) == 3 and int(step.steps.asnumpy()) == 1


@pytest.mark.parametrize("scale_sense", ["update_cell", "tensor"])
def test_the_update_cell_can_be_assigned_again_but_not_replaced(scale_sense):
    """``self.loss_scaling_manager = scale_update_cell`` after ``super().__init__`` (model-zoo subclasses; was
    nn.Cell's KeyError "the loss_scaling_manager child cell already exists") keeps the cell; another update cell,
    or None where there is one, is an AttributeError that changes nothing (the core's scale and the compiled
    step are bound to the cell given when building); without one (a Tensor scale_sense), None is accepted."""
    net = regression_net()
    held = (
        DynamicLossScaleManager(init_loss_scale=8.0, scale_window=1).get_update_cell()
        if scale_sense == "update_cell"
        else None
    )
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.01), held if held is not None else Tensor(np.float32(8.0))
    )
    step.loss_scaling_manager = held
    assert step.loss_scaling_manager is held
    others = [FixedLossScaleManager(8.0).get_update_cell()] + ([None] if held is not None else [])
    for other in others:
        with pytest.raises(
            AttributeError,
            match="TrainOneStepWithLossScaleCell.loss_scaling_manager cannot be "
            "replaced: this cell holds .*Assigning the same update cell again",
        ):
            step.loss_scaling_manager = other
    assert step.loss_scaling_manager is held and "loss_scaling_manager" not in step._cells
    step(*_tensors(regression_batches(1)[0]))
    assert step.get_loss_scale() == (16.0 if held is not None else 8.0)  # a clean step grows with scale_window=1


def test_tensor_scale_sense_and_set_sense_scale():
    net = Fp16Linear()
    opt = GradCapture(net.trainable_params())
    step = TrainOneStepWithLossScaleCell(net, opt, Tensor([1024.0], mstype.float32))
    x = Tensor(np.array([1, 2, 4, 8], np.float16))
    step(x)
    first = opt.captured[0].asnumpy().copy()
    step.set_sense_scale(Tensor([4096.0], mstype.float32))
    assert step.get_loss_scale() == 4096.0
    step(x)
    np.testing.assert_array_equal(opt.captured[0].asnumpy(), first)  # same true gradients at another scale
    with pytest.raises(ValueError, match="shape"):
        step.set_sense_scale(Tensor(2.0, mstype.float32))
    with pytest.raises(ValueError, match="finite"):
        step.set_sense_scale(Tensor([np.inf], mstype.float32))
    with pytest.raises(TypeError, match="'sens'"):
        step.set_sense_scale(2.0)


@pytest.mark.parametrize(
    "scale_sense, error, pattern",
    [
        (Tensor(np.ones((2,), np.float32)), ValueError, r"shape \(\) or \(1,\)"),
        (Tensor(np.float32(0.0)), ValueError, "finite float32 number > 0"),
        (Tensor(np.float32(np.nan)), ValueError, "finite float32 number > 0"),
        (Tensor(np.float32(1e-45)), ValueError, "reciprocal is finite"),
        (3.0, TypeError, "'scale_sense'"),
        (nn.ReLU(), TypeError, "get_loss_scale"),
    ],
)
def test_bad_scale_sense(scale_sense, error, pattern):
    net = regression_net()
    with pytest.raises(error, match=pattern):
        TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), scale_sense)


def test_optimizer_must_hold_its_parameters_and_pytorch_style_ones_refuse_nn_optimizer_options():
    net = regression_net()
    with pytest.raises(
        TypeError,
        match=r"'optimizer' must be a mindspore.nn.Optimizer, or an optimizer Cell holding "
        r"its Parameters in 'parameters' .* but got ReLU\.",
    ):
        TrainOneStepWithLossScaleCell(net, nn.ReLU(), Tensor(1.0))
    # a Keras wrapper holds 'parameters' too, and with a fixed scale of 1 its 'loss_scale' passed the loss-scale check
    wrapper = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), dynamic=False, initial_scale=1.0)
    with pytest.raises(TypeError, match=r"'optimizer' is a LossScaleOptimizer, .* give it the inner optimizer"):
        TrainOneStepWithLossScaleCell(net, wrapper, Tensor(1.0))
    adam = ms.experimental.optim.Adam(net.trainable_params(), lr=0.01)
    for option in ("extra_outputs", "lr_per_micro_batch"):
        with pytest.raises(
            ValueError,
            match=rf"'{option}' needs a mindspore.nn.Optimizer \(its get_lr\(\) and "
            r"global_step\), but the optimizer is "
            r"mindspore\.experimental\.optim\.adam\.Adam, ",
        ):
            TrainOneStepWithLossScaleCell(net, adam, Tensor(1.0), **{option: True})


def test_bad_overflow_check_and_drop_flag():
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match="'overflow_check'.*'cuda'"):
        TrainOneStepWithLossScaleCell(net, opt, Tensor(1.0), overflow_check="cuda")
    with pytest.raises(TypeError, match="'drop_overflow_update'"):
        TrainOneStepWithLossScaleCell(net, opt, Tensor(1.0), drop_overflow_update=1)


class _WithEmbedding(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lookup = nn.EmbeddingLookup(20, 4, target="CPU", sparse=True)

    def construct(self, ids):
        return self.lookup(ids).mean()


def _amp_o1_model(net):
    return Model(
        net,
        nn.MSELoss(),
        nn.SGD(net.trainable_params(), 0.1),
        amp_level="O1",
        loss_scale_manager=DynamicLossScaleManager(),
    )


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda net: TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(1.0)), "lookup"),
        # MindSpore's amp O1 rewrite makes the lookup a generated class, from the second network on no EmbeddingLookup
        (_amp_o1_model, "_backbone.lookup"),
        (_amp_o1_model, "_backbone.lookup"),
    ],
    ids=["train cell", "O1", "O1 again"],
)
def test_sparse_gradient_network_is_refused_on_cpu(build, name, tmp_path, monkeypatch):
    """MindSpore 2.10 segfaults on CPU when RowTensor gradients meet the loss-scale state updates."""
    monkeypatch.chdir(tmp_path)  # where amp O1 writes the rewritten source
    with pytest.raises(ValueError, match=rf"sparse \(RowTensor\) gradients: {name} .*nn.Embedding"):
        build(_WithEmbedding())


@pytest.mark.parametrize("scale", [1.3, 2.0**24 + 1, 1024.0])
def test_the_same_python_float_given_to_the_manager_and_the_optimizer_is_accepted(scale):
    """MindSpore's FixedLossScaleManager(S, False) recipe with a scale float32 cannot hold exactly: the manager and
    the optimizer hold the same float32 value, so the optimizer divides by the scale the train cell applies."""
    net = regression_net()
    step = build_train_network(
        net,
        nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=scale),
        loss_scale_manager=FixedLossScaleManager(scale, drop_overflow_update=False),
    )
    assert step.optimizer_unscales and step.get_loss_scale() == float(np.float32(scale))
    cell = TrainOneStepWithLossScaleCell(
        net,
        nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=scale),
        Tensor(scale, mstype.float32),
        drop_overflow_update=False,
    )
    assert cell.optimizer_unscales


def test_optimizer_loss_scale_that_disagrees_is_rejected():
    net = regression_net()
    dynamic = DynamicLossScaleManager(init_loss_scale=1024)
    with pytest.raises(ValueError, match=r"'optimizer.loss_scale' is 1024.0 but the loss scale is dynamic"):
        TrainOneStepWithLossScaleCell(
            net, nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=1024.0), dynamic.get_update_cell()
        )
    with pytest.raises(ValueError, match=r"'optimizer.loss_scale' is 512.0 but the loss scale is 1024.0"):
        build_train_network(
            net,
            nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=512.0),
            loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=False),
        )


def test_a_scale_the_optimizer_divides_by_loads_its_own_state_and_refuses_another():
    """With the optimizer's loss_scale equal to a fixed Tensor scale, the scale is a graph constant: a state holding
    that scale loads (a round trip works), another is refused and changes nothing."""
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=1024.0), Tensor(np.float32(1024.0))
    )
    state = cell.state_dict()
    cell.load_state_dict(state)
    with pytest.raises(ValueError, match=r"must equal the fixed loss scale 1024.0, but got 512.0"):
        cell.load_state_dict(dict(state, loss_scale=512.0))
    assert cell.state_dict() == state


@pytest.mark.parametrize(
    "optimizer_factory, optimizer_unscales",
    [
        (lambda net, s: nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.01), False),
        (lambda net, s: nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=s), True),
    ],
    ids=["adamweightdecay_without_loss_scale", "momentum_with_loss_scale"],
)
@pytest.mark.slow
def test_fixed_scale_without_dropping_trains_like_the_control(optimizer_factory, optimizer_unscales):
    scale = 1024.0
    scaled_net, control_net = regression_net(), regression_net()
    scaled = build_train_network(
        scaled_net,
        optimizer_factory(scaled_net, scale),
        loss_scale_manager=FixedLossScaleManager(scale, drop_overflow_update=False),
    )
    control = nn.TrainOneStepCell(control_net, optimizer_factory(control_net, 1.0))
    assert scaled.optimizer_unscales is optimizer_unscales
    for batch in regression_batches(8):
        control(*_tensors(batch))
        scaled(*_tensors(batch))
    for name, value in snapshot(control).items():
        np.testing.assert_allclose(snapshot(scaled)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    if optimizer_unscales:
        with pytest.raises(ValueError, match="cannot change the scale"):
            scaled.set_sense_scale(Tensor(8.0, mstype.float32))


def test_fixed_scale_without_dropping_applies_overflowing_steps():
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.01)
    step = build_train_network(net, opt, loss_scale_manager=FixedLossScaleManager(64.0, drop_overflow_update=False))
    x, y = regression_batches(1)[0]
    _, overflow, _ = step(Tensor(with_inf(x)), Tensor(y))
    assert bool(overflow.asnumpy())
    assert not np.isfinite(net.trainable_params()[0].asnumpy()).all()  # MindSpore's documented semantics


def _train_with_overflows(step, batches, inject):
    for i, (x, y) in enumerate(batches):
        if i in inject:
            x = with_inf(x)
        step(Tensor(x), Tensor(y))


def _fresh_step(hysteresis=2):
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=3, hysteresis=hysteresis)
    step = TrainOneStepWithLossScaleCell(net, nn.Adam(net.trainable_params(), 0.01), manager.get_update_cell())
    return step, manager


@pytest.mark.slow
def test_checkpoint_round_trip_resumes_exactly(tmp_path):
    batches = regression_batches(14)
    inject = {2, 3, 9}
    uninterrupted, _ = _fresh_step()
    _train_with_overflows(uninterrupted, batches, inject)

    first, first_manager = _fresh_step()
    _train_with_overflows(first, batches[:7], inject)
    path = str(tmp_path / "step.ckpt")
    save_checkpoint(first, path)
    saved_state = first_manager.state_dict()

    resumed, resumed_manager = _fresh_step()
    not_loaded = load_param_into_net(resumed, load_checkpoint(path))
    assert not [name for name in not_loaded[0] if not name.startswith("captured")]
    assert resumed_manager.state_dict() == saved_state
    flags_so_far = [i in inject for i in range(7)]
    expected_state = run(first_manager.policy, flags_so_far)[-1]
    assert saved_state == {
        "loss_scale": expected_state.scale,
        "good_steps": expected_state.good_steps,
        "hysteresis_left": expected_state.hysteresis_left,
    }
    _train_with_overflows(resumed, batches[7:], {i - 7 for i in inject if i >= 7})
    expected, got = snapshot(uninterrupted), snapshot(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_a_train_cell_whose_update_cell_another_adopted_is_refused():
    """Two train cells sharing one update cell shared its counters: the second's scale grew on the first's clean
    steps and the first's never grew (a GAN built with one update cell). The cell that lost its update cell is
    refused at its next call, unchanged; the one that adopted it trains on from its state (re-wrapping)."""
    update_cell = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2).get_update_cell()
    nets = [regression_net(seed=s) for s in range(2)]
    first, second = (
        TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.01), update_cell) for net in nets
    )
    x, y = (Tensor(a) for a in regression_batches(1)[0])
    before = training_state(first)
    with pytest.raises(RuntimeError, match="adopted by another train cell"):
        first(x, y)
    assert changed_since(before, first) == []
    assert [float(second(x, y)[2].asnumpy()) for _ in range(3)] == [2**10, 2**11, 2**11]
    fixed = FixedLossScaleUpdateCell(2.0**10)  # holds no counters: two cells may share it
    first, second = (TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.01), fixed) for net in nets)
    assert [float(cell(x, y)[2].asnumpy()) for cell in (first, second, first)] == [2**10] * 3
