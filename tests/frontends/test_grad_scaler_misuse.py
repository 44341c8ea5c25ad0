"""GradScaler misuse: every call order or gradient that would train wrongly is refused before any update, and
what changes gradients between unscale_ and step without changing their norm trains as the control."""

import warnings

import mindspore as ms
import numpy as np
import pytest
from grad_scaler_harness import (
    clipping_separate_unscale,
    control_step,
    poisoned_grads,
    pytorch_sgd_setup,
    read_outputs,
    same_training_state,
    scaled_grad_fn,
    sgd,
    tensor_batches,
)
from mindspore import Tensor, nn, ops
from mindspore.common.sparse_tensor import RowTensorInner
from nets import (
    WIDE,
    Float64Regression,
    PlainSGD,
    changed_since,
    group_optimizer,
    jit_if,
    own_names,
    regression_batches,
    regression_net,
    tiered,
    training_state,
)

from lossscale import GradScaler, LossScaleOptimizer


def _misuse_cases(scaler, opt, grad_fn):
    def dropped_returned_gradients(x, y):
        _, grads = grad_fn(x, y)
        scaler.unscale_(grads)
        scaler.step(opt, grads)  # PyTorch habit: the S-times gradients
        return scaler.update()

    def dropped_returned_gradients_then_clipped(x, y):
        _, grads = grad_fn(x, y)
        scaler.unscale_(grads)
        # PyTorch's recipe with the return value dropped: the scaled gradients clipped to a norm above the true one,
        # so they no longer match what unscale_ was given, and would apply gradients of norm 10 for the true 0.9
        scaler.step(opt, ops.clip_by_global_norm(grads, 10.0))
        return scaler.update()

    def dropped_returned_gradients_then_clamped(x, y):
        _, grads = grad_fn(x, y)
        scaler.unscale_(grads)
        scaler.step(opt, tuple(ops.clip_by_value(g, -1.0, 1.0) for g in grads))  # the true ones are below 0.34
        return scaler.update()

    def mismatched_keys(x, y):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads, key=0)
        scaler.step(opt, grads, key=1)  # would divide a second time
        return scaler.update()

    def unscale_twice(x, y):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads)
        return scaler.unscale_(grads)

    # Two optimizers over the network's first and last two parameters, fed from one value_and_grad (for a network
    # with four).
    first, last = (
        own_names(nn.SGD(opt.parameters[part], 0.05), name) if len(opt.parameters) == 4 else None
        for part, name in ((slice(0, 2), "first"), (slice(2, None), "last"))
    )

    def unscaled_together_then_stepped_in_slices(x, y):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads)  # once, to clip them together: each slice would be divided again
        scaler.step(first, grads[:2])
        scaler.step(last, grads[2:])
        return scaler.update()

    def unscaled_in_slices_then_stepped_together(x, y):
        _, grads = grad_fn(x, y)
        scaler.step(opt, scaler.unscale_(grads[:2]) + scaler.unscale_(grads[2:]))  # would be divided again
        return scaler.update()

    def step_twice(x, y):
        _, grads = grad_fn(x, y)
        scaler.step(opt, grads)
        return scaler.step(opt, grads)

    def unscale_after_step(x, y):
        _, grads = grad_fn(x, y)
        scaler.step(opt, grads)
        return scaler.unscale_(grads)

    larger = "larger global norm than the ones unscale_"
    return {
        "dropped_returned_gradients": (dropped_returned_gradients, "scaled gradients that unscale_"),
        "dropped_returned_gradients_then_clipped": (dropped_returned_gradients_then_clipped, larger),
        "dropped_returned_gradients_then_clamped": (dropped_returned_gradients_then_clamped, larger),
        "mismatched_keys": (mismatched_keys, "shaped like the ones unscale_"),
        "unscaled_together_then_stepped_in_slices": (
            unscaled_together_then_stepped_in_slices,
            "shaped like the ones unscale_",
        ),
        "unscaled_in_slices_then_stepped_together": (
            unscaled_in_slices_then_stepped_together,
            "shaped like the ones unscale_",
        ),
        "unscale_twice": (unscale_twice, r"unscale_\(\) has already been called"),
        "step_twice": (step_twice, r"step\(\) has already been called since the last update"),
        "unscale_after_step": (unscale_after_step, r"unscale_\(\) is being called after step"),
    }


MISUSES = [
    "dropped_returned_gradients",
    "dropped_returned_gradients_then_clipped",
    "dropped_returned_gradients_then_clamped",
    "mismatched_keys",
    "unscaled_together_then_stepped_in_slices",
    "unscaled_in_slices_then_stepped_together",
    "unscale_twice",
    "step_twice",
    "unscale_after_step",
]


