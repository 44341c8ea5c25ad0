"""Train cell, Model and the core: no silent failure. Skip decisions where features meet (accumulation,
zero-size parameters, bfloat16 and float64), extra outputs, parallel modes, Model and build_train_network, and a
loss scaled outside the differentiated function."""

import contextlib
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, context, nn, ops
from mindspore.common import dtype as mstype
from nets import Float64Regression, PlainSGD, changed_since, jit_if, regression_net, tiered, training_state
from train_cell_harness import BATCHES, dynamic_cell, run_cell, same_weights, save_cell_checkpoint

from lossscale import (
    DynamicLossScaleManager,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    GradScaler,
    LossScaleOptimizer,
    LossScalePolicy,
    LossScaler,
    Model,
    PersistentOverflowError,
    TrainOneStepWithLossScaleCell,
    build_train_network,
)


class HugeGradient(nn.Cell):
    """``loss = w * x``: the gradient is ``x``, 3e38 (finite in float32); two of them sum to inf."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(1, np.float32)), name="w")

    def construct(self, x):
        return ops.reduce_sum(self.w * x)


def test_finite_micro_batch_gradients_whose_sum_is_inf_skip_the_window():
    net = HugeGradient()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 1e-40), Tensor(np.float32(1.0)), accumulation_steps=2
    )
    x = Tensor(np.array([3e38], np.float32))
    first = cell(x)
    second = cell(x)
    assert not bool(first[1].asnumpy()) and bool(second[1].asnumpy())
    assert net.w.asnumpy().tolist() == [1.0] and cell.overflow_counters()["skipped_steps"] == 1


def test_an_overridden_get_overflow_status_is_honoured_under_accumulation():
    class AlwaysOverflow(TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status, compute_output):
            return Tensor(True)

    net = regression_net()
    cell = AlwaysOverflow(net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(8.0)), accumulation_steps=2)
    before = training_state(net)
    flags, _ = run_cell(cell, BATCHES[:4])
    assert flags == [False, True, False, True] and cell.overflow_counters()["skipped_steps"] == 2
    assert changed_since(before, net) == []


class ZeroSizeParameter(nn.Cell):
    """A network with a trainable Parameter of zero elements (an empty prefix), as some adapters have."""

    def __init__(self):
        super().__init__()
        self.body = nn.Dense(6, 3)
        self.empty = Parameter(Tensor(np.zeros((0, 3), np.float32)), name="empty")
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        logits = ops.concat((self.empty, self.body(x)), 0)
        return self.loss(logits, y)


@pytest.mark.parametrize("clip", [None, 10.0], ids=["check", "clipping_norm"])
def test_a_zero_size_parameter_does_not_fake_overflows(clip):
    """MindSpore's CPU ReduceSum of an empty tensor returns uninitialised memory: clean steps were flagged and
    the scale fell forever (in the overflow check, and in the clipping norm that decides instead)."""
    net = ZeroSizeParameter()
    cell = TrainOneStepWithLossScaleCell(
        net,
        PlainSGD(0.01, net.trainable_params()),
        DynamicLossScaleManager(2**10, scale_window=2).get_update_cell(),
        clip_global_norm=clip,
    )
    flags, scales = run_cell(cell, BATCHES * 2)
    assert flags == [False] * 16 and scales[-1] == 2.0**18


class Bfloat16Loss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.Dense(6, 3)
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return ops.cast(self.loss(self.body(x), y), mstype.bfloat16)


def test_a_bfloat16_loss_trains_like_mindsporess_plain_cell():
    ms.set_seed(1)
    ours, theirs = Bfloat16Loss(), Bfloat16Loss()
    ms.load_param_into_net(theirs, {p.name: Parameter(p.data.copy(), name=p.name) for p in ours.get_parameters()})
    cell = TrainOneStepWithLossScaleCell(ours, nn.SGD(ours.trainable_params(), 0.1), Tensor(np.float32(1.0)))
    plain = nn.TrainOneStepCell(theirs, nn.SGD(theirs.trainable_params(), 0.1))
    for x, y in BATCHES[:3]:
        assert not bool(cell(Tensor(x), Tensor(y))[1].asnumpy())
        plain(Tensor(x), Tensor(y))
    same_weights(ours, theirs)


def test_forensics_name_a_non_finite_bfloat16_loss():
    """The forensics test the loss in float32: MindSpore's CPU isfinite has no bfloat16 kernel (testing the
    bfloat16 loss itself failed to compile: "Kernel select failed")."""
    net = Bfloat16Loss()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(1.0)), debug_overflow=True
    )
    x, y = BATCHES[0]
    x = x.copy()
    x[0, 0] = np.inf
    assert bool(cell(Tensor(x), Tensor(y))[1].asnumpy())
    assert cell.overflow_reports == [{"step": 1, "loss_nonfinite": True, "parameters": ["body.weight", "body.bias"]}]


def _float64_steps(front_end, net, learning_rate):
    """A step function ``(x, y) -> None`` training ``net`` with ``front_end`` at a fixed scale of 1024."""
    optimizer = PlainSGD(learning_rate, net.trainable_params())
    if front_end == "train cell":
        return TrainOneStepWithLossScaleCell(net, optimizer, Tensor(np.float32(1024.0)))
    if front_end == "LossScaleOptimizer":
        wrapper = LossScaleOptimizer(optimizer, dynamic=False, initial_scale=1024.0)

        def minimize(x, y):
            def loss():
                return net(x, y)

            wrapper.minimize(loss)

        return minimize
    scaler = GradScaler(init_scale=1024.0)

    def forward(x, y):
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        scaler.step(optimizer, grad_fn(x, y)[1])
        scaler.update()

    return step


@pytest.mark.parametrize(
    "loss, dtype, expected",
    [
        (np.float16(60000.0), mstype.float32, 60000.0 * 2.0**16),  # beyond float16's range once scaled
        (ms.Tensor(1.5, mstype.bfloat16), mstype.float32, 1.5 * 2.0**16),
        (np.float32(1.5), mstype.float32, 1.5 * 2.0**16),
        (np.float64(1e300), mstype.float64, 1e300 * 2.0**16),  # beyond float32's range once scaled
    ],
    ids=["float16", "bfloat16", "float32", "float64"],
)
def test_the_scaled_loss_is_promoted_to_at_least_float32(loss, dtype, expected, compiled):
    """What scale() returns for each loss dtype: at least float32, so a scaled float16 loss does not overflow, and
    float64 for a float64 loss. (MindSpore's own type promotion gives the same on 2.7.1 and 2.10, measured: the
    explicit casts only make it independent of that.)"""
    core = LossScaler(2.0**16, name=f"promoted_{compiled}")
    loss = loss if isinstance(loss, Tensor) else Tensor(loss)
    scaled = jit_if(compiled, core.scale)(loss)
    assert scaled.dtype == dtype and float(scaled.astype(mstype.float64).asnumpy()) == expected


@pytest.mark.parametrize(
    "losses, finite",
    [
        ((Tensor(1.0), Tensor(2.0)), True),
        ((Tensor(np.nan), Tensor(2.0)), False),
        ([Tensor(1.0), (Tensor(2.0), Tensor(-np.inf))], False),
        ([(Tensor(np.inf),), Tensor(2.0)], False),
    ],
    ids=["finite", "first", "nested_last", "nested_first"],
)
def test_a_non_finite_loss_anywhere_in_a_nested_tuple_counts(losses, finite):
    """loss_flag over several losses sums every one's term (keeping only the last passed the suite)."""
    flag = LossScaler(8.0, name="nested_loss_flag").loss_flag(losses)
    assert np.isfinite(float(flag.asnumpy())) == finite


