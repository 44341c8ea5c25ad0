"""GradScaler where features meet: iterations split between compiled functions and Python, casts, edited
gradient lists, several keys and optimizers, failing optimizers, settings changed after compiling, and the three
front-ends with one rule in one graph."""

import warnings

import mindspore as ms
import numpy as np
import pytest
from grad_scaler_harness import (
    F,
    T,
    basic_step,
    clipping_separate_unscale,
    poisoned_grads,
    pytorch_sgd_setup,
    scaled_grad_fn,
    tensor_batches,
)
from mindspore import Tensor, nn, ops
from nets import (
    changed_since,
    jit_if,
    keras_step,
    own_names,
    regression_batches,
    regression_net,
    tiered,
    training_state,
    with_inf,
)

from lossscale import (
    DynamicLossScaleUpdateCell,
    GradScaler,
    LossScaleOptimizer,
    TrainOneStepWithLossScaleCell,
    get_preset,
)
from lossscale.core.policy import run


@pytest.mark.slow
def test_recompiling_and_other_compiled_functions_never_raise():
    """0.1.0 raised 'unscale_() after step()' on any recompilation (its tracker keyed compilations by a
    MindSpore frame id): a last batch of another size, a second jit function, a compile after a failed one."""
    scaler = GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = ms.jit(clipping_separate_unscale(scaler, net, opt))
    for batch in (4, 4, 3, 4, 2):  # new shapes recompile
        x, y = [Tensor(a) for a in regression_batches(1, batch=batch)[0]]
        step(x, y, Tensor(False))

    @ms.jit
    def evaluate(x, y):
        return scaler.scale(net(x, y))

    evaluate(x, y)

    @ms.jit
    def broken(x, y):
        return scaler.scale(net(x, y)) + "a string"

    with pytest.raises(Exception):
        broken(x, y)
    step(x, y, Tensor(False))
    assert scaler.state_dict()["_growth_tracker"] == 6 and scaler.get_scale() == 1024.0


@pytest.mark.lowest
@pytest.mark.parametrize(
    "compiled_halves",
    tiered(
        {"unscale_compiled": (True, False), "step_compiled": (False, True), "both_compiled": (True, True)},
        fast={"unscale_compiled"},
    ),
)
def test_an_iteration_split_between_compiled_functions_and_python_trains_as_eagerly(compiled_halves):
    """``unscale_`` in one function, clipping in Python, ``step``+``update`` in another, each compiled or not: the
    iteration's state (what was unscaled, what overflowed) is in Parameters, so the halves agree wherever they
    run. Same skips, scales and weights as the all-eager run, with an inf and a nan batch."""

    def train(halves):
        scaler = GradScaler("cuda", init_scale=1024.0, growth_interval=2)
        net = regression_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        grad_fn = scaled_grad_fn(scaler, net, opt)

        def unscaled_gradients(x, y):
            return scaler.unscale_(grad_fn(x, y)[1])

        def apply(grads):
            skipped = scaler.step(opt, grads)
            scaler.update()
            return skipped

        first, second = (ms.jit(f) if c else f for f, c in zip((unscaled_gradients, apply), halves))
        trajectory = []
        for index, (x, y) in enumerate(regression_batches(6)):
            x = x.copy()
            x[0, 0] = {2: np.inf, 4: np.nan}.get(index, x[0, 0])
            grads = tuple(ops.clip_by_value(g, -0.5, 0.5) for g in first(Tensor(x), Tensor(y)))
            trajectory.append((bool(second(ms.mutable(grads))), scaler.get_scale()))
        return trajectory, training_state(net)

    (eager, eager_state), (split, split_state) = train((False, False)), train(compiled_halves)
    assert [skipped for skipped, _ in eager] == [False, False, True, False, True, False]
    assert split == eager
    assert all(np.array_equal(eager_state[k], v) for k, v in split_state.items())