# Compiled, these refusals run the same graph code as eagerly (an eager call runs its compiled graph part), at
# about 5 s each: the slow tier runs them; the README's tier keeps one compiled refusal of a changed record.
SLOW_WHEN_COMPILED = {
    "dropped_returned_gradients",
    "dropped_returned_gradients_then_clamped",
    "unscaled_together_then_stepped_in_slices",
    "unscaled_in_slices_then_stepped_together",
    "mismatched_keys",
    "unscale_twice",
    "step_twice",
    "unscale_after_step",
}
# PyTorch's in-place habit (the result of unscale_ dropped): called from Python, unscale_ unscales the given Tensors
# in place, so these train as written (test_pytorch_in_place_habit_trains_as_written_from_python).
IN_PLACE_HABITS = {
    "dropped_returned_gradients",
    "dropped_returned_gradients_then_clipped",
    "dropped_returned_gradients_then_clamped",
}
MISUSE_CASES = [
    pytest.param(
        compiled,
        misuse,
        8,
        marks=[pytest.mark.slow] if compiled and misuse in SLOW_WHEN_COMPILED else [],
        id=f"{'jit' if compiled else 'eager'}-{misuse}",
    )
    for compiled in (False, True)
    for misuse in MISUSES
    if compiled or misuse not in IN_PLACE_HABITS
] + [
    # A gradient too large for the buffers: the compiled step reads the stage through a branch. (Clipping the scaled
    # gradients of this net is no misuse: its true norm is above the clip; the slack test covers the norm check.)
    pytest.param(True, misuse, WIDE, marks=pytest.mark.slow, id=f"jit-wide-{misuse}")
    for misuse in ("dropped_returned_gradients", "mismatched_keys", "step_twice")
]


@pytest.mark.lowest
@pytest.mark.parametrize("compiled, misuse, hidden", MISUSE_CASES)
def test_misuse_is_refused_before_any_wrong_update(compiled, misuse, hidden):
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = regression_net(hidden=hidden)
    opt = nn.SGD(net.trainable_params(), 0.05)
    function, pattern = _misuse_cases(scaler, opt, scaled_grad_fn(scaler, net, opt))[misuse]
    function = jit_if(compiled, function)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    before = training_state(net)
    with pytest.raises(RuntimeError, match=pattern):
        read_outputs(function(x, y))
    applied = changed_since(before, net) != []
    assert applied == misuse.startswith(("step_twice", "unscale_after_step"))  # the first step was right
    assert scaler.get_scale() == 1024.0


# What PyTorch's recipes do between unscale_ and step, on the gradients unscale_ was given.
BETWEEN_UNSCALE_AND_STEP = {
    "nothing": lambda grads: grads,
    "clip_by_global_norm_10": lambda grads: ops.clip_by_global_norm(grads, 10.0),
    "clip_grad_value_1": lambda grads: tuple(ops.clip_by_value(g, -1.0, 1.0) for g in grads),
    # Below every true gradient: the clamped scaled gradients would pass every record inside mindspore.jit.
    "clip_grad_value_1e-3": lambda grads: tuple(ops.clip_by_value(g, -1e-3, 1e-3) for g in grads),
}


@pytest.mark.parametrize("change", tiered(list(BETWEEN_UNSCALE_AND_STEP), {"clip_grad_value_1e-3"}))
def test_pytorch_in_place_habit_trains_as_written_from_python(change):
    """PyTorch's recipes (clip_grad_value_ among them) with the result of unscale_ dropped: called from Python the
    given Tensors are unscaled in place, so each trains step for step as the recipe that keeps the result."""
    change = BETWEEN_UNSCALE_AND_STEP[change]
    nets = []
    for keep_result in (False, True):
        scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=1024.0)
        for x, y in tensor_batches(3):
            _, grads = grad_fn(x, y)
            unscaled = scaler.unscale_(grads)
            assert not bool(scaler.step(opt, change(unscaled if keep_result else grads)).asnumpy())
            scaler.update()
        nets.append(net)
    same_training_state(nets[1], nets[0])


@pytest.mark.slow
def test_two_optimizers_clipped_together_train_as_the_control(compiled):
    """The recipe the slice refusals point to: unscale_() each optimizer's own gradients, clip them together, step
    each optimizer with its part; equal to unscale, clip, apply without scaling."""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net, control_net = regression_net(), regression_net()
    params = net.trainable_params()
    first, last = own_names(nn.SGD(params[:2], 0.05), "first"), own_names(nn.SGD(params[2:], 0.05), "last")
    grad_fn = scaled_grad_fn(scaler, net, nn.SGD(params, 0.05))
    control_opt = nn.SGD(control_net.trainable_params(), 0.05)
    control = control_step(control_net, control_opt, clip=0.2)

    def step(x, y):
        _, grads = grad_fn(x, y)
        grads = ops.clip_by_global_norm(scaler.unscale_(grads[:2]) + scaler.unscale_(grads[2:]), 0.2)
        skipped = ops.logical_or(scaler.step(first, grads[:2]), scaler.step(last, grads[2:]))
        scaler.update()
        return skipped

    step = jit_if(compiled, step)
    for x, y in tensor_batches(3):
        assert not bool(read_outputs(step(x, y)).asnumpy())
        control(x, y, False)
    assert scaler.get_scale() == 1024.0
    same_training_state(control_net, net)