@pytest.mark.parametrize(
    "rule, mutable_rule, switch, expected",
    [
        (8.0, False, None, False),
        (Tensor(np.float32(8.0)), False, None, False),
        (FixedLossScaleUpdateCell(8.0), False, None, False),
        (nn.FixedLossScaleUpdateCell(8.0), False, None, False),
        (nn.DynamicLossScaleUpdateCell(8.0, 2, 3), False, None, True),
        (LossScalePolicy(init_scale=8.0), False, None, True),
        (LossScalePolicy(init_scale=8.0), True, None, True),
        (LossScalePolicy(init_scale=8.0), True, False, False),
        (LossScalePolicy(init_scale=8.0), True, True, True),
    ],
    ids=[
        "number",
        "tensor",
        "fixed_cell",
        "mindspore_fixed_cell",
        "mindspore_dynamic_cell",
        "policy",
        "mutable",
        "switched_fixed",
        "switched_back",
    ],
)
def test_the_core_reports_whether_its_scale_is_dynamic(rule, mutable_rule, switch, expected):
    """The host property ``dynamic`` and the graph read ``dynamic_flag()`` agree for every kind of rule (a
    dynamic_flag that always read the mutable rule's Parameter survived the other tests: only the GradScaler, whose
    rule is always mutable, reads it)."""
    core = LossScaler(
        rule, name=f"dynamic_flag_{type(rule).__name__}_{mutable_rule}_{switch}", mutable_rule=mutable_rule
    )
    if switch is not None:
        core.set_rule(dynamic=False)
        if switch:
            core.set_rule(dynamic=True)
    assert core.dynamic == expected
    assert bool(core.dynamic_flag().asnumpy()) == expected