@pytest.mark.parametrize("clamp", ["clip_by_value", "nan_to_num"])
@pytest.mark.slow
def test_step_skips_when_unscale_found_inf_even_if_gradients_were_clamped(compiled, clamp):
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=1024.0)

    def train_step(x, y):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads)
        if clamp == "clip_by_value":
            grads = tuple(ops.clip_by_value(g, -1.0, 1.0) for g in grads)
        else:
            grads = tuple(ops.nan_to_num(g, 0.0, 1.0, -1.0) for g in grads)
        skipped = scaler.step(opt, grads)
        scaler.update()
        return skipped

    train_step = jit_if(compiled, train_step)
    x, y = regression_batches(1)[0]
    x = with_inf(x)
    before = training_state(net)
    assert bool(train_step(Tensor(x), Tensor(y)).asnumpy())
    assert changed_since(before, net) == []
    assert scaler.get_scale() == 512.0  # backed off once


@pytest.mark.parametrize(
    "spelling, preset",
    [({"init_scale": 1024.0}, "pytorch"), ({"init_loss_scaling": 1024.0}, "paddle")],
    ids=["torch", "paddle"],
)
@pytest.mark.parametrize("bad", [[np.inf, 1.0], [-np.inf, -np.inf]], ids=["one_inf", "all_minus_inf"])
@pytest.mark.slow
def test_step_after_unscale_skips_an_overflow_without_a_false_refusal(compiled, spelling, preset, bad):
    """Gradients holding an inf unscale to gradients with the same inf, so the recorded fingerprint of the
    scaled gradients and that of the returned ones were both inf and equal: step() raised "step() got the
    scaled gradients" on an ordinary overflow instead of skipping (found by a random comparison with PyTorch).
    Passing the scaled gradients back with an inf is skipped too: nothing wrong can be applied."""
    net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
    opt = nn.SGD(net.trainable_params(), 0.1)
    scaler = GradScaler(**spelling)

    def returned(grads):
        grads = scaler.unscale_(grads)
        skipped = scaler.step(opt, grads)
        scaler.update()
        return skipped

    def dropped(grads):
        scaler.unscale_(grads)
        skipped = scaler.step(opt, grads)
        scaler.update()
        return skipped

    grads = ms.mutable((Tensor(np.array([bad], np.float32)), Tensor(np.ones(1, np.float32))))
    expected = run(get_preset(preset, init_scale=1024.0), [True, True])
    for iteration, step in enumerate((returned, dropped)):
        step = jit_if(compiled, step)
        assert bool(step(grads).asnumpy())
        assert net.weight.asnumpy().tolist() == [[1.0, 1.0]] and net.bias.asnumpy().tolist() == [0.0]
        assert scaler.get_scale() == expected[iteration].scale


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
@pytest.mark.parametrize("form", ["step_update", "minimize"])
@pytest.mark.parametrize(
    "spelling",
    [
        {"init_loss_scaling": 1024.0},
        {"init_loss_scaling": 1024.0, "use_dynamic_loss_scaling": False},
        {"init_scale": 1024.0},
    ],
    ids=["paddle", "paddle_fixed", "torch"],
)
@pytest.mark.slow
def test_gradients_given_to_a_compiled_function_train_as_eagerly(spelling, form, keywords):
    """Gradients computed elsewhere (e.g. accumulated eagerly) and passed into a compiled step: with Paddle's
    spelling step() and minimize() failed to compile ("Cannot join the return values of different branches",
    MindSpore 2.10) because step() recorded its decision and then, for a fixed scale, reset the iteration in a
    second table write. The same error came back with the arguments given by keyword (optimizer=..., grads=...):
    MindSpore folded the unscaling of the constant gradients inside step()'s branch into (0, 0)."""

    def train(compiled):
        net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
        opt = nn.SGD(net.trainable_params(), 0.1)
        scaler = GradScaler(**spelling)

        def minimize(grads):
            return scaler.minimize(opt, grads)

        def minimize_by_keyword(grads):
            return scaler.minimize(optimizer=opt, grads=grads)

        def step_update(grads):  # update() not under an `if` on `keywords`: see docs/quickstart.md
            skipped = scaler.step(opt, grads)
            scaler.update()
            return skipped

        def step_update_by_keyword(grads):
            skipped = scaler.step(optimizer=opt, grads=grads)
            scaler.update()
            return skipped

        apply = {
            ("minimize", False): minimize,
            ("minimize", True): minimize_by_keyword,
            ("step_update", False): step_update,
            ("step_update", True): step_update_by_keyword,
        }[form, keywords]
        apply = jit_if(compiled, apply)
        skips = []
        for weight_grad in ([[1.0, 2.0]], [[np.inf, 1.0]], [[3.0, 1.0]]):
            grads = (Tensor(np.array(weight_grad, np.float32) * 1024), Tensor(np.full(1, 1024.0, np.float32)))
            skips.append(bool(apply(grads).asnumpy()))
        return skips, net.weight.asnumpy().tolist(), net.bias.asnumpy().tolist(), scaler.state_dict()

    eager, compiled = train(False), train(True)
    assert eager[0] == [False, True, False]
    assert compiled == eager