@pytest.mark.slow
def test_an_eager_step_compiled_before_a_related_structure_was_seen_refuses_it():
    """Called from Python, step() of a slice compiles once per structure: unscale_() of the whole tuple, first seen
    after that compilation, is still refused before anything is applied (checked on the host)."""
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=1024.0)
    first = own_names(nn.SGD(opt.parameters[:2], 0.05), "first")
    x, y = tensor_batches(1)[0]
    scaler.step(first, grad_fn(x, y)[1][:2])  # compiles step() for the slice
    scaler.update()
    grads = scaler.unscale_(grad_fn(x, y)[1])
    before = training_state(net)
    with pytest.raises(RuntimeError, match="shaped like the ones unscale_"):
        scaler.step(first, grads[:2])
    assert changed_since(before, net) == []


@pytest.mark.slow
def test_a_refused_call_changes_nothing_and_the_iteration_goes_on():
    """A refused unscale_() leaves the record of the accepted one: the iteration's overflow (found by the first
    unscale_) still skips the step, and a refused unscale_() after step() does not reopen the iteration to a
    second step."""
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=1024.0)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    _, grads = grad_fn(x, y)
    unscaled = scaler.unscale_(poisoned_grads(grads, Tensor(True)))
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        read_outputs(scaler.unscale_(grad_fn(x, y)[1]))  # clean gradients, refused
    before = training_state(net)
    assert bool(
        read_outputs(scaler.step(opt, tuple(ops.clip_by_value(g, -1.0, 1.0) for g in unscaled)))
    )  # still skipped
    assert changed_since(before, net) == []
    assert scaler.update().get_scale() == 512.0
    _, grads = grad_fn(x, y)
    assert not bool(read_outputs(scaler.step(opt, grads)))
    after_step = training_state(net)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step"):
        read_outputs(scaler.unscale_(grads))
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update"):
        read_outputs(scaler.step(opt, grads))
    assert changed_since(after_step, net) == []


def _unscale_then_step(scaler, net, opt):
    """``step(x, y) -> skipped``: ``unscale_`` the gradients, pass what it returns to ``step``, ``update``."""
    grad_fn = scaled_grad_fn(scaler, net, opt)

    def step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, scaler.unscale_(grads))
        scaler.update()
        return skipped

    return step


@pytest.mark.parametrize(
    "spelling",
    [{"init_scale": 1.0}, {"init_loss_scaling": 1.0, "use_dynamic_loss_scaling": False}],
    ids=["torch", "paddle_fixed"],
)
@pytest.mark.slow
def test_unscale_then_step_at_scale_one_trains_as_the_control(spelling, compiled):
    """At scale 1 the gradients unscale_() returns are the very values it was given, so step() must not take them
    for the still-scaled gradients (unscale_() to inspect or log the gradients, then step(), PyTorch's recipe)."""
    control_net, net = regression_net(), regression_net()
    control_opt, opt = nn.SGD(control_net.trainable_params(), 0.05), nn.SGD(net.trainable_params(), 0.05)
    scaler = GradScaler(**spelling)
    scaled, control = _unscale_then_step(scaler, net, opt), control_step(control_net, control_opt)
    if compiled:
        control, scaled = ms.jit(control), ms.jit(scaled)
    for x, y in tensor_batches():
        control(x, y, Tensor(False))
        assert not bool(read_outputs(scaled(x, y)))
    assert scaler.get_scale() == 1.0
    same_training_state((control_net, control_opt), (net, opt))


@pytest.mark.slow
def test_unscale_then_step_with_all_zero_gradients_is_not_refused(compiled):
    """All-zero gradients (a loss already at its minimum) are the same scaled and unscaled: step() after unscale_()
    must not take them for the scaled gradients unscale_() was given."""
    net = nn.WithLossCell(nn.Dense(2, 1, weight_init="zeros", bias_init="zeros"), nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), 0.05)
    scaler = GradScaler("cuda", init_scale=1024.0)
    step = _unscale_then_step(scaler, net, opt)
    step = jit_if(compiled, step)
    x, y = Tensor(np.ones((4, 2), np.float32)), Tensor(np.zeros((4, 1), np.float32))
    for _ in range(2):
        assert not bool(read_outputs(step(x, y)))
    assert scaler.get_scale() == 1024.0 and int(opt.global_step.asnumpy().reshape(-1)[0]) == 2


def _clamped(grads):
    return tuple(ops.clip_by_value(g, -0.05, 0.05) for g in grads)


def _centralized(grads):
    return tuple(g - g.mean() for g in grads)


def _averaged(grads):
    return tuple(g / 2 for g in grads)


def _masked(grads):
    return (ops.zeros_like(grads[0]),) + tuple(grads[1:])