@pytest.mark.parametrize("rule", [8.0, LossScalePolicy(init_scale=8.0)], ids=["fixed", "dynamic"])
def test_set_rule_needs_a_mutable_rule(rule):
    """A core built without mutable_rule has no Parameters for a rule change: set_rule() says so and changes
    nothing (without the check: an AttributeError from the update cell, or None's)."""
    core = LossScaler(rule, name=f"immutable_rule_{type(rule).__name__}")
    dynamic, state = core.dynamic, core.state_dict()
    for change in (dict(dynamic=not dynamic), dict(rule=LossScalePolicy(init_scale=4.0)), dict(state=state)):
        with pytest.raises(RuntimeError, match=r"set_rule\(\) needs a LossScaler built with mutable_rule=True"):
            core.set_rule(**change)
    assert (core.dynamic, core.state_dict()) == (dynamic, state)


@pytest.mark.parametrize("front_end", ["train cell", "GradScaler", "LossScaleOptimizer"])
@pytest.mark.parametrize("magnitude", [1.0, 1e20], ids=["precision", "range beyond float32"])
@pytest.mark.slow
def test_float64_gradients_keep_their_precision_and_range(front_end, magnitude):
    """Unscaling went through float32: float64 gradients lost their precision (weights 8e-9 off the control),
    and finite float64 gradients beyond float32's range became inf, so every step was skipped."""
    rng = np.random.RandomState(5)
    batches = [(Tensor(rng.randn(4, 6) * magnitude), Tensor(rng.randn(4, 3))) for _ in range(3)]
    ours, theirs = Float64Regression(), Float64Regression()
    step = _float64_steps(front_end, ours, 1e-3)
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    initial = theirs.w.asnumpy().copy()
    for x, y in batches:
        step(x, y)
        control(x, y)
    assert np.isfinite(theirs.w.asnumpy()).all() and not np.array_equal(theirs.w.asnumpy(), initial)
    # Scaling by 1024 and unscaling by 1/1024 are exact in float64: the same weights, bit for bit.
    same_weights(ours, theirs)


def test_float64_gradients_keep_their_precision_through_clipping():
    """Clipping multiplied through float32 (even by a factor of 1), rounding float64 gradients to float32
    precision."""
    rng = np.random.RandomState(5)
    ours, theirs = Float64Regression(), Float64Regression()
    step = TrainOneStepWithLossScaleCell(
        ours, PlainSGD(1e-3, ours.trainable_params()), Tensor(np.float32(1024.0)), clip_global_norm=1e30
    )
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    for _ in range(3):
        x, y = Tensor(rng.randn(4, 6)), Tensor(rng.randn(4, 3))
        assert not bool(step(x, y)[1].asnumpy())
        control(x, y)
    same_weights(ours, theirs)


@pytest.mark.parametrize("steps", [2, 3])
def test_float64_gradients_keep_their_precision_through_accumulation(steps):
    """float32 accumulators rounded float64 gradients to float32 precision. The control trains on the window's
    micro-batches at once: the same mean gradient up to float64 rounding. With 3 micro-batches the mean must divide
    in float64 too (float32's 1/3 is 1e-8 off: weights 1e-10 off the control, measured)."""
    rng = np.random.RandomState(5)
    ours, theirs = Float64Regression(), Float64Regression()
    step = TrainOneStepWithLossScaleCell(
        ours, PlainSGD(1e-3, ours.trainable_params()), Tensor(np.float32(1024.0)), accumulation_steps=steps
    )
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    assert step.accumulation.accumulators[0].dtype == mstype.float64
    for _ in range(3):
        x, y = rng.randn(4 * steps, 6), rng.randn(4 * steps, 3)
        for micro in range(steps):
            step(Tensor(x[4 * micro : 4 * micro + 4]), Tensor(y[4 * micro : 4 * micro + 4]))
        control(Tensor(x), Tensor(y))
    np.testing.assert_allclose(ours.w.asnumpy(), theirs.w.asnumpy(), rtol=1e-13, atol=0)


def test_raise_policy_reads_the_scale_after_a_resume(tmp_path):
    """The host copy of the scale was taken at construction: a cell built at its minimum scale that resumed at
    2**15 raised PersistentOverflowError on its first overflow, naming the wrong scale."""
    source = dynamic_cell()
    source.set_sense_scale(Tensor(np.float32(2.0**15)))
    saved = save_cell_checkpoint(source, tmp_path / "s.ckpt")
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.05),
        DynamicLossScaleManager(1.0, scale_window=2).get_update_cell(),
        overflow_policy="raise",
    )
    ms.load_param_into_net(cell, saved)
    flags, scales = run_cell(cell, BATCHES[:2], inject={0})
    assert flags == [True, False] and scales == [2.0**14, 2.0**14]
    cell.set_sense_scale(Tensor(np.float32(1.0)))
    with pytest.raises(PersistentOverflowError, match="already at its minimum 1; loss scale 1,"):
        run_cell(cell, BATCHES[:1], inject={0})