def _front_end(kind):
    """``(net, scale_loss, apply, get_scale)`` for a Dense(2, 1) with SGD(0.1) under a GradScaler spelling or a
    LossScaleOptimizer, all starting at the scale 1024 (``apply(grads)`` returns the skip flag)."""
    net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
    sgd = nn.SGD(net.trainable_params(), 0.1)
    if kind == "keras":
        opt = LossScaleOptimizer(sgd, initial_scale=1024.0)

        def apply_keras(grads):
            return opt.apply_gradients(opt.get_unscaled_gradients(grads))

        return net, opt.get_scaled_loss, apply_keras, lambda: float(opt.loss_scale.asnumpy())
    scaler = GradScaler(init_scale=1024.0) if kind == "torch" else GradScaler(init_loss_scaling=1024.0)

    def apply(grads):
        skipped = scaler.step(sgd, grads)
        scaler.update()
        return skipped

    return net, scaler.scale, apply, scaler.get_scale


@pytest.mark.parametrize("kind", ["torch", "paddle", "keras"])
@pytest.mark.slow
def test_a_batch_dropped_after_a_non_finite_loss_leaves_no_trace(kind, compiled):
    """The usual guard "loss not finite: skip this batch" (no step, no update). The front-ends recorded the
    non-finite loss, so the next, clean step was skipped and the scale backed off; PyTorch, Paddle and Keras
    apply it. A non-finite loss now makes its own gradients nan instead."""
    net, scale_loss, apply, get_scale = _front_end(kind)

    def forward(x):
        return scale_loss(net(x).sum())

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())
    grad_fn = jit_if(compiled, grad_fn)
    loss, _ = grad_fn(Tensor(np.array([[np.inf, 1.0]], np.float32)))
    assert not np.isfinite(loss.asnumpy())  # dropped by hand
    _, grads = grad_fn(Tensor(np.ones((1, 2), np.float32)))
    assert not bool(apply(grads).asnumpy())
    assert net.weight.asnumpy().tolist() == [[0.8999999761581421, 0.8999999761581421]] and get_scale() == 1024.0


@pytest.mark.parametrize("kind", ["torch", "paddle", "keras"])
@pytest.mark.slow
def test_nan_gradients_given_as_a_plain_tuple_are_skipped(kind):
    """A plain tuple of Tensors given to a compiled function (or, for LossScaleOptimizer, to its apply Cell from
    Python) is a compile-time constant, and MindSpore 2.10's constant folding turned the check of
    ``[[nan, 1.0]]`` into 0: LossScaleOptimizer.apply_gradients applied nan gradients eagerly, and so did every
    front-end in a compiled function taking the gradients as an argument."""
    for compiled in (False, True):
        net, scale_loss, apply, _ = _front_end(kind)
        step = jit_if(compiled, apply)
        for bad in ([[np.nan, 1.0]], [[1.0, np.nan]], [[np.nan, np.nan]]):
            scale_loss(Tensor(np.float32(1.0)))  # LossScaleOptimizer checks that the loss of these was scaled
            grads = (Tensor(np.array(bad, np.float32) * 1024), Tensor(np.full(1, 1024.0, np.float32)))
            assert bool(step(grads).asnumpy()), (compiled, bad)
            assert net.weight.asnumpy().tolist() == [[1.0, 1.0]] and net.bias.asnumpy().tolist() == [0.0]