def _float16_round_trip(grads):
    """Gradients kept in float16 (for a float16 optimizer, say): each value rounded, which can raise the global norm
    by up to 2**-11 of it, what the norm check's NORM_SLACK allows for."""
    return tuple(ops.cast(ops.cast(grad, ms.float16), grad.dtype) for grad in grads)


def _raised_within_the_slack(grads):
    """Each gradient times 1.005: a global norm above the unscaled one, but by less than NORM_SLACK (1.01)."""
    return tuple(g * 1.005 for g in grads)


def _raised_beyond_the_slack(grads):
    """Each gradient times 1.02: a global norm above the unscaled one by more than NORM_SLACK (1.01)."""
    return tuple(g * 1.02 for g in grads)


# What PyTorch users do between unscale_ and step besides clipping by global norm (run_scaling_case): none raises
# the global norm (a float16 round trip only by its rounding, and on these batches it does), so none may be refused
# by the check that catches the scaled gradients clipped; nor a norm raised within the check's slack. (Functions,
# not lambdas: MindSpore's compiler cannot parse a lambda inside a dict.)
NORM_KEEPING = {
    "clamp": _clamped,
    "centralize": _centralized,
    "average": _averaged,
    "mask": _masked,
    "float16": _float16_round_trip,
    "within_slack": _raised_within_the_slack,
}


@pytest.mark.parametrize("transform", sorted(NORM_KEEPING))
@pytest.mark.parametrize("hidden", [8, WIDE], ids=["small", "wide"])
@pytest.mark.slow
def test_changes_between_unscale_and_step_that_keep_the_norm_train_as_a_control(transform, hidden, compiled):
    change = NORM_KEEPING[transform]
    scaler = GradScaler("cuda", init_scale=1024.0)
    net, control_net = regression_net(hidden=hidden), regression_net(hidden=hidden)
    opt, control_opt = nn.SGD(net.trainable_params(), 0.05), nn.SGD(control_net.trainable_params(), 0.05)
    grad_fn, control_fn = scaled_grad_fn(scaler, net, opt), ms.value_and_grad(control_net, None, control_opt.parameters)

    def step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, change(scaler.unscale_(grads)))
        scaler.update()
        return skipped

    step = jit_if(compiled, step)
    for x, y in tensor_batches(2):
        assert not bool(read_outputs(step(x, y)).asnumpy())
        control_opt(change(control_fn(x, y)[1]))
    same_training_state(control_net, net)


@pytest.mark.parametrize("hidden", [8, WIDE], ids=["small", "wide"])
@pytest.mark.slow
def test_gradients_raised_beyond_the_norm_slack_after_unscale_are_refused(hidden, compiled):
    """The refusal of scaled gradients changed after unscale_() compares global norms with a slack of 1.01 (for
    float16 rounding): 1.02 times the unscaled gradients is refused before anything is applied, 1.005 times trains
    (NORM_KEEPING)."""
    scaler, net, opt, grad_fn = pytorch_sgd_setup(hidden, init_scale=1024.0)

    def step(x, y):
        _, grads = grad_fn(x, y)
        return scaler.step(opt, _raised_beyond_the_slack(scaler.unscale_(grads)))

    step = jit_if(compiled, step)
    before = training_state(net)
    with pytest.raises(RuntimeError, match="larger global norm than the ones unscale_"):
        read_outputs(step(*tensor_batches(1)[0]))
    assert changed_since(before, net) == []


@pytest.mark.slow
def test_scaled_float64_gradients_after_unscale_are_refused_inside_jit():
    """Their fingerprint was 0, so the refusal never fired and S-times gradients were applied. (From Python, unscale_
    unscales the given Tensors in place: the habit trains as written there.)"""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = Float64Regression()
    opt = PlainSGD(0.05, net.trainable_params())
    function, pattern = _misuse_cases(scaler, opt, scaled_grad_fn(scaler, net, opt))["dropped_returned_gradients"]
    function = ms.jit(function)
    rng = np.random.RandomState(0)
    before = training_state(net)
    with pytest.raises(RuntimeError, match=pattern):
        read_outputs(function(Tensor(rng.randn(4, 6)), Tensor(rng.randn(4, 3))))
    assert changed_since(before, net) == []


@pytest.mark.slow
def test_step_skips_gradients_made_non_finite_after_a_clean_unscale(compiled):
    """A deliberate difference (docs/migration.md): PyTorch applies them (its
    test_params_invalidated_with_grads_invalidated_between_unscale_and_step sees the weights become nan). Here step()
    skips, and the iteration counts as overflowed: update() backs off."""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = regression_net()
    opt = sgd(net.trainable_params())
    grad_fn = scaled_grad_fn(scaler, net, opt)

    def train_step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, poisoned_grads(scaler.unscale_(grads), Tensor(True)))
        scaler.update()
        return skipped

    x, y = tensor_batches(1)[0]
    before = training_state(net)
    assert bool(read_outputs(jit_if(compiled, train_step)(x, y)))
    assert changed_since(before, net) == [] and scaler.get_scale() == 512.0