def test_set_sense_scale_keeps_to_the_rule():
    cell = dynamic_cell(max_loss_scale=2.0**14)
    with pytest.raises(ValueError, match=r"within the update cell's \[min_loss_scale, max_loss_scale\]"):
        cell.set_sense_scale(Tensor(np.float32(2.0**20)))
    net = regression_net()
    fixed = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), FixedLossScaleUpdateCell(512.0))
    with pytest.raises(ValueError, match="FixedLossScaleUpdateCell, which fixes it at 512.0"):
        fixed.set_sense_scale(Tensor(np.float32(1024.0)))
    mindspores = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), nn.FixedLossScaleUpdateCell(256.0)
    )  # MindSpore's own fixed cell
    with pytest.raises(ValueError, match="FixedLossScaleUpdateCell, which fixes it at 256.0"):
        mindspores.set_sense_scale(Tensor(np.float32(1024.0)))
    assert cell.get_loss_scale() == 4096.0 and fixed.get_loss_scale() == 512.0 and mindspores.get_loss_scale() == 256.0


def test_the_float32_floor_is_a_valid_scale_for_set_sense_scale_and_the_state_check():
    cell = dynamic_cell(min_loss_scale=0.7)  # 0.7 is 0.69999999 in float32, the scale the rule floors at
    cell.set_sense_scale(Tensor(np.float32(0.7)))
    cell.check_state()
    assert cell.get_loss_scale() == float(np.float32(0.7))
    with pytest.raises(ValueError, match="min_loss_scale"):
        cell.set_sense_scale(Tensor(np.nextafter(np.float32(0.7), np.float32(0))))


@pytest.mark.parametrize("options", [{}, {"clip_global_norm": 1e6}], ids=["no clipping", "norm from clipping"])
def test_extra_outputs_give_the_learning_rate_and_the_global_norm(options):
    net = regression_net()
    schedule = nn.piecewise_constant_lr([2, 4], [0.1, 0.01])
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), schedule), Tensor(np.float32(256.0)), extra_outputs=True, **options
    )
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    rates = []
    for x, y in BATCHES[:3]:
        _, grads = grad_fn(Tensor(x), Tensor(y))
        expected = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
        outputs = cell(Tensor(x), Tensor(y))
        assert len(outputs) == 5
        rates.append(round(float(outputs[3].asnumpy()), 6))
        assert float(outputs[4].asnumpy()) == pytest.approx(expected, rel=1e-5)
    assert rates == [0.1, 0.1, 0.01]


def test_extra_outputs_with_accumulation_report_each_micro_batch_and_the_window_mean():
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(256.0)), extra_outputs=True, accumulation_steps=2
    )
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    (x0, y0), (x1, y1) = BATCHES[:2]
    first = [g.asnumpy().astype(np.float64) for g in grad_fn(Tensor(x0), Tensor(y0))[1]]
    second = [g.asnumpy().astype(np.float64) for g in grad_fn(Tensor(x1), Tensor(y1))[1]]
    norm = lambda grads: np.sqrt(sum(float((g**2).sum()) for g in grads))  # noqa: E731
    micro, last = cell(Tensor(x0), Tensor(y0)), cell(Tensor(x1), Tensor(y1))
    assert float(micro[4].asnumpy()) == pytest.approx(norm(first), rel=1e-5)  # this micro-batch's gradients
    assert float(last[4].asnumpy()) == pytest.approx(norm([(a + b) / 2 for a, b in zip(first, second)]), rel=1e-5)
    assert [round(float(outputs[3].asnumpy()), 6) for outputs in (micro, last)] == [0.1, 0.1]