@pytest.mark.slow
def test_loss_scale_optimizer_called_from_python_compiles_once():
    """From Python its apply Cell got the gradients as a constant tuple: a compilation per call (0.3 s here)."""
    net = nn.Dense(2, 1)
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no scaling calls: the warning of apply_gradients
        for value in (1.0, 2.0, 3.0):
            grads = (Tensor(np.full((1, 2), value, np.float32)), Tensor(np.ones(1, np.float32)))
            opt.apply_gradients(grads)
            opt(grads)
    assert len(opt._apply_step.compile_cache) == 1 and len(opt.compile_cache) == 1


class _CastNet(nn.Cell):
    """``mean((x @ w)^2)`` with ``w`` (all ones) of ``dtype``: its gradient is 2 per entry for ``x`` of ones."""

    def __init__(self, dtype):
        super().__init__()
        self.w = ms.Parameter(Tensor(np.ones((2, 2), dtype)), name="w")

    def construct(self, x):
        return (ops.matmul(x.astype(self.w.dtype), self.w).astype(ms.float32) ** 2).mean()


@pytest.mark.parametrize(
    "param_dtype, cast_to",
    [(np.float16, ms.float32), (np.float32, ms.float16)],
    ids=["float16_params_cast_to_float32", "float32_params_cast_to_float16"],
)
@pytest.mark.slow
def test_gradients_cast_after_unscale_are_stepped_once_unscaled(param_dtype, cast_to, compiled):
    """Gradients cast between unscale_() and step() (to float32 for clipping, say) had another structure
    signature, so step() took them for another optimizer's and divided them by the scale again: a 1/S-times
    update, silently (float16 weights did not move at all). The slot follows the shapes only now."""
    net = _CastNet(param_dtype)
    opt = nn.SGD([net.w], 0.125)
    scaler = GradScaler("cuda", init_scale=1024.0)
    grad_fn = scaled_grad_fn(scaler, net, opt)

    def iteration(x):
        _, grads = grad_fn(x)
        grads = tuple(grad.astype(cast_to) for grad in scaler.unscale_(grads))
        skipped = scaler.step(opt, ops.clip_by_global_norm(grads, 100.0))
        scaler.update()
        return skipped

    before = net.w.asnumpy().astype(np.float32)
    skipped = jit_if(compiled, iteration)(Tensor(np.ones((1, 2), np.float32)))
    assert not bool(skipped)
    np.testing.assert_allclose(before - net.w.asnumpy().astype(np.float32), np.full((2, 2), 0.25), rtol=2e-3)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.slow
def test_gradients_edited_as_a_list_are_applied_as_the_tuple(enabled, compiled):
    """``grads = list(scaler.unscale_(grads)); grads[0] = clip(grads[0])``, then ``step(opt, grads)``: MindSpore's
    optimizers take tuples only ("the types of arguments in HyperMap must be consistent"), and the step had
    already been recorded. Now applied as the tuple would be: the same weights as the tuple control."""

    def run(as_list):
        net = regression_net()
        opt = nn.SGD(net.trainable_params(), 0.05)
        scaler = GradScaler("cuda", init_scale=1024.0, enabled=enabled)
        grad_fn = scaled_grad_fn(scaler, net, opt)

        def iteration(x, y):
            _, grads = grad_fn(x, y)
            grads = scaler.unscale_(grads)
            edited = [ops.clip_by_value(grads[0], -0.1, 0.1)] + list(grads[1:])
            skipped = scaler.step(opt, edited if as_list else tuple(edited))
            scaler.update()
            return skipped

        step = jit_if(compiled, iteration)
        for x, y in tensor_batches(2):
            assert not bool(step(x, y))
        return [p.asnumpy() for p in net.trainable_params()]

    for ours, control in zip(run(as_list=True), run(as_list=False)):
        np.testing.assert_array_equal(ours, control)