@pytest.mark.slow
def test_a_refused_step_of_a_fixed_paddle_scaler_leaves_its_iteration_open(compiled):
    """With Paddle's fixed scale, step() itself ends the iteration (update() does nothing then). A refused step()
    must not: the corrected step() of the same iteration takes its gradients as the unscaled ones unscale_()
    returned. Ending the iteration anyway (nothing tested it) made that step divide them by S a second time."""
    scaler = GradScaler(init_loss_scaling=1024.0, use_dynamic_loss_scaling=False)
    net, control_net = regression_net(), regression_net()
    opt, control_opt = sgd(net.trainable_params()), sgd(control_net.trainable_params())
    x, y = tensor_batches(1)[0]
    _, scaled = scaled_grad_fn(scaler, net, opt)(x, y)
    scaled, unscaled = tuple(Tensor(g.asnumpy()) for g in scaled), scaler.unscale_(scaled)  # a copy: unscaled in place

    def refused_step(grads):
        return scaler.step(opt, grads)

    def corrected_step(grads):  # another function: a compiled function that raised fails at every later call
        return scaler.step(opt, grads)

    if compiled:
        refused_step, corrected_step = ms.jit(refused_step), ms.jit(corrected_step)
    with pytest.raises(RuntimeError, match=r"step\(\) got the scaled gradients"):
        read_outputs(refused_step(scaled))
    assert not bool(read_outputs(corrected_step(unscaled)))
    control_opt(ms.value_and_grad(control_net, None, control_opt.parameters)(x, y)[1])
    same_training_state((net, opt), (control_net, control_opt))


@pytest.mark.slow
def test_correct_use_right_after_a_refused_one():
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=1024.0)
    function, _ = _misuse_cases(scaler, opt, grad_fn)["dropped_returned_gradients"]
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    with pytest.raises(RuntimeError):
        read_outputs(ms.jit(function)(x, y))
    scaler.update()  # end the broken iteration
    step = ms.jit(clipping_separate_unscale(scaler, net, opt))
    step(x, y, Tensor(False))
    assert scaler.state_dict()["_growth_tracker"] == 2  # update() ended the refused (clean) iteration too


def _gradient_calls(torch_scaler, paddle_scaler, keras, opt):
    """Each front-end call where the gradients go, as a function of what is given there, with the argument name
    the error must give."""

    def unscale_(grad):
        return torch_scaler.unscale_(grad)

    def step(grad):
        return torch_scaler.step(opt, grad)

    def minimize(grad):
        return paddle_scaler.minimize(opt, grad)

    def apply_gradients(grad):
        return keras.apply_gradients(grad)

    def get_unscaled_gradients(grad):
        return keras.get_unscaled_gradients(grad)

    def call(grad):
        return keras(grad)

    return {
        "unscale_": (unscale_, "grads"),
        "step": (step, "grads"),
        "minimize": (minimize, "grads"),
        "apply_gradients": (apply_gradients, "grads_and_vars"),
        "get_unscaled_gradients": (get_unscaled_gradients, "grads"),
        "call": (call, "grads"),
    }


@pytest.mark.parametrize("given", ["tensor", "optimizer", "number"])
@pytest.mark.parametrize("call", ["unscale_", "step", "minimize", "apply_gradients", "get_unscaled_gradients", "call"])
def test_anything_but_the_gradients_is_refused(compiled, given, call):
    """One Tensor (Paddle's habit ``minimize(optimizer, scaled_loss)``; was MindSpore's 'Cannot iterate over a scalar
    tensor'), an optimizer (PyTorch's ``unscale_(optimizer)``; was "For 'MultitypeFuncGraph', cannot find fn
    match") or a number: a TypeError naming the argument (for an optimizer, eagerly saying what to do instead),
    before anything is recorded or applied."""
    net = nn.Dense(1, 1)
    opt = nn.SGD(net.trainable_params(), 0.1)
    torch_scaler, paddle_scaler = GradScaler("cpu", init_scale=8.0), GradScaler(init_loss_scaling=8.0)
    keras = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0)
    function, argument = _gradient_calls(torch_scaler, paddle_scaler, keras, opt)[call]
    if given == "tensor":  # a runtime input of the compiled function
        run, argument_value = function, Tensor(np.ones((1, 1), np.float32))
    else:  # an optimizer cannot be one, a number would be a constant: both are captured
        value = opt if given == "optimizer" else 1.0

        def run(x):
            return x, function(value)

        argument_value = Tensor(np.float32(1.0))
    before = training_state(net)
    pattern = f"'{argument}' must be a tuple or list of gradients"
    if given == "optimizer" and not compiled:
        pattern += ".*PyTorch's unscale_\\(optimizer\\)"
    with pytest.raises(TypeError, match=pattern):
        read_outputs(jit_if(compiled, run)(argument_value))
    assert changed_since(before, net) == []
    for scaler in (torch_scaler, paddle_scaler):
        assert scaler._states.between_iterations() and scaler.get_scale() == 8.0
    assert float(keras.loss_scale.asnumpy()) == 8.0