@pytest.mark.parametrize(
    "per_micro_batch, inject, expected, drop",
    [
        # the README's tier: each schedule once, and a window skipped per micro-batch
        (False, (), 2, True),
        (True, (), 8, True),
        pytest.param(False, (5,), 1, True, marks=pytest.mark.slow),
        (True, (5,), 8, True),  # the second window skipped (an inf in its second micro-batch)
        pytest.param(False, (5,), 2, False, marks=pytest.mark.slow),
        pytest.param(True, (5,), 8, False, marks=pytest.mark.slow),  # drop_overflow_update=False: applied
    ],
    ids=[
        "per_step",
        "per_micro_batch",
        "per_step_skipped_window",
        "per_micro_batch_skipped_window",
        "per_step_applied_overflow",
        "per_micro_batch_applied_overflow",
    ],
)
def test_lr_schedule_advances_per_optimizer_step_or_per_micro_batch(per_micro_batch, inject, expected, drop):
    """By default global_step counts applied optimizer steps; with lr_per_micro_batch every call, in a skipped
    window too (docs/training.md), and once only in an overflowing window that is applied (the optimizer's own
    count)."""
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.01)
    cell = TrainOneStepWithLossScaleCell(
        net,
        optimizer,
        Tensor(np.float32(64.0)),
        accumulation_steps=4,
        lr_per_micro_batch=per_micro_batch,
        drop_overflow_update=drop,
    )
    overflows = run_cell(cell, BATCHES, inject)[0]
    assert overflows == [False] * 7 + [bool(inject)]
    assert int(optimizer.global_step.asnumpy().reshape(-1)[0]) == expected


class RemoteRankFlag(nn.Cell):
    """Stands in for the flag all-reduce: adds the flag another rank would contribute (held in a Parameter: a
    constant nan added inside a compiled graph gave 0 here, measured on MindSpore 2.10 CPU)."""

    def __init__(self, remote):
        super().__init__()
        self.remote = Parameter(Tensor(np.float32(remote)), name="remote_rank_flag", requires_grad=False)

    def construct(self, flag):
        return flag + self.remote


@contextlib.contextmanager
def _parallel_mode(mode):
    """MindSpore's auto-parallel context with ``parallel_mode=mode`` inside the block, reset after it."""
    context.set_auto_parallel_context(parallel_mode=mode)
    try:
        yield
    finally:
        context.reset_auto_parallel_context()


@pytest.mark.parametrize(
    "mode",
    tiered(
        ["stand_alone", "data_parallel", "hybrid_parallel", "semi_auto_parallel", "auto_parallel"],
        {"stand_alone", "data_parallel", "semi_auto_parallel"},
    ),
)
def test_every_parallel_mode_but_stand_alone_all_reduces_the_flag(mode):
    """As MindSpore's own cell: the decision is all-reduced in every mode but stand-alone, so an overflow on another
    rank skips this one too. (Semi-auto and auto parallel do not run on CPU: the cell is built in the mode, then
    run stand-alone with a stand-in for the collective.)"""
    with _parallel_mode(mode):
        net = regression_net()
        cell = dynamic_cell(net)
    distributed = mode != "stand_alone"
    assert cell.loss_scaler.is_distributed == distributed
    if distributed:
        cell.loss_scaler.allreduce = RemoteRankFlag(np.nan)
    cell.grad_reducer = ops.identity
    before = training_state(net)
    flags, _ = run_cell(cell, BATCHES[:1])
    assert flags == [distributed]
    assert (changed_since(before, net) == []) == distributed  # skipped: nothing changed


def _built_in_data_parallel(build):
    """``build()`` in data-parallel mode (its all-reduce is then part of what it compiles), the mode reset after."""
    with _parallel_mode("data_parallel"):
        return build()


# Per iteration of the GradScaler test below: (call unscale_, the call that hears of another rank's overflow).
_REMOTE_OVERFLOW_AT = [(True, "unscale_"), (True, "step"), (False, "step"), (False, "update"), (True, None)]


@pytest.mark.slow
def test_each_grad_scaler_call_all_reduces_its_decision_in_data_parallel():
    """docs/distributed.md: unscale_, step and update each all-reduce one scalar decision. Called from Python each
    is a graph of its own, so the stand-in can report another rank's overflow to one call at a time while this
    rank's gradients are finite: an overflow heard by unscale_ or by step (after unscale_ or not) skips the step
    and backs off; heard by update only, the step was applied and the scale still backs off, as on that rank."""
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.05)
    scaler = _built_in_data_parallel(lambda: GradScaler("cpu", init_scale=1024.0))
    remote = RemoteRankFlag(0.0)
    scaler._core.allreduce = remote

    def scaled_loss(x, y):
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(scaled_loss, None, optimizer.parameters)

    def heard_by(call, this, result):
        remote.remote.set_data(Tensor(np.float32(np.nan if call == this else 0.0)))
        return result()

    skips, scales, moved = [], [], []
    for (x, y), (unscale, this) in zip(BATCHES, _REMOTE_OVERFLOW_AT):
        before = training_state(net)
        grads = grad_fn(Tensor(x), Tensor(y))[1]
        if unscale:
            grads = heard_by("unscale_", this, lambda g=grads: scaler.unscale_(g))
        skips.append(bool(heard_by("step", this, lambda g=grads: scaler.step(optimizer, g)).asnumpy()))
        heard_by("update", this, scaler.update)
        scales.append(scaler.get_scale())
        moved.append(changed_since(before, net) != [])
    assert skips == [True, True, True, False, False]
    assert moved == [False, False, False, True, True]
    assert scales == [512.0, 256.0, 128.0, 64.0, 64.0]