@pytest.mark.slow
def test_with_identical_shapes_a_step_between_another_keys_unscale_and_step_is_refused():
    """A documented limitation (docs/migration.md): with explicit keys and identical parameter shapes, step() of
    an optimizer that was not unscaled is refused while another key's gradients are unscaled and not yet
    stepped, since the gradients given could be those (PyTorch tells optimizers apart by identity and allows
    this order). Nothing is applied; stepping the unscaled key first works."""
    nets = [nn.Dense(2, 1, weight_init="ones", bias_init="zeros") for _ in range(2)]
    opts = [nn.SGD(net.trainable_params(), 0.1) for net in nets]
    scaler = GradScaler("cuda", init_scale=1024.0)
    grads = [(Tensor(np.full((1, 2), 1024.0 * k, np.float32)), Tensor(np.full(1, 1024.0, np.float32))) for k in (1, 2)]
    unscaled_a = scaler.unscale_(grads[0], key="a")
    with pytest.raises(RuntimeError, match="shaped like the ones unscale_\\(\\) returned for another key"):
        scaler.step(opts[1], grads[1], key="b")
    assert nets[1].weight.asnumpy().tolist() == [[1.0, 1.0]]
    assert not bool(scaler.step(opts[0], unscaled_a, key="a").asnumpy())
    assert not bool(scaler.step(opts[1], grads[1], key="b").asnumpy())
    scaler.update()
    assert nets[0].weight.asnumpy().tolist() == [[0.8999999761581421, 0.8999999761581421]]
    assert nets[1].weight.asnumpy().tolist() == [[0.800000011920929, 0.800000011920929]]


@pytest.mark.parametrize("keys", [("a", "b"), (None, None)], ids=["keys", "structures"])
@pytest.mark.slow
def test_a_step_without_unscale_beside_another_keys_unscaled_gradients_of_other_shapes_is_applied(keys):
    """The refusal above is for identical shapes only: gradients of other shapes cannot be the ones unscale_()
    returned for the other key, so step() unscales them and applies them (PyTorch's order is accepted). Without
    keys (PyTorch's code), each gradient structure is its own optimizer's record."""
    key_a, key_b = keys
    nets = [
        nn.Dense(2, 1, weight_init="ones", bias_init="zeros"),
        nn.Dense(3, 1, weight_init="ones", bias_init="zeros"),
    ]
    opts = [nn.SGD(net.trainable_params(), 0.1) for net in nets]
    scaler = GradScaler("cuda", init_scale=1024.0)
    grads = [
        (Tensor(np.full((1, width), 1024.0 * k, np.float32)), Tensor(np.full(1, 1024.0, np.float32)))
        for k, width in ((1, 2), (2, 3))
    ]
    unscaled_a = scaler.unscale_(grads[0], key=key_a)
    assert not bool(scaler.step(opts[1], grads[1], key=key_b).asnumpy())
    assert not bool(scaler.step(opts[0], unscaled_a, key=key_a).asnumpy())
    scaler.update()
    assert nets[0].weight.asnumpy().tolist() == [[0.8999999761581421] * 2]
    assert nets[1].weight.asnumpy().tolist() == [[0.800000011920929] * 3]


@pytest.mark.slow
def test_an_overflow_is_forgotten_at_update_by_an_optimizer_that_sits_out_the_next_iteration():
    """PyTorch resets every optimizer's record at update(): an optimizer whose gradients overflowed, and that
    does not step in the next iteration, does not make that iteration back off again."""
    nets = [
        nn.Dense(2, 1, weight_init="ones", bias_init="zeros"),
        nn.Dense(3, 1, weight_init="ones", bias_init="zeros"),
    ]
    opts = [nn.SGD(net.trainable_params(), 0.1) for net in nets]
    scaler = GradScaler("cuda", init_scale=1024.0)
    clean = (Tensor(np.full((1, 2), 1024.0, np.float32)), Tensor(np.full(1, 1024.0, np.float32)))
    overflowed = (Tensor(np.full((1, 3), np.inf, np.float32)), Tensor(np.full(1, 1024.0, np.float32)))
    assert not bool(scaler.step(opts[0], clean, key="a").asnumpy())
    assert bool(scaler.step(opts[1], overflowed, key="b").asnumpy())
    scaler.update()
    assert scaler.get_scale() == 512.0 and nets[1].weight.asnumpy().tolist() == [[1.0] * 3]
    assert not bool(scaler.step(opts[0], clean, key="a").asnumpy())  # only the first optimizer steps
    scaler.update()
    assert scaler.get_scale() == 512.0
    # 1 - 0.1 * 1024 / 1024, then - 0.1 * 1024 / 512: each step unscaled by the scale it was scaled with
    np.testing.assert_allclose(nets[0].weight.asnumpy(), [[0.7, 0.7]], rtol=1e-6)