def _refused_before_anything_happens(call, given, compiled, error, pattern):
    """``call`` (a key of :func:`_gradient_calls`) given ``given`` where the gradients go (a callable: built from the
    LossScaleOptimizer's inner parameters), eagerly or inside a jit function: ``error`` matching ``pattern``
    (``{argument}`` names the call's argument), raised before the LossScaleOptimizer's usage warning, with
    nothing applied or recorded. Returns the calls."""
    net = nn.Dense(1, 1)
    opt = nn.SGD(net.trainable_params(), 0.1)
    torch_scaler, paddle_scaler = GradScaler("cpu", init_scale=8.0), GradScaler(init_loss_scaling=8.0)
    keras = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0)
    calls = _gradient_calls(torch_scaler, paddle_scaler, keras, opt)
    function, argument = calls[call]
    given = given(keras.inner_optimizer.parameters) if callable(given) else given

    def run(x):
        return x, function(given)

    before = training_state(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(error, match=pattern.format(argument=argument)):
            read_outputs(jit_if(compiled, run)(Tensor(np.float32(1.0))))
    assert changed_since(before, net) == []
    for scaler in (torch_scaler, paddle_scaler):
        assert scaler._states.between_iterations() and scaler.get_scale() == 8.0
    assert float(keras.loss_scale.asnumpy()) == 8.0 and int(keras.iterations) == 0
    return calls


@pytest.mark.parametrize("call", ["unscale_", "step", "minimize", "apply_gradients", "call"])
def test_no_gradients_at_all_are_refused(compiled, call):
    """An empty tuple where the gradients go: a ValueError naming the argument (not an IndexError, nor MindSpore's
    "cannot get item by index from an empty sequence" after a warning that the loss was not scaled), nothing
    recorded or applied; get_unscaled_gradients(()) returns
    () as Keras' returns []."""
    calls = _refused_before_anything_happens(call, (), compiled, ValueError, "'{argument}' holds no gradients")
    get_unscaled_gradients = calls["get_unscaled_gradients"][0]

    def run(x):
        return x, get_unscaled_gradients(())

    assert jit_if(compiled, run)(Tensor(np.float32(1.0)))[1] == ()


@pytest.mark.parametrize(
    "entry, shown",
    [(np.ones(1, np.float32), "ndarray"), ((Tensor(np.ones(1, np.float32)),), "a tuple: give the weights' gradients")],
    ids=["numpy", "nested"],
)
@pytest.mark.parametrize(
    "call, pairs",
    [(call, False) for call in ("unscale_", "step", "minimize", "apply_gradients", "get_unscaled_gradients", "call")]
    + [("apply_gradients", True), ("call", True)],
)  # Keras' (gradient, variable) pairs
def test_entries_that_are_not_gradients_are_refused_naming_the_entry(compiled, entry, shown, call, pairs):
    """A NumPy array, or gradients nested one level too deep (the bias's entry here; mindspore.value_and_grad with
    grad_position and weights returns (inputs' gradients, weights' gradients)): a TypeError naming the argument
    and the entry (not MindSpore's "For 'MultitypeFuncGraph', the input can not be numpy.ndarray" after a usage
    warning and an analyzer dump, nor "Failed calling NotEqual"), before
    anything is recorded or applied."""
    grads = (Tensor(np.ones((1, 1), np.float32)), entry)

    def pairs_of(parameters):
        return tuple(zip(grads, parameters))

    _refused_before_anything_happens(
        call,
        pairs_of if pairs else grads,
        compiled,
        TypeError,
        "'{argument}\\[1\\]' must be a gradient Tensor, but got " + shown,
    )


def _eager_sparse_gradient():
    """A sparse gradient as ``mindspore.value_and_grad`` returns it outside a graph: the tuple (indices, values,
    dense shape) of an ``nn.EmbeddingLookup(sparse=True)``'s RowTensor."""
    lookup = nn.EmbeddingLookup(10, 1, target="CPU", sparse=True)

    def loss(ids):
        return lookup(ids).sum()

    grad = ms.value_and_grad(loss, None, lookup.trainable_params())(Tensor(np.array([1, 3], np.int32)))[1][0]
    assert isinstance(grad, tuple) and grad[2] == (10, 1)  # what the refusal recognises
    return grad


@pytest.mark.parametrize("call", ["unscale_", "step", "apply_gradients", "get_unscaled_gradients"])
def test_sparse_gradients_are_refused_saying_so(compiled, call):
    """nn.EmbeddingLookup(sparse=True)'s gradient, which MindSpore returns eagerly as the tuple (indices, values,
    dense shape): a TypeError saying it is sparse and what to use instead (not the advice for nested tuples of
    gradients, which does not apply), before anything is
    applied or recorded. The same tuple given to a compiled function is refused alike. (A RowTensor made inside
    a compiled function fails MindSpore's compiling: migration.md.)"""
    sparse = _eager_sparse_gradient()
    _refused_before_anything_happens(
        call,
        (Tensor(np.ones((1, 1), np.float32)), sparse),
        compiled,
        TypeError,
        "'{argument}\\[1\\]' is a sparse gradient .*Use nn.Embedding",
    )


@pytest.mark.parametrize("call", ["unscale_", "step", "minimize", "apply_gradients", "get_unscaled_gradients", "call"])
@pytest.mark.parametrize("made_by", ["value_and_grad", "RowTensorInner"])
def test_sparse_gradients_made_inside_a_compiled_function_are_refused_while_compiling(made_by, call):
    """Inside mindspore.jit, an nn.EmbeddingLookup(sparse=True)'s gradient (whose type MindSpore leaves undetermined
    while compiling) or a RowTensor built there: a TypeError saying it is sparse and what to use instead, not
    MindSpore's "Failed calling AddN with x=Tuple[Undetermined]" or a Parameter's dtype conversion error."""
    lookup = nn.EmbeddingLookup(10, 1, target="CPU", sparse=True)
    opt = nn.SGD(lookup.trainable_params(), 0.1)
    torch_scaler, paddle_scaler = GradScaler("cpu", init_scale=8.0), GradScaler(init_loss_scaling=8.0)
    keras = LossScaleOptimizer(nn.SGD(lookup.trainable_params(), 0.1), initial_scale=8.0)
    function, argument = _gradient_calls(torch_scaler, paddle_scaler, keras, opt)[call]

    def loss(ids):
        return lookup(ids).sum()

    grad_fn = ms.value_and_grad(loss, None, opt.parameters)

    def run(ids):
        if made_by == "RowTensorInner":
            return function((RowTensorInner(ids, ops.ones((2, 1), ms.float32), (10, 1)),))
        return function(grad_fn(ids)[1])

    before = training_state(lookup)
    with pytest.raises(TypeError, match=f"'{argument}(\\[0\\])?' (is|holds) a sparse gradient .*Use nn.Embedding"):
        read_outputs(ms.jit(run)(Tensor(np.array([1, 3], np.int32))))
    assert changed_since(before, lookup) == []


@pytest.mark.parametrize("call", ["unscale_", "step", "apply_gradients", "call"])
def test_gradients_of_inputs_and_weights_together_are_refused(compiled, call):
    """What mindspore.value_and_grad with grad_position=0 and weights returns, (inputs' gradients, weights'
    gradients), passed whole: a TypeError saying to pass the second (the LossScaleOptimizer, which takes Keras'
    pairs, read it as pairs and failed with an IndexError), before anything is applied or recorded."""

    def nested(parameters):
        return (Tensor(np.ones((2, 1), np.float32)),), tuple(Tensor(np.ones(p.shape, np.float32)) for p in parameters)

    _refused_before_anything_happens(call, nested, compiled, TypeError, "pass the second")


@pytest.mark.parametrize("call", ["step", "minimize"])
@pytest.mark.parametrize("weight_decay", [0.01, 0.0], ids=["decay", "no_decay"])
@pytest.mark.slow
def test_gradients_of_other_parameters_are_refused_before_the_step_is_recorded(compiled, call, weight_decay):
    """Gradients taken in the network's order for an optimizer that lists its groups in turn. Eagerly a ValueError
    naming the shapes before the step is recorded (an error from inside the optimizer, such as MindSpore's 'For
    AddN, input shape must be same', would come after, and the corrected step would be refused as a second one).
    Compiled, MindSpore refuses them while compiling, before anything runs
    (with or without weight decay): the corrected step of the same iteration works too."""
    scaler = GradScaler("cpu", init_scale=1024.0)
    net = regression_net()
    opt = group_optimizer(net, weight_decay=weight_decay)
    x, y = tensor_batches(1)[0]

    def forward(a, b):
        return scaler.scale(net(a, b))

    network_order = ms.value_and_grad(forward, None, ms.ParameterTuple(net.trainable_params()))
    optimizer_order = ms.value_and_grad(forward, None, opt.parameters)

    def apply(grad_fn):
        def step(a, b):
            _, grads = grad_fn(a, b)
            return scaler.step(opt, grads) if call == "step" else scaler.minimize(opt, grads)

        return jit_if(compiled, step)

    before = training_state(net)
    pattern = (
        r"'grads' must hold one gradient per parameter of the optimizer, in the order of optimizer.parameters "
        r".*\(8, 6\), \(8,\), \(3, 8\), \(3,\)"
    )
    with pytest.raises((ValueError, RuntimeError), match=r"shape|resize failed" if compiled else pattern):
        read_outputs(apply(network_order)(x, y))
    assert changed_since(before, net) == []
    assert scaler._states.between_iterations() and scaler.get_scale() == 1024.0
    assert not bool(read_outputs(apply(optimizer_order)(x, y)))  # the same iteration, corrected: not a second step
    if call == "step":
        scaler.update()
    control_net = regression_net()
    control_opt = group_optimizer(control_net, weight_decay=weight_decay)
    control = GradScaler("cpu", init_scale=1024.0)
    _, grads = scaled_grad_fn(control, control_net, control_opt)(x, y)
    control.step(control_opt, grads)
    control.update()
    same_training_state(net, control_net, rtol=0, atol=0)
    assert scaler.state_dict() == control.state_dict()


def test_optimizer_with_its_own_loss_scale_is_refused():
    scaler = GradScaler("cuda")
    net = regression_net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=1024.0)
    _, grads = scaled_grad_fn(scaler, net, opt)(*[Tensor(a) for a in regression_batches(1)[0]])
    before = training_state(net)
    with pytest.raises(ValueError, match="'optimizer.loss_scale' is 1024.0"):
        scaler.step(opt, grads)
    with pytest.raises(ValueError, match="'optimizer.loss_scale'"):
        LossScaleOptimizer(nn.Momentum(regression_net().trainable_params(), 0.05, 0.9, loss_scale=8.0))
    below_one = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=0.5)  # would multiply them by 2
    with pytest.raises(ValueError, match="'optimizer.loss_scale' is 0.5"):
        scaler.step(below_one, grads)
    assert changed_since(before, net) == []