@pytest.mark.parametrize(
    "remote", tiered({"clean": 0.0, "overflow_on_another_rank": np.nan}, {"overflow_on_another_rank"})
)
@pytest.mark.parametrize("minimize", [False, True], ids=["apply_gradients", "minimize"])
def test_loss_scale_optimizer_skips_when_another_rank_overflowed_in_data_parallel(remote, minimize):
    """The LossScaleOptimizer's decision is all-reduced too (docs/distributed.md): finite gradients here and an
    overflow on another rank skip the step and back off. ``minimize`` reduces its gradients itself; the stand-in
    for that reducer passes them through."""
    net = regression_net()
    optimizer = _built_in_data_parallel(
        lambda: LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), initial_scale=1024.0)
    )
    optimizer._core.allreduce = RemoteRankFlag(remote)
    optimizer._grad_reducer = ops.identity
    x, y = (Tensor(a) for a in BATCHES[0])

    def loss():
        return net(x, y)

    def scaled_loss():
        return optimizer.get_scaled_loss(loss())

    before = training_state(net)
    if minimize:
        optimizer.minimize(loss)
    else:
        grads = ms.value_and_grad(scaled_loss, None, optimizer.parameters)()[1]
        optimizer.apply_gradients(optimizer.get_unscaled_gradients(grads))
    overflow = bool(np.isnan(remote))
    assert (changed_since(before, net) == []) == overflow
    assert float(optimizer.loss_scale.asnumpy()) == (512.0 if overflow else 1024.0)


@pytest.mark.slow
def test_built_before_the_parallel_mode_was_set_is_refused_when_compiled_in_it():
    """Built in stand-alone mode and compiled after set_auto_parallel_context(data_parallel), each rank decided its
    overflow alone, and the train cell and LossScaleOptimizer.minimize did not reduce the gradients: under msrun
    the two ranks' weights diverged without an error (measured; MindSpore's own TrainOneStepCell does the same).
    Now each is refused while compiling, before anything changes; back in stand-alone mode the same objects
    train."""
    net = regression_net()
    cell = dynamic_cell(net)
    optimizer = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), initial_scale=1024.0)
    scaler, torch_optimizer = GradScaler("cpu", init_scale=1024.0), nn.SGD(net.trainable_params(), 0.05)
    x, y = (Tensor(a) for a in BATCHES[0])

    def loss():
        return net(x, y)

    def scaled_loss():
        return scaler.scale(loss())

    grad_fn = ms.value_and_grad(scaled_loss, None, torch_optimizer.parameters)

    def torch_step():
        skipped = scaler.step(torch_optimizer, grad_fn()[1])
        scaler.update()
        return skipped

    steps = {
        "train cell": lambda: cell(x, y)[1],
        "minimize": lambda: optimizer.minimize(loss),
        "GradScaler": torch_step,
    }
    before = training_state(net)
    with _parallel_mode("data_parallel"):
        for name, step in steps.items():
            with pytest.raises(
                RuntimeError,
                match="built in stand-alone mode but is compiled with "
                "parallel_mode='data_parallel'.*after mindspore.set_auto_parallel",
            ):
                step()
            assert changed_since(before, net) == [], name
    assert [bool(step().asnumpy()) for step in steps.values()] == [False] * 3
    scales = (cell.get_loss_scale(), float(optimizer.loss_scale.asnumpy()), scaler.get_scale())
    assert scales == (2.0**12, 1024.0, 1024.0)
    assert changed_since(before, net) != []


def test_pipeline_parallel_is_refused_with_what_to_use():
    net = regression_net()
    context.set_auto_parallel_context(pipeline_stages=2)
    try:
        with pytest.raises(ValueError, match="pipeline parallel .* needs MindSpore's pipeline train cell"):
            build_train_network(
                net, nn.SGD(net.trainable_params(), 0.1), level="O0", loss_scale_manager=DynamicLossScaleManager()
            )
    finally:
        context.reset_auto_parallel_context()


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"boost_level": "O1", "clip_global_norm": 1.0}, "clip_global_norm would be ignored"),
        (
            {"boost_level": "O2", "accumulation_steps": 2, "overflow_policy": "warn"},
            "accumulation_steps, overflow_policy",
        ),
        ({"boost_level": "O1", "loss_scale_manager": DynamicLossScaleManager()}, "does not run on CPU"),
        ({"boost_level": "O3"}, "'boost_level' must be one of"),
    ],
)
def test_boost_level_refuses_what_it_would_drop(kwargs, pattern):
    net = nn.Dense(4, 2)
    with pytest.raises(ValueError, match=pattern):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), **kwargs)
    with pytest.raises(ValueError, match=pattern):
        build_train_network(net, nn.SGD(net.trainable_params(), 0.1), nn.MSELoss(), **kwargs)