class _FailsOnce:
    """An optimizer whose first call raises (a device error, a bug fixed before the retry), then applies ``inner``."""

    def __init__(self, inner):
        self.inner, self.parameters, self.failed = inner, inner.parameters, False

    def __call__(self, grads):
        if not self.failed:
            self.failed = True
            raise RuntimeError("device busy")
        return self.inner(grads)


@pytest.mark.parametrize(
    "spelling, unscale_first", [("torch", False), ("paddle", True)], ids=["torch_step", "paddle_unscale_then_step"]
)
@pytest.mark.slow
def test_a_step_whose_optimizer_raised_can_be_called_again(spelling, unscale_first):
    """Called from Python, an optimizer that raises inside step() leaves the iteration as it was before that
    step() (as PyTorch, which records a step only once its optimizer returned): the retry applies the step and
    the run ends where an uninterrupted one does (a failed step left recorded would refuse the retry as a second
    step, and update() would count an iteration whose step never happened)."""
    runs = []
    for flaky in (False, True):
        scaler = (
            GradScaler("cpu", init_scale=8.0, growth_interval=1)
            if spelling == "torch"
            else GradScaler(init_loss_scaling=8.0, incr_every_n_steps=1)
        )
        net = regression_net()
        inner = nn.SGD(net.trainable_params(), 0.1)
        optimizer = _FailsOnce(inner) if flaky else inner

        def forward(a, b):
            return scaler.scale(net(a, b))

        grad_fn = ms.value_and_grad(forward, None, inner.parameters)
        for x, y in tensor_batches(2):
            grads = grad_fn(x, y)[1]
            if unscale_first:
                grads = scaler.unscale_(grads)
            if flaky and not optimizer.failed:
                before = training_state(net)
                with pytest.raises(RuntimeError, match="device busy"):
                    scaler.step(optimizer, grads)
                assert changed_since(before, net) == [] and scaler._states.between_iterations() is not unscale_first
            assert not bool(scaler.step(optimizer, grads))  # clean batches: applied
            scaler.update()
        runs.append((scaler.get_scale(), training_state(net)))
    (scale, weights), (flaky_scale, flaky_weights) = runs
    assert flaky_scale == scale == 32.0
    assert all(np.array_equal(flaky_weights[name], value) for name, value in weights.items())


@pytest.mark.parametrize(
    "change, flags, expected",
    [
        (lambda s: s.set_growth_interval(1), [F, F], [4096.0, 8192.0]),
        (lambda s: s.set_backoff_factor(0.25), [T, F], [512.0, 512.0]),
        (lambda s: s.set_growth_factor(4.0), [F, F, F], [2048.0, 8192.0, 8192.0]),
        (lambda s: s.set_init_loss_scaling(64.0), [F], [64.0]),
        (
            lambda s: s.load_state_dict(
                {"scale": 32.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2, "_growth_tracker": 1}
            ),
            [F, F],
            [64.0, 64.0],
        ),
    ],
    ids=["set_growth_interval", "set_backoff_factor", "set_growth_factor", "set_init_loss_scaling", "load_state_dict"],
)
@pytest.mark.slow
def test_settings_reach_a_step_compiled_before_them(change, flags, expected, compiled):
    """Eagerly the scaler's own calls are compiled at their first call too (lossscale.frontends._eager_calls)."""
    scaler = GradScaler("cuda", init_scale=2048.0, growth_interval=3)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = basic_step(scaler, net, opt)
    step = jit_if(compiled, step)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    step(x, y, Tensor(False))  # compiled with the old rule; growth tracker now 1
    change(scaler)
    scales = []
    for flag in flags:
        step(x, y, Tensor(flag))
        scales.append(scaler.get_scale())
    assert scales == expected
    assert scaler.state_dict()["scale"] == expected[-1]  # what the device holds