class _OptimizerWithoutParameters(nn.Cell):
    """A hand-written optimizer Cell that keeps its Parameters under another name."""

    def __init__(self, params):
        super().__init__()
        self.params = ms.ParameterTuple(params)

    def construct(self, grads):
        return self.hyper_map(ops.assign_sub, self.params, grads)


def _without_parameters(net):
    return _OptimizerWithoutParameters(net.trainable_params())


def _loss_scale_optimizer(net):
    return LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), dynamic=False, initial_scale=1.0)


@pytest.mark.parametrize(
    "make_bad, pattern",
    [
        (_without_parameters, "'optimizer' must hold its Parameters in 'parameters'"),
        (_loss_scale_optimizer, "'optimizer' is a LossScaleOptimizer.*give the GradScaler its inner_optimizer"),
    ],
    ids=["without_parameters", "loss_scale_optimizer"],
)
def test_an_optimizer_step_cannot_use_is_refused_by_name_before_anything_is_recorded(make_bad, pattern, compiled):
    """Without ``parameters``: "The 'X' object has no attribute 'parameters'" from inside step() (compiled: a
    ClassMember error). A LossScaleOptimizer: its scale made the refusal say "Build it without 'loss_scale'", an
    argument it does not have; at a scale of 1 it was accepted, and two loss scalers then decided each step."""
    scaler = GradScaler("cuda")
    net = regression_net()
    bad, good = make_bad(net), nn.SGD(net.trainable_params(), 0.05)
    _, grads = scaled_grad_fn(scaler, net, good)(*tensor_batches(1)[0])

    def step(optimizer, gradients):
        return scaler.step(optimizer, gradients)

    step = jit_if(compiled, step)
    before = training_state(net)
    with pytest.raises(TypeError, match=pattern):
        read_outputs(step(bad, grads))
    assert changed_since(before, net) == []
    assert not bool(
        read_outputs(step(good, grads)).asnumpy()
    )  # the same iteration's step is not refused as a second one