def test_boost_level_with_a_manager_that_has_no_update_cell_runs_mindspores_boost_cell_on_cpu():
    """Only an update cell keeps MindSpore's boost cell off CPU: FixedLossScaleManager(S, False) has none (the
    optimizer's loss_scale=S divides), and MindSpore's BoostTrainOneStepCell trains with it here."""
    net = nn.Dense(4, 2)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=128.0)
    cell = build_train_network(
        net,
        optimizer,
        nn.MSELoss(),
        boost_level="O1",
        loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=False),
    )
    assert type(cell).__name__ == "BoostTrainOneStepCell"
    before = net.weight.asnumpy().copy()
    loss = cell(Tensor(np.ones((3, 4), np.float32)), Tensor(np.zeros((3, 2), np.float32)))
    assert np.isfinite(loss.asnumpy()) and not np.array_equal(net.weight.asnumpy(), before)


def test_model_with_train_cell_options_alone_trains_with_our_cell_at_scale_one():
    """No manager at amp level O0: MindSpore's Model would build its TrainOneStepCell and drop the options; ours
    builds the train cell with them, at a fixed scale of 1 (as build_train_network does)."""
    net = nn.Dense(4, 2)
    cell = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), clip_global_norm=1.0).train_network
    assert type(cell) is TrainOneStepWithLossScaleCell
    assert (cell.get_loss_scale(), cell.clip_global_norm) == (1.0, 1.0)


def test_a_network_with_several_outputs_is_refused_clearly():
    class TwoOutputs(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(6, 3)

        def construct(self, x, y):
            out = self.dense(x)
            return out.mean(), out.sum()

    net = TwoOutputs()
    cell = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(8.0)))
    x, y = BATCHES[0]
    with pytest.raises(TypeError, match="the network returned a tuple: a train cell needs .* one Tensor"):
        cell(Tensor(x), Tensor(y))


# ---- a loss scaled outside the differentiated function -------------------------------------------------------------
# Each front-end's scaling call on a fresh object: (name, build(network) -> scale(loss) function).
_SCALING_CALLS = [
    ("GradScaler, PyTorch's spelling", lambda net: GradScaler("cpu", init_scale=8.0).scale),
    ("GradScaler, Paddle's spelling", lambda net: GradScaler(init_loss_scaling=8.0).scale),
    ("GradScaler, a tuple of losses", lambda net: _first_of_tuple(GradScaler("cpu", init_scale=8.0).scale)),
    (
        "LossScaleOptimizer",
        lambda net: LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0).get_scaled_loss,
    ),
    (
        "LossScaleOptimizer, fixed",
        lambda net: (
            LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), dynamic=False, initial_scale=8.0).get_scaled_loss
        ),
    ),
    (
        "LossScaleOptimizer, a callable",
        lambda net: _called(LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0).get_scaled_loss),
    ),
    ("LossScaler (the core)", lambda net: LossScaler(LossScalePolicy(init_scale=8.0), name="outside_core").scale),
]


# Named functions, not lambdas: MindSpore's parser needs a lambda on a line of its own.
def _first_of_tuple(scale):
    def first(loss):
        return scale((loss, loss * 0.0))[0]

    return first


def _called(get_scaled_loss):
    def call(loss):
        def compute():
            return loss

        return get_scaled_loss(compute)()

    return call


def _unscaled(loss):
    return loss


@contextlib.contextmanager
def _caught_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


@pytest.mark.parametrize("name, build", _SCALING_CALLS, ids=[name for name, _ in _SCALING_CALLS])
def test_a_loss_scaled_outside_the_differentiated_function_warns_at_the_callers_line(name, build):
    """PyTorch's habit ``scaler.scale(loss)`` after the gradients were taken: the scaled loss carries no gradients,
    and the step would apply the unscaled loss's gradients divided by S, S times too small without any error
    (measured before the warning: a weight moved by 1e-4 instead of 0.1). Each front-end and the core warn, once,
    pointing at the caller's line; the value is still the scaled loss."""
    net = nn.Dense(2, 1)
    scale = build(net)
    with _caught_warnings() as caught:
        scaled = scale(Tensor(np.float32(0.5)))
    assert float(scaled.asnumpy()) == 4.0
    assert [(w.category, w.filename) for w in caught] == [(UserWarning, __file__)]
    assert "outside a function being differentiated" in str(caught[0].message)