@pytest.mark.slow
def test_switching_fixed_and_dynamic_reaches_a_compiled_step(compiled):
    """A switch takes effect in a step compiled before it; while fixed, the counters stand still (Paddle's
    update() returns before counting), so a clean step neither counts towards the next growth nor an overflow
    towards the next backoff."""
    scaler = GradScaler(init_loss_scaling=256.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = basic_step(scaler, net, opt)
    step = jit_if(compiled, step)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]

    def counts():
        state = scaler.state_dict()
        return float(state["scale"][0]), state["incr_count"], state["decr_count"]

    step(x, y, Tensor(False))
    assert counts() == (256.0, 1, 0)
    state = dict(scaler.state_dict(), use_dynamic_loss_scaling=False)
    scaler.load_state_dict(state)
    for overflow in (False, True):
        step(x, y, Tensor(overflow))
    _, grads = scaled_grad_fn(scaler, net, opt)(x, y)
    scaler.unscale_(poisoned_grads(grads, Tensor(True)))
    scaler.update()  # an overflow recorded, but no step: update() does nothing to a fixed scale
    assert counts() == (256.0, 1, 0) and not scaler.is_use_dynamic_loss_scaling()
    scaler.load_state_dict(dict(scaler.state_dict(), use_dynamic_loss_scaling=True))
    step(x, y, Tensor(True))
    assert counts() == (256.0, 0, 1)  # the first of two overflows per backoff
    for _ in range(3):
        step(x, y, Tensor(False))
    assert counts() == (512.0, 0, 0)


class _Float16Regression(nn.Cell):
    """A bias-free float16 Dense(8, 4) with a float32 MSE loss: its float16 backward overflows on large inputs."""

    def __init__(self, weight):
        super().__init__()
        self.dense = nn.Dense(8, 4, weight_init=Tensor(weight), has_bias=False).to_float(ms.float16)
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return self.loss(ops.cast(self.dense(ops.cast(x, ms.float16)), ms.float32), y)


def _one_rule_runs(policy, batches, weight):
    """The train cell, a GradScaler and a LossScaleOptimizer, each with ``policy``, trained on ``batches`` (one
    compiled step each): ``{front end: ([(skipped, scale after the step)], weight)}``."""

    def train_cell():
        net = _Float16Regression(weight)
        step = TrainOneStepWithLossScaleCell(
            net, nn.SGD(net.trainable_params(), 0.01), DynamicLossScaleUpdateCell.from_policy(policy)
        )
        return net, step, step.get_loss_scale, lambda outputs: outputs[1]

    def grad_scaler():
        net = _Float16Regression(weight)
        opt, scaler = nn.SGD(net.trainable_params(), 0.01), GradScaler("cuda", policy=policy)
        grad_fn = scaled_grad_fn(scaler, net, opt)

        def step(x, y):
            _, grads = grad_fn(x, y)
            skipped = scaler.step(opt, grads)
            scaler.update()
            return skipped

        return net, ms.jit(step), scaler.get_scale, lambda skipped: skipped

    def loss_scale_optimizer():
        net = _Float16Regression(weight)
        opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.01), policy=policy)
        return net, ms.jit(keras_step(net, opt)), lambda: float(opt.loss_scale.asnumpy()), lambda skipped: skipped

    runs = {}
    for name, build in (
        ("train_cell", train_cell),
        ("grad_scaler", grad_scaler),
        ("loss_scale_optimizer", loss_scale_optimizer),
    ):
        net, step, scale, skipped_of = build()
        trajectory = [(bool(skipped_of(step(Tensor(x), Tensor(y))).asnumpy()), scale()) for x, y in batches]
        runs[name] = (trajectory, net.dense.weight.asnumpy())
    return runs