@pytest.mark.parametrize("misuse", [misuse for misuse in MISUSES if misuse not in IN_PLACE_HABITS])
@pytest.mark.slow
def test_an_eager_refusal_leaves_the_scaler_usable(misuse):
    """A misuse called from Python raises there, and the next iteration trains as the control: the compiled calls
    return refusal codes instead of raising (a compiled function that raised fails at every later call on
    MindSpore 2.10)."""
    x, y = tensor_batches(1)[0]
    net, control_net = regression_net(), regression_net()
    opt, control_opt = sgd(net.trainable_params()), sgd(control_net.trainable_params())
    scaler = GradScaler("cuda", init_scale=1024.0)
    grad_fn, control_fn = scaled_grad_fn(scaler, net, opt), ms.value_and_grad(control_net, None, control_opt.parameters)
    function, pattern = _misuse_cases(scaler, opt, grad_fn)[misuse]
    with pytest.raises(RuntimeError, match=pattern):
        function(x, y)
    if misuse in ("step_twice", "unscale_after_step"):  # their first step was right, and applied
        control_opt(control_fn(x, y)[1])
    scaler.update()  # end the refused iteration
    _, grads = grad_fn(x, y)
    assert not bool(scaler.step(opt, scaler.unscale_(grads)).asnumpy())
    scaler.update()
    control_opt(control_fn(x, y)[1])
    same_training_state((net, opt), (control_net, control_opt))
    assert scaler.get_scale() == 1024.0