@contextlib.contextmanager
def _mode_of(how):
    """PyNative mode for ``pynative`` (the forward pass then runs from Python), else graph mode (the tests' own)."""
    if how == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def _gradients_with(scale, net, how):
    """The gradients of ``scale(loss)`` of ``net`` taken inside the differentiated function: called from Python
    (in PyNative mode for ``pynative``, in graph mode for ``graph``) or in a compiled step (``jit``)."""
    x = Tensor(np.array([[1.0, 2.0]], np.float32))

    def forward(x):
        return scale(net(x).sum())

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())

    def step(x):
        return grad_fn(x)[1]

    return (ms.jit(step) if how == "jit" else step)(x)


@pytest.mark.parametrize("how", tiered(["pynative", "graph", "jit"], {"pynative", "jit"}))
@pytest.mark.parametrize("name, build", _SCALING_CALLS, ids=[name for name, _ in _SCALING_CALLS])
def test_a_loss_scaled_inside_the_differentiated_function_does_not_warn(name, build, how):
    """The documented place, in each way of calling it: no warning, and gradients S times the unscaled ones."""
    with _mode_of(how), _caught_warnings() as caught:
        net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
        scale = build(net)
        grads = _gradients_with(scale, net, how)
        control = _gradients_with(_unscaled, net, how)
    assert [str(w.message) for w in caught if "differentiated" in str(w.message)] == []
    for scaled, unscaled in zip(grads, control):
        np.testing.assert_array_equal(scaled.asnumpy(), 8.0 * unscaled.asnumpy())


def test_a_disabled_scaler_does_not_warn_outside_the_differentiated_function():
    """A disabled scaler returns the loss as it is and ``step`` applies the gradients as they are: nothing to warn
    about."""
    with _caught_warnings() as caught:
        loss = GradScaler("cpu", enabled=False).scale(Tensor(np.float32(0.5)))
    assert float(loss.asnumpy()) == 0.5 and caught == []


def _train_cell_parts(**options):
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.02, 0.9)
    update_cell = options.pop("update_cell", DynamicLossScaleManager(hysteresis=2).get_update_cell())
    return TrainOneStepWithLossScaleCell(net, optimizer, update_cell, **options), (net, optimizer)


def _build_train_network_parts():
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.02, 0.9)
    return build_train_network(net, optimizer, loss_scale_manager=DynamicLossScaleManager()), (net, optimizer)


def _loss_scale_optimizer_parts(**options):
    inner = nn.Adam(regression_net().trainable_params(), 0.01)
    return LossScaleOptimizer(inner, **options), (inner,)


def _grad_scaler_cells(*args):
    scaler = GradScaler(*args)
    return scaler._core, scaler._states


# label: () -> (the Cells that hold lossscale's Parameters, the user's Cells inside them, whose Parameters are not ours)
LOSS_SCALING_OWNERS = {
    "train cell": _train_cell_parts,
    "train cell, every option": lambda: _train_cell_parts(
        update_cell=FixedLossScaleUpdateCell(1024.0), accumulation_steps=2, clip_global_norm=1.0, debug_overflow=True
    ),
    "build_train_network": _build_train_network_parts,
    "LossScaleOptimizer": _loss_scale_optimizer_parts,
    "LossScaleOptimizer, fixed": lambda: _loss_scale_optimizer_parts(dynamic=False, initial_scale=8.0),
    "GradScaler": lambda: (_grad_scaler_cells(), ()),
    "TorchGradScaler": lambda: (_grad_scaler_cells("cpu"), ()),
}


@pytest.mark.parametrize("label", sorted(LOSS_SCALING_OWNERS))
def test_no_loss_scaling_parameter_is_trainable(label):
    """The scale, the counters, the rule and the buffers lossscale adds are state, not weights: a trainable one would
    be in ``trainable_params()``, so an optimizer, ``value_and_grad(..., weights=cell.trainable_params())``, weight
    decay or an EMA built from them would treat it as a weight."""
    owners, users = LOSS_SCALING_OWNERS[label]()
    owners = owners if isinstance(owners, tuple) else (owners,)
    theirs = {id(parameter) for cell in users for parameter in cell.get_parameters()}
    ours = [parameter for cell in owners for parameter in cell.get_parameters() if id(parameter) not in theirs]
    assert ours  # a fixed LossScaleOptimizer holds its scale as a constant, but still its usage flags
    assert [parameter.name for parameter in ours if parameter.requires_grad] == []