@pytest.mark.lowest
@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("pytorch", dict(init_scale=2.0**14, growth_interval=3)),
        pytest.param("megatron", dict(init_scale=2.0**14, growth_interval=2), marks=pytest.mark.slow),
    ],
)
def test_the_three_front_ends_with_one_rule_train_bit_identically(preset, overrides):
    """One core under every front-end: a float16 model whose backward overflows on its own (large inputs, no
    injected inf) trained by the train cell, a GradScaler and a LossScaleOptimizer with the same rule skips the
    same steps, follows the same scales (the rule's, for those skips) and ends with bit-identical weights."""
    policy = get_preset(preset, **overrides)
    rng = np.random.RandomState(0)
    weight = (rng.randn(4, 8) * 0.5).astype(np.float32)
    batches = [
        (rng.randn(16, 8).astype(np.float32) * (300.0 if i in (3, 4, 9) else 1.0), rng.randn(16, 4).astype(np.float32))
        for i in range(12)
    ]
    runs = _one_rule_runs(policy, batches, weight)
    trajectory, weight_after = runs["train_cell"]
    skips = [skipped for skipped, _ in trajectory]
    assert all(skips[i] for i in (3, 4, 9)) and skips.count(False) >= 8  # the float16 backward overflowed there
    assert [scale for _, scale in trajectory] == [state.scale for state in run(policy, skips)]
    for name in ("grad_scaler", "loss_scale_optimizer"):
        assert runs[name][0] == trajectory, name
        np.testing.assert_array_equal(runs[name][1], weight_after, err_msg=name)


@pytest.mark.slow
def test_two_scalers_an_optimizer_wrapper_and_a_train_cell_in_one_graph():
    """A GAN-like graph: 0.1.0 named every scaler's Parameters alike, so two could not share a graph."""
    nets = [regression_net(seed=s) for s in range(4)]
    opts = [own_names(nn.SGD(n.trainable_params(), 0.05), f"opt{i}") for i, n in enumerate(nets)]
    scalers = [GradScaler("cuda", init_scale=64.0), GradScaler(init_loss_scaling=32.0)]
    wrapper = LossScaleOptimizer(opts[2], initial_scale=16.0)
    cell = TrainOneStepWithLossScaleCell(nets[3], opts[3], Tensor(np.float32(8.0)))

    class Holder(nn.Cell):  # nets as attributes of one Cell: MindSpore prefixes their Parameter names
        def __init__(self):
            super().__init__()
            self.n0, self.n1, self.n2, self.cell = nets[0], nets[1], nets[2], cell

    holder = Holder()
    grad_fns = [scaled_grad_fn(s, n, o) for s, n, o in zip(scalers, nets, opts)]

    def wrapped_loss(x, y):
        return wrapper.get_scaled_loss(holder.n2(x, y))

    wrapper_fn = ms.value_and_grad(wrapped_loss, None, wrapper.parameters)

    @ms.jit
    def step(x, y):
        for scaler, grad_fn, opt in zip(scalers, grad_fns, opts[:2]):
            _, grads = grad_fn(x, y)
            scaler.step(opt, grads)
            scaler.update()
        _, grads = wrapper_fn(x, y)
        wrapper.apply_gradients(wrapper.get_unscaled_gradients(grads))
        return holder.cell(x, y)[1]

    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    before = [training_state(n) for n in nets]
    assert not bool(step(x, y).asnumpy())
    for old, net in zip(before, nets):
        assert changed_since(old, net) != []
    assert [s.state_dict()["scale"] for s in scalers[:1]] == [64.0] and wrapper.dynamic_counter == 1


def test_scaler_stays_usable_after_update_inside_jit():
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=4.0, growth_interval=1)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        scaler.step(opt, grads)
        scaler.update()
        return scaler.scale(Tensor(np.float32(1.0))), loss  # the receiver is usable after update()

    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    assert [float(step(x, y)[0].asnumpy()) for _ in range(3)] == [8.0, 16.0, 32.0]
