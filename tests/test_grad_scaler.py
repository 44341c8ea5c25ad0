"""GradScaler: Paddle's and PyTorch's front-ends, held to their frameworks' own tests.

Structure after PyTorch's ``test_grad_scaling_*`` (``_run_scaling_case``: a control run without
scaling that skips the iteration where the scaled run gets an inf, compared parameter by
parameter, with the scale checked against growth**unskipped * backoff**skipped) and Paddle's
GradScaler tests (defaults, getters/setters, state_dict), each eager and under mindspore.jit. Then a
regression test per defect of the 0.1.0 front-end.
"""

import gc
import inspect
import logging
import pickle
import re
import warnings
import weakref

import mindspore as ms
import numpy as np
import pytest
from backend_standins import SaturatingNet, StatusRegister
from mindspore import Tensor, mint, nn, ops
from nets import (
    Float64Regression,
    GradCapture,
    PlainSGD,
    changed_since,
    group_optimizer,
    keras_step,
    own_names,
    regression_batches,
    regression_net,
    training_state,
    with_inf,
)

from lossscale import (
    DynamicLossScaleUpdateCell,
    GradScaler,
    LossScaleOptimizer,
    TorchGradScaler,
    TrainOneStepWithLossScaleCell,
    get_preset,
)
from lossscale.core.overflow import AscendSaturationCheck
from lossscale.core.policy import run
from lossscale.frontends._eager_calls import CompiledCalls
from lossscale.frontends.optimizer_states import DEFAULT_CAPACITY

T, F = True, False
SKIP_ITER = 2


def _grad_fn(scaler, net, optimizer):
    """``value_and_grad`` of ``scaler.scale(net(*inputs))`` (a network with its loss)."""

    def forward(*inputs):
        return scaler.scale(net(*inputs))

    return ms.value_and_grad(forward, None, optimizer.parameters)


def _pytorch_sgd_setup(**scaler_arguments):
    """``(scaler, net, opt, grad_fn)``: a PyTorch-spelled GradScaler("cuda", **scaler_arguments), the regression
    net, SGD(0.05) over it and :func:`_grad_fn` of the three."""
    scaler = GradScaler("cuda", **scaler_arguments)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    return scaler, net, opt, _grad_fn(scaler, net, opt)


def _poison(grads, flag):
    """The third gradient (the second layer's weight) replaced by inf where ``flag`` (PyTorch's fill_(inf))."""
    bad = ops.select(flag, ops.full_like(grads[2], np.inf), grads[2])
    return grads[:2] + (bad,) + grads[3:]


def _batches(count=4):
    return [tuple(Tensor(a) for a in batch) for batch in regression_batches(count)]


def _read(outputs):
    """Read a compiled call's outputs on the host: MindSpore reports a runtime raise of an asynchronously
    running graph at the next host read, and the refusal must surface here, not in a later test."""
    for value in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if isinstance(value, Tensor):
            value.asnumpy()
        elif isinstance(value, (tuple, list)):
            _read(value)
        elif isinstance(value, GradScaler):
            value.get_scale()
    return outputs


def _state_of(cells):
    """training_state of a Cell, or of several (a network and its optimizer) merged."""
    return {
        name: value
        for cell in (cells if isinstance(cells, tuple) else (cells,))
        for name, value in training_state(cell).items()
    }


def _same_training_state(a, b, rtol=1e-5, atol=1e-7):
    expected, actual = _state_of(a), _state_of(b)
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol, err_msg=name)


# ---- PyTorch's _run_scaling_case ----------------------------------------------------------------------


def _basic(scaler, net, opt):
    grad_fn = _grad_fn(scaler, net, opt)

    def step(x, y, poison):
        _, grads = grad_fn(x, y)
        scaler.step(opt, _poison(grads, poison))
        scaler.update()
        return grads[0]

    return step


def _clipping_separate_unscale(scaler, net, opt):
    grad_fn = _grad_fn(scaler, net, opt)

    def step(x, y, poison):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(_poison(grads, poison))
        grads = ops.clip_by_global_norm(grads, 0.2)
        scaler.step(opt, grads)
        scaler.update()
        return grads[0]

    return step


def _control(net, opt, clip=None):
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(x, y, skip):
        _, grads = grad_fn(x, y)
        if clip is not None:
            grads = ops.clip_by_global_norm(grads, clip)
        if not skip:
            opt(grads)
        return grads[0]

    return step


SCALING_CASES = {"basic": (_basic, None), "clipping_separate_unscale": (_clipping_separate_unscale, 0.2)}


def _sgd(params):
    return nn.SGD(params, learning_rate=0.05)


def _run_scaling_case(case, enabled, compiled, optimizer=_sgd):
    build, clip = SCALING_CASES[case]
    control_net, scaled_net = regression_net(), regression_net()
    control_opt, scaled_opt = optimizer(control_net.trainable_params()), optimizer(scaled_net.trainable_params())
    # PyTorch's: a modest initial scale and growth every iteration, so growth errors are magnified.
    scaler = GradScaler("cuda", init_scale=128.0, growth_factor=2.0, enabled=enabled, growth_interval=1)
    control, scaled = _control(control_net, control_opt, clip), build(scaler, scaled_net, scaled_opt)
    if compiled:
        control, scaled = ms.jit(control), ms.jit(scaled)
    for i, (x, y) in enumerate(_batches()):
        control(x, y, Tensor(enabled and i == SKIP_ITER))
        scaled(x, y, Tensor(enabled and i == SKIP_ITER))
    return scaler, (control_net, control_opt), (scaled_net, scaled_opt)


@pytest.mark.lowest
@pytest.mark.parametrize("case", sorted(SCALING_CASES))
@pytest.mark.parametrize("enabled, compiled", [(T, F), (T, T), (F, F)], ids=["eager", "jit", "disabled"])
def test_run_scaling_case(case, enabled, compiled):
    scaler, control, scaled = _run_scaling_case(case, enabled, compiled)
    assert scaler.get_scale() == (128.0 * 2.0**3 * 0.5 if enabled else 1.0)  # 3 unskipped, 1 skipped
    _same_training_state(control, scaled)


@pytest.mark.lowest
@pytest.mark.parametrize(
    "optimizer",
    [
        lambda params: nn.Adam(params, learning_rate=0.05),
        # MindSpore's PyTorch-style optimizers (what a PyTorch user reaches for), called with the gradients too
        lambda params: ms.experimental.optim.Adam(params, lr=0.05),
        lambda params: mint.optim.SGD(params, lr=0.05, momentum=0.9),
        # an LR and an average that follow global_step, which a skipped iteration must not advance
        lambda params: nn.ASGD(params, learning_rate=0.05, t0=2.0),
    ],
    ids=["adam", "experimental_adam", "mint_sgd", "asgd"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
def test_run_scaling_case_with_optimizer_state(optimizer, compiled):
    _, control, scaled = _run_scaling_case("clipping_separate_unscale", True, compiled, optimizer=optimizer)
    _same_training_state(control, scaled)  # moments and step counts untouched on the skipped iteration


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_a_scheduler_stepped_every_iteration_advances_over_a_skipped_step_as_in_pytorch(compiled):
    """PyTorch's recipe with a learning-rate scheduler: ``scaler.step(optimizer)``, ``scaler.update()``, then
    ``scheduler.step()`` every iteration, skipped or not. A PyTorch-style optimizer with its scheduler trains as
    a control run that skips the same iteration and steps its scheduler alike, and a step compiled at the first
    rate uses each rate the scheduler sets later (the last one is 0: the weights stop moving)."""
    rates = (1.0, 1.0, 1.0, 0.5, 0.0)  # of lr=0.1 per iteration; iteration SKIP_ITER (2) overflows
    runs = []
    for scaled in (False, True):
        net = regression_net()
        opt = ms.experimental.optim.SGD(net.trainable_params(), lr=0.1)
        scheduler = ms.experimental.optim.lr_scheduler.LambdaLR(  # MindSpore passes the epoch as a Tensor
            opt, lambda epoch: rates[min(int(epoch), len(rates) - 1)]
        )
        scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1) if scaled else None  # the control has none
        step = _basic(scaler, net, opt) if scaled else _control(net, opt)
        step = ms.jit(step) if compiled else step
        weights = []
        for i, (x, y) in enumerate(_batches(len(rates))):
            step(x, y, Tensor(i == SKIP_ITER))
            scheduler.step()
            weights.append(training_state(net))
        runs.append(weights)
        assert scheduler.get_last_lr()[0] == 0.0
    control, scaled = runs
    for i, (expected, actual) in enumerate(zip(control, scaled)):
        for name, value in expected.items():
            np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-7, err_msg=f"iteration {i}: {name}")
    moved = [
        not all(np.array_equal(before[name], after[name]) for name in before)
        for before, after in zip(scaled, scaled[1:])
    ]
    assert moved == [True, False, True, False]  # iterations 1-4: skipped at 2, rate 0 at 4


@pytest.mark.slow
def test_accumulation_over_two_micro_batches():
    """PyTorch's test_grad_scaling_accumulation: scale each micro-loss, step and update once per window."""
    control_net, net = regression_net(), regression_net()
    control_opt, opt = nn.SGD(control_net.trainable_params(), 0.05), nn.SGD(net.trainable_params(), 0.05)
    scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1)
    control_fn = ms.value_and_grad(control_net, None, control_opt.parameters)
    scaled_fn = _grad_fn(scaler, net, opt)
    batches = _batches(4)
    for window in (batches[:2], batches[2:]):
        total = total_control = None
        for x, y in window:
            _, grads = scaled_fn(x, y)
            _, grads_control = control_fn(x, y)
            total = grads if total is None else tuple(a + b for a, b in zip(total, grads))
            total_control = (
                grads_control if total_control is None else tuple(a + b for a, b in zip(total_control, grads_control))
            )
        scaler.step(opt, tuple(g / 2 for g in total))
        scaler.update()
        control_opt(tuple(g / 2 for g in total_control))
    assert scaler.get_scale() == 512.0
    _same_training_state(control_net, net)


@pytest.mark.lowest
@pytest.mark.parametrize("condition", [bool, Tensor], ids=["python_bool", "tensor"])
@pytest.mark.parametrize(
    "spelling",
    [{"init_loss_scaling": 1024.0, "incr_every_n_steps": 2}, {"init_scale": 1024.0, "growth_interval": 2}],
    ids=["paddle", "torch"],
)
def test_step_and_update_under_an_if_in_a_compiled_step_train_as_eagerly(spelling, condition):
    """A compiled step that steps and updates only when an argument says so (a Python bool or a bool Tensor; one
    optimizer step per window of calls), computing its gradients itself: step()'s and update()'s writes under
    that `if` reach the scaler as when the function runs eagerly, an inf batch included. (With the gradients
    given as an argument of the compiled function instead, MindSpore 2.10 dropped update()'s writes under such
    an `if`: docs/quickstart.md.)"""

    def train(compiled):
        net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
        opt = nn.SGD(net.trainable_params(), 0.1)
        scaler = GradScaler(**spelling)

        def forward(x):
            return scaler.scale(net(x).sum())

        grad_fn = ms.value_and_grad(forward, None, opt.parameters)

        def train_step(x, do_step):
            loss, grads = grad_fn(x)
            if do_step:
                scaler.step(opt, grads)
                scaler.update()
            return loss

        train_step = ms.jit(train_step) if compiled else train_step
        trajectory = []
        for index in range(8):
            x = np.full((1, 2), np.inf if index == 3 else 1.0, np.float32)
            train_step(Tensor(x), condition(index % 2 == 1)).asnumpy()
            trajectory.append((net.weight.asnumpy().tolist(), scaler.get_scale()))
        return trajectory, scaler.state_dict()

    eager, compiled = train(False), train(True)
    # The steps are the odd calls; call 3 overflows: PyTorch backs off, Paddle waits for a second bad step.
    assert [scale for _, scale in eager[0]] == (
        [1024.0] * 3 + [512.0] * 4 + [1024.0] if "growth_interval" in spelling else [1024.0] * 7 + [2048.0]
    )
    assert compiled[0] == eager[0]
    assert str(compiled[1]) == str(eager[1])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_multiple_models_optimizers_and_losses(compiled):
    """PyTorch's test_grad_scaling_multiple: two models, two optimizers, two losses from both outputs; one
    optimizer unscaled separately; inf in model 1's gradient skips optimizer 1 only and backs off once.
    Eagerly, the two keys' calls are separate compilations of the scaler's calls (the key is a constant)."""
    nets, controls = [nn.Dense(6, 3), nn.Dense(6, 3)], [nn.Dense(6, 3), nn.Dense(6, 3)]
    for index, (net, control) in enumerate(zip(nets, controls)):
        for p, c in zip(net.trainable_params(), control.trainable_params()):
            p.name, c.name = f"scaled{index}.{p.name}", f"control{index}.{c.name}"  # one graph: unique names
            p.set_data(Tensor(np.random.RandomState(index).randn(*p.shape).astype(np.float32) * 0.3))
            c.set_data(p.data.copy())
    mse = nn.MSELoss()

    def losses(m0, m1, x, y):
        out0, out1 = m0(x), m1(x)
        return mse(0.3 * out0 + 0.7 * out1, y), mse(0.6 * out0 - 0.4 * out1, y)

    scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1)
    opts = [own_names(nn.SGD(n.trainable_params(), 0.05), f"opt{i}") for i, n in enumerate(nets)]
    control_opts = [nn.SGD(c.trainable_params(), 0.05) for c in controls]
    params = opts[0].parameters + opts[1].parameters
    control_params = control_opts[0].parameters + control_opts[1].parameters

    def scaled_total(x, y):
        loss0, loss1 = losses(nets[0], nets[1], x, y)
        return scaler.scale(loss0) + scaler.scale(loss1)

    def control_total(x, y):
        loss0, loss1 = losses(controls[0], controls[1], x, y)
        return loss0 + loss1

    scaled_fn = ms.value_and_grad(scaled_total, None, params)
    control_fn = ms.value_and_grad(control_total, None, control_params)

    def step(x, y, poison):
        _, grads = scaled_fn(x, y)
        grads0, grads1 = grads[:2], grads[2:]
        grads1 = (ops.select(poison, ops.full_like(grads1[0], np.inf), grads1[0]), grads1[1])
        grads0 = scaler.unscale_(grads0, key=0)  # as an additional stress test
        skipped0 = scaler.step(opts[0], grads0, key=0)
        skipped1 = scaler.step(opts[1], grads1, key=1)
        scaler.update()
        return skipped0, skipped1

    step = ms.jit(step) if compiled else step
    for i, (x, y) in enumerate(_batches()):
        skipped = step(x, y, Tensor(i == SKIP_ITER))
        assert [bool(s.asnumpy()) for s in skipped] == [False, i == SKIP_ITER]
        _, grads = control_fn(x, y)
        control_opts[0](grads[:2])
        if i != SKIP_ITER:
            control_opts[1](grads[2:])
    assert scaler.get_scale() == 128.0 * 2.0**3 * 0.5
    for control, net in zip(controls, nets):
        for c, p in zip(control.trainable_params(), net.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), c.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=p.name)


@pytest.fixture(params=["graph_mode", "jit", "pynative"], name="run_mode")
def _run_mode(request):  # not named run_mode: a test that forgot the argument must fail, not see this function
    """How a training step runs: ``value_and_grad`` called from Python in GRAPH_MODE (which compiles the
    differentiated function), the whole step in ``mindspore.jit``, or everything eagerly in PYNATIVE_MODE."""
    if request.param == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.slow
def test_gradient_penalty(run_mode):
    """PyTorch's test_grad_scaling_penalty, written as PyTorch's recipe (``inv_scale = 1. / scaler.get_scale()``):
    a penalty on the (unscaled) gradient norm, computed from the scaled loss's gradients, gives the same
    training as without scaling. The scale grows on every clean iteration, so in a compiled function
    ``get_scale()`` must read the scale when the graph runs, not when it was compiled."""
    batches = _batches()

    def penalised(net, scaler=None):
        opt = nn.SGD(net.trainable_params(), 0.05)
        params = opt.parameters

        def loss_fn(x, y):
            return net(x, y) if scaler is None else scaler.scale(net(x, y))

        inner = ms.grad(loss_fn, None, params)

        def total(x, y):
            grads = inner(x, y)
            if scaler is not None:
                inv_scale = 1.0 / scaler.get_scale()
                grads = tuple(g * inv_scale for g in grads)
            norm = ops.sqrt(sum(ops.reduce_sum(g * g) for g in grads))
            loss = net(x, y) + norm
            return loss if scaler is None else scaler.scale(loss)

        return opt, ms.value_and_grad(total, None, params)

    control_net, scaled_net = regression_net(), regression_net()
    control_opt, control_fn = penalised(control_net)
    scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1)
    opt, scaled_fn = penalised(scaled_net, scaler)

    def train_step(x, y, poisoned):
        _, grads = scaled_fn(x, y)
        scaler.step(opt, _poison(grads, poisoned))
        scaler.update()
        return scaler.get_scale()

    train_step = ms.jit(train_step) if run_mode == "jit" else train_step
    scales = []
    for i, (x, y) in enumerate(batches):
        _, grads = control_fn(x, y)
        if i != SKIP_ITER:
            control_opt(grads)
        scales.append(float(train_step(x, y, Tensor(i == SKIP_ITER))))
    assert scales == [256.0, 512.0, 256.0, 512.0]
    _same_training_state(control_net, scaled_net, rtol=1e-4, atol=1e-6)


def test_reads_in_a_compiled_function_follow_the_scale_and_the_rule():
    """``get_scale()``, Paddle's ``get_loss_scaling()``, Keras' ``loss_scale`` and ``dynamic_counter`` and the rule
    getters are host values eagerly and graph reads inside ``mindspore.jit``: a scale, counter or rule changed
    after the compilation is what the next call sees."""
    torch_scaler, paddle_scaler = GradScaler("cpu", init_scale=16.0), GradScaler(init_loss_scaling=8.0)
    disabled = GradScaler("cpu", enabled=False)
    net = nn.Dense(2, 1)
    keras = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=32.0)

    def values(one):
        return (
            one / torch_scaler.get_scale(),
            one / paddle_scaler.get_loss_scaling(),
            one / keras.loss_scale,
            one / disabled.get_scale(),
            one / disabled.get_loss_scaling(),
            one * torch_scaler.get_growth_factor(),
            one * torch_scaler.get_backoff_factor(),
            one * torch_scaler.get_growth_interval(),
            one * paddle_scaler.get_decr_every_n_nan_or_inf(),
            one * keras.dynamic_counter,
        )

    compiled = ms.jit(values)

    def read(function):
        return [float(value.asnumpy()) for value in function(Tensor(1.0, ms.float32))]

    keras.get_scaled_loss(Tensor(1.0, ms.float32))
    keras.apply_gradients(
        keras.get_unscaled_gradients((Tensor(np.ones((1, 2), np.float32)), Tensor(np.zeros(1, np.float32))))
    )  # a clean step
    assert read(compiled) == read(values) == [1 / 16, 1 / 8, 1 / 32, 1.0, 1.0, 2.0, 0.5, 2000.0, 2.0, 1.0]
    assert (
        torch_scaler.get_scale(),
        torch_scaler.get_growth_factor(),
        torch_scaler.get_growth_interval(),
        paddle_scaler.get_decr_every_n_nan_or_inf(),
        keras.dynamic_counter,
    ) == (16.0, 2.0, 2000, 2, 1)
    assert type(keras.dynamic_counter) is int  # eagerly Python numbers
    torch_scaler.update(new_scale=4.0)
    torch_scaler.set_growth_factor(4.0)
    torch_scaler.set_backoff_factor(0.25)
    torch_scaler.set_growth_interval(7)
    paddle_scaler.set_init_loss_scaling(2.0)
    paddle_scaler.set_decr_every_n_nan_or_inf(3)
    overflowed = (Tensor(np.full((1, 2), np.inf, np.float32)), Tensor(np.zeros(1, np.float32)))
    keras.get_scaled_loss(Tensor(1.0, ms.float32))
    keras.apply_gradients(keras.get_unscaled_gradients(overflowed))  # skipped: the scale backs off
    assert read(compiled) == read(values) == [1 / 4, 1 / 2, 1 / 16, 1.0, 1.0, 4.0, 0.25, 7.0, 3.0, 0.0]


@pytest.mark.slow
def test_scale_will_not_overflow():
    """PyTorch's test_grad_scale_will_not_overflow: init 1e38, growth 16 every step: the scale stays finite."""
    scaler = GradScaler("cuda", growth_interval=1, growth_factor=2.0**4, init_scale=1e38)
    net = regression_net()
    opt = nn.Adam(net.trainable_params())
    for x, y in _batches(2):
        _, grads = _grad_fn(scaler, net, opt)(x, y)
        scaler.step(opt, grads)
        scaler.update()
    assert np.isfinite(scaler.get_scale())


def test_scale_nested_outputs():
    """PyTorch's test_grad_scaling_scale: a tensor, and tuples/lists of them nested, all scaled."""
    scaler = GradScaler("cuda", init_scale=2.0)
    t0, t1 = Tensor(np.float32(4.0)), Tensor(np.float16(3.0))
    outputs = scaler.scale((t1, (t1, t0), [t0, (t1,)]))
    flat = [outputs[0], outputs[1][0], outputs[1][1], outputs[2][0], outputs[2][1][0]]
    assert [float(o.asnumpy()) for o in flat] == [6.0, 6.0, 8.0, 8.0, 6.0]
    assert all(o.dtype == ms.float32 for o in flat)
    assert [type(o) for o in (outputs, outputs[1], outputs[2], outputs[2][1])] == [tuple, tuple, list, tuple]


@pytest.mark.parametrize(
    "outputs, shown",
    [
        (2.0, "float 2.0"),
        (3, "int 3"),
        (None, "NoneType None"),
        ("loss", "str 'loss'"),
        ({"loss": 1}, "dict"),
        ((Tensor(np.float32(1.0)), 2.0), "float 2.0"),
        (np.float32(2.0), "float"),
        (np.ones(2, np.float32), "ndarray"),
    ],
    ids=["float", "int", "None", "str", "dict", "nested_float", "numpy_scalar", "numpy_array"],
)
@pytest.mark.parametrize("spelling", [(), ("cpu",)], ids=["paddle", "pytorch"])
def test_scale_refuses_python_values_with_a_clear_error(outputs, shown, spelling):
    """MindSpore's own error names a primitive (``Dtype``), eagerly, and an attribute, under jit; ours names what
    came (under jit a NumPy scalar is a Python float already)."""
    scaler = GradScaler(*spelling)
    message = f"'outputs' must be a Tensor .* but got {re.escape(shown)}"
    with pytest.raises(TypeError, match=message):
        scaler.scale(outputs)

    @ms.jit
    def compiled():
        return scaler.scale(outputs)

    with pytest.raises(TypeError, match=message):
        compiled()
    assert scaler.get_scale() == (32768.0 if not spelling else 65536.0)


# ---- spelling, defaults, signatures -------------------------------------------------------------------

SPELLINGS = [
    ((), {}, GradScaler, 32768.0, 2),
    ((), {"init_loss_scaling": 1024}, GradScaler, 1024.0, 2),
    ((True, 64.0), {}, GradScaler, 64.0, 2),
    (("cuda",), {}, TorchGradScaler, 65536.0, 1),
    (("cpu", 8.0), {}, TorchGradScaler, 8.0, 1),
    ((), {"init_scale": 256.0}, TorchGradScaler, 256.0, 1),
    ((), {"growth_interval": 10}, TorchGradScaler, 65536.0, 1),
    ((), {"enabled": True}, TorchGradScaler, 65536.0, 1),
]


@pytest.mark.parametrize("args, kwargs, cls, scale, bad_steps_per_backoff", SPELLINGS)
def test_each_spelling_gets_its_framework(args, kwargs, cls, scale, bad_steps_per_backoff):
    scaler = GradScaler(*args, **kwargs)
    assert type(scaler) is cls and isinstance(scaler, GradScaler)
    assert scaler.get_scale() == scale and scaler.get_decr_every_n_nan_or_inf() == bad_steps_per_backoff


def test_defaults_are_the_frameworks():
    paddle, torch = GradScaler(), GradScaler("cuda")
    assert (
        paddle.get_init_loss_scaling(),
        paddle.get_incr_ratio(),
        paddle.get_decr_ratio(),
        paddle.get_incr_every_n_steps(),
        paddle.get_decr_every_n_nan_or_inf(),
        paddle.is_use_dynamic_loss_scaling(),
        paddle.is_enable(),
    ) == (32768.0, 2.0, 0.5, 1000, 2, True, True)
    assert (
        torch.get_scale(),
        torch.get_growth_factor(),
        torch.get_backoff_factor(),
        torch.get_growth_interval(),
        torch.is_enabled(),
    ) == (65536.0, 2.0, 0.5, 2000, True)
    # the rules: PyTorch backs off on every overflow and has no floor; Paddle after 2 consecutive ones
    assert torch._policy == get_preset("pytorch") and paddle._policy == get_preset("paddle")


def test_signatures_show_real_defaults():
    for cls, expected in (
        (GradScaler, {"enable": True, "init_loss_scaling": 32768.0, "incr_every_n_steps": 1000}),
        (TorchGradScaler, {"device": "cuda", "init_scale": 65536.0, "growth_interval": 2000}),
    ):
        signature = inspect.signature(cls)
        assert "object at" not in str(signature)
        assert {name: signature.parameters[name].default for name in expected} == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable": True, "enabled": True},
        {"init_loss_scaling": 8.0, "init_scale": 8.0},
        {"incr_ratio": 3.0, "growth_interval": 5},
        {"enable": False, "device": "cuda"},
    ],
)
def test_mixing_spellings_is_refused(kwargs):
    with pytest.raises(ValueError, match="PyTorch's spelling .* and Paddle's"):
        GradScaler(**kwargs)


# every public argument with bad values: (constructor kwargs, error, pattern); range errors of the ratios
# are also AssertionErrors, as PyTorch's and Paddle's asserts are
BAD_ARGUMENTS = [
    ({"enable": "yes"}, TypeError, "'enable' must be a bool"),
    ({"enable": 1}, TypeError, "'enable' must be a bool"),
    ({"use_dynamic_loss_scaling": None}, TypeError, "'use_dynamic_loss_scaling'"),
    ({"init_loss_scaling": 0.0}, ValueError, "'init_loss_scaling'.*0.0"),
    ({"init_loss_scaling": -1.0}, ValueError, "'init_loss_scaling'.*-1.0"),
    ({"init_loss_scaling": float("nan")}, ValueError, "'init_loss_scaling'.*nan"),
    ({"init_loss_scaling": float("inf")}, ValueError, "'init_loss_scaling'.*inf"),
    ({"init_loss_scaling": "1024"}, TypeError, "'init_loss_scaling'.*str"),
    ({"init_loss_scaling": True}, TypeError, "'init_loss_scaling'.*bool"),
    ({"incr_ratio": 1.0}, AssertionError, "'incr_ratio'.*1.0"),
    ({"incr_ratio": 0.5}, ValueError, "'incr_ratio'.*0.5"),
    ({"incr_ratio": float("inf")}, ValueError, "'incr_ratio'.*inf"),
    ({"decr_ratio": 1.0}, AssertionError, "'decr_ratio'.*1.0"),
    ({"decr_ratio": 0.0}, ValueError, "'decr_ratio'.*0.0"),
    ({"decr_ratio": 1e-50}, ValueError, "'decr_ratio'"),
    ({"incr_every_n_steps": 0}, ValueError, "'incr_every_n_steps'.*0"),
    ({"incr_every_n_steps": 2.5}, TypeError, "'incr_every_n_steps'.*float"),
    ({"incr_every_n_steps": True}, TypeError, "'incr_every_n_steps'.*bool"),
    ({"decr_every_n_nan_or_inf": 0}, ValueError, "'decr_every_n_nan_or_inf'.*0"),
    ({"policy": "tensorflow"}, ValueError, "'preset'.*'tensorflow'"),
    ({"policy": 3}, TypeError, "'policy'"),
    ({"policy": "pytorch", "incr_ratio": 3.0}, ValueError, "either 'policy' or the rule arguments"),
    ({"name": ""}, ValueError, "'name'"),
    ({"name": "a b"}, ValueError, "'name'"),
    ({"overflow_check": "tpu"}, ValueError, "'overflow_check'"),
    ({"device": 0}, TypeError, "'device' must be a str"),
    ({"init_scale": -2.0}, ValueError, "'init_scale'.*-2.0"),
    ({"growth_factor": 0.9}, AssertionError, "'growth_factor'.*0.9"),
    ({"backoff_factor": 1.5}, AssertionError, "'backoff_factor'.*1.5"),
    ({"growth_interval": -1}, ValueError, "'growth_interval'.*-1"),
    ({"enabled": "no"}, TypeError, "'enabled' must be a bool"),
    ({"backoff_factor": None}, TypeError, "'backoff_factor' must be a number, but got None"),
    ({"decr_ratio": None}, TypeError, "'decr_ratio' must be a number, but got None"),
]


@pytest.mark.parametrize("kwargs, error, pattern", BAD_ARGUMENTS, ids=[str(c[0]) for c in BAD_ARGUMENTS])
def test_bad_arguments_are_refused(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        GradScaler(**kwargs)


def test_policy_argument_accepts_presets():
    scaler = GradScaler(policy="pytorch")
    assert scaler.get_scale() == 65536.0 and scaler._policy == get_preset("pytorch")
    assert type(GradScaler.from_preset("pytorch")) is TorchGradScaler
    assert GradScaler.from_preset("megatron").get_decr_every_n_nan_or_inf() == 2


# ---- the rule: trajectories and skips, eager and compiled --------------------------------------------------


def paddle_rule(flags, scale, incr_n, decr_n):
    """Paddle's dygraph AmpScaler._update, written from its source."""
    scale, incr, decr, out = np.float32(scale), 0, 0, []
    for found_inf in flags:
        if found_inf:
            incr, decr = 0, decr + 1
            if decr == decr_n:
                scale, decr = np.float32(scale * np.float32(0.5)), 0
        else:
            decr, incr = 0, incr + 1
            if incr == incr_n:
                scale, incr = np.float32(scale * np.float32(2.0)), 0
        out.append(float(scale))
    return out


TRAJECTORY_CASES = [  # (constructor, expected scale trajectory for the flags)
    (
        lambda: GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=2),
        lambda flags: paddle_rule(flags, 2.0**10, 2, 2),
    ),
    (
        lambda: GradScaler("cuda", init_scale=2.0**10, growth_interval=2),
        lambda flags: [s.scale for s in run(get_preset("pytorch", init_scale=2.0**10, growth_interval=2), flags)],
    ),
]
FLAGS = [F, T, F, T, T, T, F, F, F]


@pytest.mark.parametrize("case", range(len(TRAJECTORY_CASES)), ids=["paddle", "pytorch"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_trajectory_and_skips_follow_the_rule(case, compiled):
    make, expected = TRAJECTORY_CASES[case]
    scaler = make()
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    grad_fn = _grad_fn(scaler, net, opt)

    def train_step(x, y):
        _, grads = grad_fn(x, y)
        return scaler.minimize(opt, grads)

    train_step = ms.jit(train_step) if compiled else train_step
    scales = []
    for flag, (x, y) in zip(FLAGS, regression_batches(len(FLAGS))):
        if flag:
            x = with_inf(x)
        before = training_state(net)
        assert bool(train_step(Tensor(x), Tensor(y)).asnumpy()) == flag
        assert (changed_since(before, net) == []) == flag  # skipped: nothing changed
        scales.append(scaler.get_scale())
    assert scales == expected(FLAGS)


@pytest.mark.lowest
def test_eager_and_compiled_give_identical_training():
    results = []
    for compiled in (False, True):
        scaler = GradScaler("cuda", init_scale=2.0**12, growth_interval=2)
        net = regression_net()
        opt = nn.Adam(net.trainable_params(), 0.01)
        step = _clipping_separate_unscale(scaler, net, opt)
        step = ms.jit(step) if compiled else step
        for i, (x, y) in enumerate(_batches(5)):
            step(x, y, Tensor(i == 3))
        results.append((scaler.state_dict(), training_state(net)))
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(results[1][1][name], value, err_msg=name)


@pytest.mark.slow
def test_paddle_fixed_scale_skips_and_update_ends_each_iteration():
    """Steps with inf/nan are skipped at a fixed scale; update() (or minimize) ends the iteration as with a dynamic
    scale (Paddle's step() ends it by itself): a second step() without update() is refused, applying nothing."""
    scaler = GradScaler(init_loss_scaling=64.0, use_dynamic_loss_scaling=False)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    grad_fn = _grad_fn(scaler, net, opt)
    x, y = regression_batches(1)[0]
    bad = x.copy()
    bad[0, 0] = np.nan
    for inputs, expected in ((bad, True), (x, False), (bad, True), (x, False)):
        _, grads = grad_fn(Tensor(inputs), Tensor(y))
        assert bool(scaler.step(opt, grads).asnumpy()) == expected
        scaler.update()  # changes nothing of a fixed scale
    before = training_state(net)
    scaler.step(opt, grads)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update"):
        scaler.step(opt, grads)
    assert changed_since(before, net) == [name for name in sorted(before) if "global_step" not in name]
    assert scaler.get_scale() == 64.0 and not scaler.is_use_dynamic_loss_scaling()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_paddle_fixed_scale_two_optimizers_unscaled_before_their_steps_train_as_the_control(compiled):
    """Paddle's step() at a fixed scale ends the iteration for every optimizer, so the second optimizer's unscaled
    gradients were divided again (a 1/S update); here each optimizer's step applies its own unscaled gradients."""
    scaler = GradScaler(init_loss_scaling=1024.0, use_dynamic_loss_scaling=False)
    net, control_net = regression_net(), regression_net()
    params = net.trainable_params()
    first, last = own_names(nn.SGD(params[:2], 0.05), "first"), own_names(nn.SGD(params[2:], 0.05), "last")
    grad_fn = _grad_fn(scaler, net, nn.SGD(params, 0.05))
    control = _control(control_net, nn.SGD(control_net.trainable_params(), 0.05))

    def step(x, y):
        _, grads = grad_fn(x, y)
        firsts, lasts = scaler.unscale_(grads[:2]), scaler.unscale_(grads[2:])
        skipped = ops.logical_or(scaler.step(first, firsts), scaler.step(last, lasts))
        scaler.update()
        return skipped

    step = ms.jit(step) if compiled else step
    for x, y in _batches(2):
        assert not bool(_read(step(x, y)).asnumpy())
        control(x, y, False)
    _same_training_state(control_net, net)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("unscale_first", [False, True], ids=["step", "unscale_step"])
@pytest.mark.slow
def test_non_finite_loss_skips_the_step_and_backs_off(compiled, unscale_first):
    scaler = GradScaler("cuda", init_scale=64.0)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)

    def forward(x, y, offset):
        return scaler.scale(net(x, y) + offset)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def train_step(x, y, offset):
        _, grads = grad_fn(x, y, offset)
        if unscale_first:
            grads = scaler.unscale_(grads)
        skipped = scaler.step(opt, grads)
        scaler.update()
        return skipped

    train_step = ms.jit(train_step) if compiled else train_step
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    before = training_state(net)
    assert bool(train_step(x, y, Tensor(np.float32(np.inf))).asnumpy())  # finite gradients, non-finite loss
    assert scaler.get_scale() == 32.0 and changed_since(before, net) == []
    assert not bool(train_step(x, y, Tensor(np.float32(0.0))).asnumpy())  # the next iteration starts clean
    assert scaler.get_scale() == 32.0 and changed_since(before, net) != []


# ---- regression tests of the 0.1.0 front-end ---------------------------------------------------------------


@pytest.mark.slow
def test_recompiling_and_other_compiled_functions_never_raise():
    """0.1.0 raised 'unscale_() after step()' on any recompilation (its tracker keyed compilations by a
    MindSpore frame id): a last batch of another size, a second jit function, a compile after a failed one."""
    scaler = GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = ms.jit(_clipping_separate_unscale(scaler, net, opt))
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
    [(True, False), (False, True), (True, True)],
    ids=["unscale_compiled", "step_compiled", "both_compiled"],
)
def test_an_iteration_split_between_compiled_functions_and_python_trains_as_eagerly(compiled_halves):
    """``unscale_`` in one function, clipping in Python, ``step``+``update`` in another, each compiled or not: the
    iteration's state (what was unscaled, what overflowed) is in Parameters, so the halves agree wherever they
    run. Same skips, scales and weights as the all-eager run, with an inf and a nan batch."""

    def train(halves):
        scaler = GradScaler("cuda", init_scale=1024.0, growth_interval=2)
        net = regression_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        grad_fn = _grad_fn(scaler, net, opt)

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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("clamp", ["clip_by_value", "nan_to_num"])
@pytest.mark.slow
def test_step_skips_when_unscale_found_inf_even_if_gradients_were_clamped(compiled, clamp):
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=1024.0)

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

    train_step = ms.jit(train_step) if compiled else train_step
    x, y = regression_batches(1)[0]
    x = with_inf(x)
    before = training_state(net)
    assert bool(train_step(Tensor(x), Tensor(y)).asnumpy())
    assert changed_since(before, net) == []
    assert scaler.get_scale() == 512.0  # backed off once


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
        step = ms.jit(step) if compiled else step
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
        apply = ms.jit(apply) if compiled else apply
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
    grad_fn = ms.jit(grad_fn) if compiled else grad_fn
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
        step = ms.jit(apply) if compiled else apply
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
    grad_fn = _grad_fn(scaler, net, opt)

    def iteration(x):
        _, grads = grad_fn(x)
        grads = tuple(grad.astype(cast_to) for grad in scaler.unscale_(grads))
        skipped = scaler.step(opt, ops.clip_by_global_norm(grads, 100.0))
        scaler.update()
        return skipped

    before = net.w.asnumpy().astype(np.float32)
    skipped = (ms.jit(iteration) if compiled else iteration)(Tensor(np.ones((1, 2), np.float32)))
    assert not bool(skipped)
    np.testing.assert_allclose(before - net.w.asnumpy().astype(np.float32), np.full((2, 2), 0.25), rtol=2e-3)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
        grad_fn = _grad_fn(scaler, net, opt)

        def iteration(x, y):
            _, grads = grad_fn(x, y)
            grads = scaler.unscale_(grads)
            edited = [ops.clip_by_value(grads[0], -0.1, 0.1)] + list(grads[1:])
            skipped = scaler.step(opt, edited if as_list else tuple(edited))
            scaler.update()
            return skipped

        step = ms.jit(iteration) if compiled else iteration
        for x, y in _batches(2):
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


@pytest.mark.lowest
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("misuse", MISUSES)
def test_misuse_is_refused_before_any_wrong_update(compiled, misuse):
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    function, pattern = _misuse_cases(scaler, opt, _grad_fn(scaler, net, opt))[misuse]
    function = ms.jit(function) if compiled else function
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    before = training_state(net)
    with pytest.raises(RuntimeError, match=pattern):
        _read(function(x, y))
    applied = changed_since(before, net) != []
    assert applied == misuse.startswith(("step_twice", "unscale_after_step"))  # the first step was right
    assert scaler.get_scale() == 1024.0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_two_optimizers_clipped_together_train_as_the_control(compiled):
    """The recipe the slice refusals point to: unscale_() each optimizer's own gradients, clip them together, step
    each optimizer with its part; equal to unscale, clip, apply without scaling."""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net, control_net = regression_net(), regression_net()
    params = net.trainable_params()
    first, last = own_names(nn.SGD(params[:2], 0.05), "first"), own_names(nn.SGD(params[2:], 0.05), "last")
    grad_fn = _grad_fn(scaler, net, nn.SGD(params, 0.05))
    control_opt = nn.SGD(control_net.trainable_params(), 0.05)
    control = _control(control_net, control_opt, clip=0.2)

    def step(x, y):
        _, grads = grad_fn(x, y)
        grads = ops.clip_by_global_norm(scaler.unscale_(grads[:2]) + scaler.unscale_(grads[2:]), 0.2)
        skipped = ops.logical_or(scaler.step(first, grads[:2]), scaler.step(last, grads[2:]))
        scaler.update()
        return skipped

    step = ms.jit(step) if compiled else step
    for x, y in _batches(3):
        assert not bool(_read(step(x, y)).asnumpy())
        control(x, y, False)
    assert scaler.get_scale() == 1024.0
    _same_training_state(control_net, net)


@pytest.mark.slow
def test_an_eager_step_compiled_before_a_related_structure_was_seen_refuses_it():
    """Called from Python, step() of a slice compiles once per structure: unscale_() of the whole tuple, first seen
    after that compilation, is still refused before anything is applied (checked on the host)."""
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=1024.0)
    first = own_names(nn.SGD(opt.parameters[:2], 0.05), "first")
    x, y = _batches(1)[0]
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
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=1024.0)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    _, grads = grad_fn(x, y)
    unscaled = scaler.unscale_(_poison(grads, Tensor(True)))
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        _read(scaler.unscale_(grad_fn(x, y)[1]))  # clean gradients, refused
    before = training_state(net)
    assert bool(_read(scaler.step(opt, tuple(ops.clip_by_value(g, -1.0, 1.0) for g in unscaled))))  # still skipped
    assert changed_since(before, net) == []
    assert scaler.update().get_scale() == 512.0
    _, grads = grad_fn(x, y)
    assert not bool(_read(scaler.step(opt, grads)))
    after_step = training_state(net)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step"):
        _read(scaler.unscale_(grads))
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update"):
        _read(scaler.step(opt, grads))
    assert changed_since(after_step, net) == []


def _unscale_then_step(scaler, net, opt):
    """``step(x, y) -> skipped``: ``unscale_`` the gradients, pass what it returns to ``step``, ``update``."""
    grad_fn = _grad_fn(scaler, net, opt)

    def step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, scaler.unscale_(grads))
        scaler.update()
        return skipped

    return step


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
    scaled, control = _unscale_then_step(scaler, net, opt), _control(control_net, control_opt)
    if compiled:
        control, scaled = ms.jit(control), ms.jit(scaled)
    for x, y in _batches():
        control(x, y, Tensor(False))
        assert not bool(_read(scaled(x, y)))
    assert scaler.get_scale() == 1.0
    _same_training_state((control_net, control_opt), (net, opt))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_unscale_then_step_with_all_zero_gradients_is_not_refused(compiled):
    """All-zero gradients (a loss already at its minimum) are the same scaled and unscaled: step() after unscale_()
    must not take them for the scaled gradients unscale_() was given."""
    net = nn.WithLossCell(nn.Dense(2, 1, weight_init="zeros", bias_init="zeros"), nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), 0.05)
    scaler = GradScaler("cuda", init_scale=1024.0)
    step = _unscale_then_step(scaler, net, opt)
    step = ms.jit(step) if compiled else step
    x, y = Tensor(np.ones((4, 2), np.float32)), Tensor(np.zeros((4, 1), np.float32))
    for _ in range(2):
        assert not bool(_read(step(x, y)))
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("transform", sorted(NORM_KEEPING))
@pytest.mark.slow
def test_changes_between_unscale_and_step_that_keep_the_norm_train_as_a_control(transform, compiled):
    change = NORM_KEEPING[transform]
    scaler = GradScaler("cuda", init_scale=1024.0)
    net, control_net = regression_net(), regression_net()
    opt, control_opt = nn.SGD(net.trainable_params(), 0.05), nn.SGD(control_net.trainable_params(), 0.05)
    grad_fn, control_fn = _grad_fn(scaler, net, opt), ms.value_and_grad(control_net, None, control_opt.parameters)

    def step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, change(scaler.unscale_(grads)))
        scaler.update()
        return skipped

    step = ms.jit(step) if compiled else step
    for x, y in _batches(2):
        assert not bool(_read(step(x, y)).asnumpy())
        control_opt(change(control_fn(x, y)[1]))
    _same_training_state(control_net, net)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_gradients_raised_beyond_the_norm_slack_after_unscale_are_refused(compiled):
    """The refusal of scaled gradients changed after unscale_() compares global norms with a slack of 1.01 (for
    float16 rounding): 1.02 times the unscaled gradients is refused before anything is applied, 1.005 times trains
    (NORM_KEEPING)."""
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=1024.0)

    def step(x, y):
        _, grads = grad_fn(x, y)
        return scaler.step(opt, _raised_beyond_the_slack(scaler.unscale_(grads)))

    step = ms.jit(step) if compiled else step
    before = training_state(net)
    with pytest.raises(RuntimeError, match="larger global norm than the ones unscale_"):
        _read(step(*_batches(1)[0]))
    assert changed_since(before, net) == []


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_scaled_float64_gradients_after_unscale_are_refused(compiled):
    """Their fingerprint was 0, so the refusal never fired and S-times gradients were applied."""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = Float64Regression()
    opt = PlainSGD(0.05, net.trainable_params())
    function, pattern = _misuse_cases(scaler, opt, _grad_fn(scaler, net, opt))["dropped_returned_gradients"]
    function = ms.jit(function) if compiled else function
    rng = np.random.RandomState(0)
    before = training_state(net)
    with pytest.raises(RuntimeError, match=pattern):
        _read(function(Tensor(rng.randn(4, 6)), Tensor(rng.randn(4, 3))))
    assert changed_since(before, net) == []


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_step_skips_gradients_made_non_finite_after_a_clean_unscale(compiled):
    """A deliberate difference (docs/migration.md): PyTorch applies them (its
    test_params_invalidated_with_grads_invalidated_between_unscale_and_step sees the weights become nan). Here step()
    skips, and the iteration counts as overflowed: update() backs off."""
    scaler = GradScaler("cuda", init_scale=1024.0)
    net = regression_net()
    opt = _sgd(net.trainable_params())
    grad_fn = _grad_fn(scaler, net, opt)

    def train_step(x, y):
        _, grads = grad_fn(x, y)
        skipped = scaler.step(opt, _poison(scaler.unscale_(grads), Tensor(True)))
        scaler.update()
        return skipped

    x, y = _batches(1)[0]
    before = training_state(net)
    assert bool(_read((ms.jit(train_step) if compiled else train_step)(x, y)))
    assert changed_since(before, net) == [] and scaler.get_scale() == 512.0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_a_refused_step_of_a_fixed_paddle_scaler_leaves_its_iteration_open(compiled):
    """With Paddle's fixed scale, step() itself ends the iteration (update() does nothing then). A refused step()
    must not: the corrected step() of the same iteration takes its gradients as the unscaled ones unscale_()
    returned. Ending the iteration anyway (nothing tested it) made that step divide them by S a second time."""
    scaler = GradScaler(init_loss_scaling=1024.0, use_dynamic_loss_scaling=False)
    net, control_net = regression_net(), regression_net()
    opt, control_opt = _sgd(net.trainable_params()), _sgd(control_net.trainable_params())
    x, y = _batches(1)[0]
    _, scaled = _grad_fn(scaler, net, opt)(x, y)
    unscaled = scaler.unscale_(scaled)

    def refused_step(grads):
        return scaler.step(opt, grads)

    def corrected_step(grads):  # another function: a compiled function that raised fails at every later call
        return scaler.step(opt, grads)

    if compiled:
        refused_step, corrected_step = ms.jit(refused_step), ms.jit(corrected_step)
    with pytest.raises(RuntimeError, match=r"step\(\) got the scaled gradients"):
        _read(refused_step(scaled))
    assert not bool(_read(corrected_step(unscaled)))
    control_opt(ms.value_and_grad(control_net, None, control_opt.parameters)(x, y)[1])
    _same_training_state((net, opt), (control_net, control_opt))


@pytest.mark.slow
def test_correct_use_right_after_a_refused_one():
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=1024.0)
    function, _ = _misuse_cases(scaler, opt, grad_fn)["dropped_returned_gradients"]
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    with pytest.raises(RuntimeError):
        _read(ms.jit(function)(x, y))
    scaler.update()  # end the broken iteration
    step = ms.jit(_clipping_separate_unscale(scaler, net, opt))
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
        _read((ms.jit(run) if compiled else run)(argument_value))
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
            _read((ms.jit(run) if compiled else run)(Tensor(np.float32(1.0))))
    assert changed_since(before, net) == []
    for scaler in (torch_scaler, paddle_scaler):
        assert scaler._states.between_iterations() and scaler.get_scale() == 8.0
    assert float(keras.loss_scale.asnumpy()) == 8.0 and int(keras.iterations) == 0
    return calls


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("call", ["unscale_", "step", "minimize", "apply_gradients", "call"])
def test_no_gradients_at_all_are_refused(compiled, call):
    """An empty tuple where the gradients go: a ValueError naming the argument (was an IndexError from unscale_,
    MindSpore's "cannot get item by index from an empty sequence" from apply_gradients and the wrapper's call,
    after warning that the loss was not scaled), nothing recorded or applied; get_unscaled_gradients(()) returns
    () as Keras' returns []."""
    calls = _refused_before_anything_happens(call, (), compiled, ValueError, "'{argument}' holds no gradients")
    get_unscaled_gradients = calls["get_unscaled_gradients"][0]

    def run(x):
        return x, get_unscaled_gradients(())

    assert (ms.jit(run) if compiled else run)(Tensor(np.float32(1.0)))[1] == ()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
    and the entry (was MindSpore's "For 'MultitypeFuncGraph', the input can not be numpy.ndarray", with the
    LossScaleOptimizer's usage warning and an analyzer dump first, or "Failed calling NotEqual"), before
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
    the run ends where an uninterrupted one does (was: the failed step stayed recorded, the retry was refused
    as a second step and update() counted an iteration whose step never happened)."""
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
        for x, y in _batches(2):
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


def _eager_sparse_gradient():
    """A sparse gradient as ``mindspore.value_and_grad`` returns it outside a graph: the tuple (indices, values,
    dense shape) of an ``nn.EmbeddingLookup(sparse=True)``'s RowTensor."""
    lookup = nn.EmbeddingLookup(10, 1, target="CPU", sparse=True)

    def loss(ids):
        return lookup(ids).sum()

    grad = ms.value_and_grad(loss, None, lookup.trainable_params())(Tensor(np.array([1, 3], np.int32)))[1][0]
    assert isinstance(grad, tuple) and grad[2] == (10, 1)  # what the refusal recognises
    return grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("call", ["unscale_", "step", "apply_gradients", "get_unscaled_gradients"])
def test_sparse_gradients_are_refused_saying_so(compiled, call):
    """nn.EmbeddingLookup(sparse=True)'s gradient, which MindSpore returns eagerly as the tuple (indices, values,
    dense shape): a TypeError saying it is sparse and what to use instead (was "must be a gradient Tensor, but got
    a tuple: give the weights' gradients as one flat tuple", advice that does not apply), before anything is
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("call", ["unscale_", "step", "apply_gradients", "call"])
def test_gradients_of_inputs_and_weights_together_are_refused(compiled, call):
    """What mindspore.value_and_grad with grad_position=0 and weights returns, (inputs' gradients, weights'
    gradients), passed whole: a TypeError saying to pass the second (the LossScaleOptimizer, which takes Keras'
    pairs, read it as pairs and failed with an IndexError), before anything is applied or recorded."""

    def nested(parameters):
        return (Tensor(np.ones((2, 1), np.float32)),), tuple(Tensor(np.ones(p.shape, np.float32)) for p in parameters)

    _refused_before_anything_happens(call, nested, compiled, TypeError, "pass the second")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("call", ["step", "minimize"])
@pytest.mark.parametrize("weight_decay", [0.01, 0.0], ids=["decay", "no_decay"])
@pytest.mark.slow
def test_gradients_of_other_parameters_are_refused_before_the_step_is_recorded(compiled, call, weight_decay):
    """Gradients taken in the network's order for an optimizer that lists its groups in turn. Eagerly a ValueError
    naming the shapes (was MindSpore's 'For AddN, input shape must be same' (weight decay) or a kernel's shape
    error from inside the optimizer, after the step was recorded, so the corrected step of the same iteration
    was refused as a second one). Compiled, MindSpore refuses them while compiling, before anything runs
    (with or without weight decay): the corrected step of the same iteration works too."""
    scaler = GradScaler("cpu", init_scale=1024.0)
    net = regression_net()
    opt = group_optimizer(net, weight_decay=weight_decay)
    x, y = _batches(1)[0]

    def forward(a, b):
        return scaler.scale(net(a, b))

    network_order = ms.value_and_grad(forward, None, ms.ParameterTuple(net.trainable_params()))
    optimizer_order = ms.value_and_grad(forward, None, opt.parameters)

    def apply(grad_fn):
        def step(a, b):
            _, grads = grad_fn(a, b)
            return scaler.step(opt, grads) if call == "step" else scaler.minimize(opt, grads)

        return ms.jit(step) if compiled else step

    before = training_state(net)
    pattern = (
        r"'grads' must hold one gradient per parameter of the optimizer, in the order of optimizer.parameters "
        r".*\(8, 6\), \(8,\), \(3, 8\), \(3,\)"
    )
    with pytest.raises((ValueError, RuntimeError), match=r"shape|resize failed" if compiled else pattern):
        _read(apply(network_order)(x, y))
    assert changed_since(before, net) == []
    assert scaler._states.between_iterations() and scaler.get_scale() == 1024.0
    assert not bool(_read(apply(optimizer_order)(x, y)))  # the same iteration, corrected: not a second step
    if call == "step":
        scaler.update()
    control_net = regression_net()
    control_opt = group_optimizer(control_net, weight_decay=weight_decay)
    control = GradScaler("cpu", init_scale=1024.0)
    _, grads = _grad_fn(control, control_net, control_opt)(x, y)
    control.step(control_opt, grads)
    control.update()
    _same_training_state(net, control_net, rtol=0, atol=0)
    assert scaler.state_dict() == control.state_dict()


def test_optimizer_with_its_own_loss_scale_is_refused():
    scaler = GradScaler("cuda")
    net = regression_net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=1024.0)
    _, grads = _grad_fn(scaler, net, opt)(*[Tensor(a) for a in regression_batches(1)[0]])
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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
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
    _, grads = _grad_fn(scaler, net, good)(*_batches(1)[0])

    def step(optimizer, gradients):
        return scaler.step(optimizer, gradients)

    step = ms.jit(step) if compiled else step
    before = training_state(net)
    with pytest.raises(TypeError, match=pattern):
        _read(step(bad, grads))
    assert changed_since(before, net) == []
    assert not bool(_read(step(good, grads)).asnumpy())  # the same iteration's step is not refused as a second one


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
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_settings_reach_a_step_compiled_before_them(change, flags, expected, compiled):
    """Eagerly the scaler's own calls are compiled at their first call too (lossscale.frontends._eager_calls)."""
    scaler = GradScaler("cuda", init_scale=2048.0, growth_interval=3)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = _basic(scaler, net, opt)
    step = ms.jit(step) if compiled else step
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    step(x, y, Tensor(False))  # compiled with the old rule; growth tracker now 1
    change(scaler)
    scales = []
    for flag in flags:
        step(x, y, Tensor(flag))
        scales.append(scaler.get_scale())
    assert scales == expected
    assert scaler.state_dict()["scale"] == expected[-1]  # what the device holds


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_switching_fixed_and_dynamic_reaches_a_compiled_step(compiled):
    """A switch takes effect in a step compiled before it; while fixed, the counters stand still (Paddle's
    update() returns before counting), so a clean step neither counts towards the next growth nor an overflow
    towards the next backoff."""
    scaler = GradScaler(init_loss_scaling=256.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    step = _basic(scaler, net, opt)
    step = ms.jit(step) if compiled else step
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
    _, grads = _grad_fn(scaler, net, opt)(x, y)
    scaler.unscale_(_poison(grads, Tensor(True)))
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
        grad_fn = _grad_fn(scaler, net, opt)

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
        ("megatron", dict(init_scale=2.0**14, growth_interval=2)),
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
    grad_fns = [_grad_fn(s, n, o) for s, n, o in zip(scalers, nets, opts)]

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
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=4.0, growth_interval=1)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        scaler.step(opt, grads)
        scaler.update()
        return scaler.scale(Tensor(np.float32(1.0))), loss  # the receiver is usable after update()

    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    assert [float(step(x, y)[0].asnumpy()) for _ in range(3)] == [8.0, 16.0, 32.0]


@pytest.mark.slow
def test_pytorch_update_without_inf_checks_raises_and_paddle_allows_it():
    torch_scaler, paddle_scaler = GradScaler("cuda"), GradScaler()
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        torch_scaler.update()
    paddle_scaler.update()
    assert paddle_scaler.state_dict()["incr_count"] == 1  # a clean iteration

    @ms.jit
    def only_update(x):
        torch_scaler.update()
        return x

    with pytest.raises(AssertionError, match="No inf checks"):
        _read(only_update(Tensor(1.0)))
    assert torch_scaler.state_dict()["scale"] == 2.0**16 and torch_scaler.state_dict()["_growth_tracker"] == 0


def test_pytorch_update_with_new_scale_needs_no_inf_checks():
    scaler = GradScaler("cuda")
    scaler.update(512.0)  # torch.amp.GradScaler asserts only for an update from this iteration's checks
    assert scaler.get_scale() == 512.0
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.update()


def _scaler_after_one_step():
    """A PyTorch-spelled scaler (init_scale 4) that has stepped once, so update() may follow."""
    scaler = GradScaler("cuda", init_scale=4.0)
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    _, grads = _grad_fn(scaler, net, opt)(*[Tensor(a) for a in regression_batches(1)[0]])
    scaler.step(opt, grads)
    return scaler


@pytest.mark.parametrize("new_scale, expected", [(512.0, 512.0), (Tensor(np.float32(8.0)), 8.0)])
def test_update_with_new_scale(new_scale, expected):
    scaler = _scaler_after_one_step()
    scaler.update(new_scale)
    assert scaler.get_scale() == expected and scaler.state_dict()["_growth_tracker"] == 0


@pytest.mark.parametrize(
    "new_scale, error",
    [
        (0.0, ValueError),
        (float("nan"), ValueError),
        ("2", TypeError),
        (Tensor(np.float32(-1.0)), ValueError),
        (Tensor(np.float32(1e-40)), ValueError),  # 1/S is inf
        (Tensor(np.float32([1.0, 2.0])), TypeError),
    ],
)
def test_update_with_a_bad_new_scale(new_scale, error):
    scaler = _scaler_after_one_step()
    with pytest.raises(error, match="new_scale"):
        scaler.update(new_scale)
    assert scaler.get_scale() == 4.0


BAD_TENSOR_SCALES = [
    (np.float32([1.0, 2.0]), TypeError, "'new_scale' must be one float value"),
    (np.zeros(0, np.float32), TypeError, "'new_scale' must be one float value"),
    (np.float32(-1.0), ValueError, "'new_scale' must be a finite"),
    (np.float32("nan"), ValueError, "'new_scale' must be a finite"),
    (np.float32(1e-40), ValueError, "'new_scale' must be a finite"),
]


@pytest.mark.parametrize(
    "new_scale, error, pattern", BAD_TENSOR_SCALES, ids=["two", "none", "negative", "nan", "subnormal"]
)
@pytest.mark.slow
def test_update_with_a_bad_new_scale_tensor_is_refused_in_a_compiled_function(new_scale, error, pattern):
    """Inside mindspore.jit a Tensor new_scale's shape is checked while compiling and its value when the graph runs,
    as eagerly. PyTorch's rule has no floor; 1e-40 is a subnormal whose reciprocal is inf (unscaling would make
    every gradient inf): refused whether the kernels flush it to 0 (this CPU's do, so the reciprocal check is not
    what refuses it here) or not."""
    scaler = _scaler_after_one_step()

    @ms.jit
    def update(value):
        return scaler.update(value).get_scale()

    with pytest.raises(error, match=pattern):
        _read(update(Tensor(new_scale)))
    assert scaler.get_scale() == 4.0


@pytest.mark.parametrize("as_tensor", [False, True], ids=["number", "tensor"])
@pytest.mark.slow
def test_update_with_new_scale_in_a_compiled_step_acts_as_eagerly(as_tensor):
    """Inside mindspore.jit, update(new_scale) did nothing: the scale stayed, and the next iteration's step() was
    refused ("step() has already been called since the last update()"). Now the compiled iterations give the
    eager run's scales, skips and weights (an inf batch included)."""
    schedule = [8.0, 16.0, 4.0, 64.0]
    batches = regression_batches(len(schedule))
    batches[2] = (with_inf(batches[2][0]), batches[2][1])

    def run(compiled):
        scaler, net = GradScaler("cuda", init_scale=256.0), regression_net()
        opt = nn.SGD(net.trainable_params(), 0.05)
        grad_fn = _grad_fn(scaler, net, opt)

        def iteration(x, y, new_scale):
            _, grads = grad_fn(x, y)
            skipped = scaler.step(opt, grads)
            scaler.update(new_scale)
            return skipped

        def with_constant(value):  # a compiled function per Python number, as PyTorch code writes it
            def constant_iteration(x, y):
                return iteration(x, y, value)

            return ms.jit(constant_iteration)

        with_tensor = ms.jit(iteration)
        history = []
        for (x, y), value in zip(batches, schedule):
            if not compiled:
                skipped = iteration(Tensor(x), Tensor(y), value)
            elif as_tensor:
                skipped = with_tensor(Tensor(x), Tensor(y), Tensor(np.float32(value)))
            else:
                skipped = with_constant(value)(Tensor(x), Tensor(y))
            history.append((bool(skipped), scaler.get_scale()))
        return history, [p.asnumpy() for p in net.trainable_params()]

    (history, weights), (eager_history, eager_weights) = run(True), run(False)
    assert history == eager_history == [(False, 8.0), (False, 16.0), (True, 4.0), (False, 64.0)]
    for ours, control in zip(weights, eager_weights):
        np.testing.assert_array_equal(ours, control)


def _set_growth_factor(scaler):
    scaler.set_growth_factor(4.0)


def _set_init_loss_scaling(scaler):
    scaler.set_init_loss_scaling(8.0)


def _state_dict(scaler):
    scaler.state_dict()


def _load_state_dict(scaler):
    scaler.load_state_dict(scaler.state_dict())


def _get_state(scaler):
    scaler.get_state()


def _is_use_dynamic_loss_scaling(scaler):
    scaler.is_use_dynamic_loss_scaling()


# Named functions: MindSpore cannot parse a lambda defined inside a dict.
HOST_CALLS = {
    call.__name__[1:]: call
    for call in (
        _set_growth_factor,
        _set_init_loss_scaling,
        _state_dict,
        _load_state_dict,
        _get_state,
        _is_use_dynamic_loss_scaling,
    )
}


@pytest.mark.parametrize("spelling", ["torch", "paddle"])
@pytest.mark.parametrize("method", sorted(HOST_CALLS))
def test_a_host_method_inside_a_compiled_function_says_so(method, spelling):
    """Setters, state_dict() and the other host calls read or write the device from Python; inside mindspore.jit
    they failed with MindSpore's messages ("Unsupported statement 'Try'", "'asnumpy' is not supported"). Now a
    RuntimeError naming the method says to call it outside; the scaler is unchanged and works eagerly."""
    scaler = GradScaler("cuda", init_scale=256.0) if spelling == "torch" else GradScaler(init_loss_scaling=256.0)
    call = HOST_CALLS[method]

    def compiled(x):
        call(scaler)
        return x

    with pytest.raises(
        RuntimeError,
        match=r"reads or writes the scaler's state from Python \(a host call\): call it "
        r"outside mindspore.jit",
    ):
        ms.jit(compiled)(Tensor(1.0))
    assert scaler.get_scale() == 256.0 and scaler.get_growth_factor() == 2.0
    call(scaler)  # eagerly it works


def _bounded_scaler():
    """A PyTorch-spelled scaler whose rule has a floor of 2 and a ceiling of 1024 (scale 256)."""
    return GradScaler("cuda", policy=get_preset("pytorch", init_scale=256.0, min_scale=2.0, max_scale=1024.0))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "new_scale, accepted", [(1024.0, True), (2.0, True), (2048.0, False), (1.0, False), (1e-40, False)]
)
@pytest.mark.parametrize("as_tensor", [False, True], ids=["number", "tensor"])
@pytest.mark.slow
def test_update_with_new_scale_stays_within_the_rules_bounds(new_scale, accepted, as_tensor, compiled):
    """A scale outside min_scale/max_scale was set, and the state_dict() it gave could not be loaded into the
    same scaler ("'state_dict['scale']' must be a finite number in (0.0, 1024.0]"): now refused, nothing
    changed; a scale within them round-trips."""
    scaler = _bounded_scaler()
    value = Tensor(np.float32(new_scale)) if as_tensor else new_scale
    if compiled:

        def set_tensor(v):
            return scaler.update(v).get_scale()

        def set_number():
            return scaler.update(new_scale).get_scale()

        call, args = (ms.jit(set_tensor), (value,)) if as_tensor else (ms.jit(set_number), ())
    else:
        call, args = scaler.update, (value,)
    if not accepted:
        with pytest.raises(ValueError, match="'new_scale' must be a finite"):
            _read(call(*args))
        assert scaler.get_scale() == 256.0
        return
    _read(call(*args))
    assert scaler.get_scale() == new_scale
    resumed = _bounded_scaler()
    resumed.load_state_dict(scaler.state_dict())
    assert resumed.state_dict() == scaler.state_dict()


# ---- disabled scalers -------------------------------------------------------------------------------------


def test_disabled_scaler_is_an_exact_no_op_and_reports_like_its_framework():
    disabled = GradScaler(enable=False)
    net, control = regression_net(), regression_net()
    opt, control_opt = nn.SGD(net.trainable_params(), 0.05), nn.SGD(control.trainable_params(), 0.05)
    grad_fn, control_fn = _grad_fn(disabled, net, opt), ms.value_and_grad(control, None, control_opt.parameters)
    for x, y in _batches(3):
        _, grads = grad_fn(x, y)
        disabled.unscale_(grads)
        disabled.step(opt, grads)
        disabled.update()
        control_opt(control_fn(x, y)[1])
    for name, value in training_state(control).items():
        np.testing.assert_array_equal(training_state(net)[name], value)
    # Paddle: 1.0 and False; PyTorch: get_scale() 1.0; both: {} and a state load is ignored
    assert (
        disabled.get_init_loss_scaling(),
        disabled.is_use_dynamic_loss_scaling(),
        disabled.get_scale(),
        disabled.state_dict(),
        disabled.is_enable(),
    ) == (1.0, False, 1.0, {}, False)
    disabled.load_state_dict(GradScaler(init_loss_scaling=8.0).state_dict())
    assert disabled.state_dict() == {} and GradScaler(enabled=False).get_scale() == 1.0


# ---- state_dict ---------------------------------------------------------------------------------------------


def test_pytorch_state_dict_round_trip():
    """PyTorch's test_grad_scaling_state_dict: s1 takes s0's state, also after s1 has been used (compiled)."""
    for used in (False, True):
        s0 = GradScaler("cuda", init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
        s1 = GradScaler("cuda", init_scale=6.0, growth_factor=7.0, backoff_factor=0.8, growth_interval=1)
        if used:
            net = regression_net()
            step = ms.jit(_basic(s1, net, nn.SGD(net.trainable_params(), 0.05)))
            step(*[Tensor(a) for a in regression_batches(1)[0]], Tensor(False))
        s1.load_state_dict(s0.state_dict())
        assert (
            s1.get_scale(),
            s1.get_growth_factor(),
            s1.get_backoff_factor(),
            s1.get_growth_interval(),
            s1.state_dict()["_growth_tracker"],
        ) == (3.0, 4.0, 0.5, 2, 0)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.slow
def test_compiling_the_front_ends_logs_no_warning_of_ours():
    """Every call of a front-end inside a compiled step, once: MindSpore logged "The "refuse_non_gradients" is a
    constexpr function. The input arguments must be all constant value." at every compilation of a user's step."""
    records = _Records()
    ms_logger = ms.log._get_logger()
    net = regression_net()
    opt = nn.SGD(net.trainable_params(), 0.05)
    scaler = GradScaler("cuda", init_scale=64.0)
    torch_step = ms.jit(_clipping_separate_unscale(scaler, net, opt))
    keras_net = regression_net()
    keras_opt = LossScaleOptimizer(nn.SGD(keras_net.trainable_params(), 0.05))
    keras = ms.jit(keras_step(keras_net, keras_opt))
    x, y = _batches(1)[0]
    ms_logger.addHandler(records)
    try:
        _read(torch_step(x, y, Tensor(False)))
        _read(keras(x, y))
    finally:
        ms_logger.removeHandler(records)
    assert not [message for message in records.messages if "constexpr" in message], records.messages


@pytest.mark.parametrize(
    "make, poisoned, expected",
    [
        # at the split: the scale 64 (not the initial one) and two clean steps counted, so the next one grows
        (
            lambda: GradScaler("cuda", init_scale=256.0, growth_interval=3),
            {0, 1},
            [128.0, 64.0, 64.0, 64.0, 128.0, 128.0, 128.0, 256.0],
        ),
        # at the split: the scale 128 and one bad step of two pending, so the next bad one backs off
        (
            lambda: GradScaler(init_loss_scaling=256.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=2),
            {0, 1, 3, 4},
            [256.0, 128.0, 128.0, 128.0, 64.0, 64.0, 64.0, 128.0],
        ),
    ],
    ids=["pytorch", "paddle"],
)
@pytest.mark.slow
def test_resumed_from_state_dict_and_checkpoint_is_the_uninterrupted_run(make, poisoned, expected, tmp_path):
    """Stopped mid-run with counts running, saved as a user does (the network and optimizer with
    mindspore.save_checkpoint, the scaler's state_dict) and resumed into new objects in one compiled step: the
    same skips, scales and weights as the run that never stopped."""
    split = 4

    def fresh():
        net = regression_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        scaler = make()
        return net, opt, scaler, ms.jit(_basic(scaler, net, opt))

    def train(parts, batches, first):
        _, _, scaler, step = parts
        scales = []
        for i, (x, y) in enumerate(batches, start=first):
            _read(step(x, y, Tensor(i in poisoned)))
            scales.append(scaler.get_scale())
        return scales

    batches = _batches(8)
    uninterrupted = fresh()
    assert train(uninterrupted, batches, 0) == expected
    first = fresh()
    before = train(first, batches[:split], 0)
    path = str(tmp_path / "run.ckpt")
    ms.save_checkpoint(first[1], path)  # the optimizer holds the weights and its own state
    state = first[2].state_dict()
    resumed = fresh()
    assert ms.load_param_into_net(resumed[1], ms.load_checkpoint(path)) == ([], [])
    resumed[2].load_state_dict(state)
    assert before + train(resumed, batches[split:], split) == expected
    _same_training_state((uninterrupted[0], uninterrupted[1]), (resumed[0], resumed[1]), rtol=0, atol=0)


def test_paddle_state_dict_has_paddles_keys_and_loads_paddles_own():
    scaler = GradScaler(
        init_loss_scaling=1024, incr_ratio=4.0, decr_ratio=0.25, incr_every_n_steps=3, decr_every_n_nan_or_inf=2
    )
    state = scaler.state_dict()
    assert sorted(state) == sorted(
        [
            "scale",
            "incr_ratio",
            "decr_ratio",
            "incr_every_n_steps",
            "decr_every_n_nan_or_inf",
            "incr_count",
            "decr_count",
            "use_dynamic_loss_scaling",
        ]
    )
    assert state["scale"].dtype == np.float32 and state["scale"].tolist() == [1024.0]
    paddle_saved = {
        "scale": np.array([512.0], np.float32),
        "incr_ratio": 2.0,
        "decr_ratio": 0.5,
        "incr_every_n_steps": 1000,
        "decr_every_n_nan_or_inf": 2,
        "incr_count": 7,
        "decr_count": 1,
        "use_dynamic_loss_scaling": True,
    }  # what paddle.amp.GradScaler.state_dict() returns
    scaler.load_state_dict(paddle_saved)
    assert scaler.get_init_loss_scaling() == 512.0 and scaler.get_scale() == 512.0  # as Paddle
    assert {k: v for k, v in scaler.state_dict().items() if k != "scale"} == {
        k: v for k, v in paddle_saved.items() if k != "scale"
    }
    released = dict(paddle_saved, scale=512.0, init_loss_scaling=1024.0)  # lossscale 0.1.0's format
    scaler.load_state_dict(released)
    assert scaler.get_scale() == 512.0


def _overflow_steps(scaler, flags):
    """One eager iteration per flag (inf gradients when True) on a one-weight SGD: the scales after each."""
    weight = ms.Parameter(Tensor(np.ones(2, np.float32)), name="w")
    opt = nn.SGD([weight], 0.1)
    scales = []
    for flag in flags:
        scaler.step(opt, (Tensor(np.array([np.inf if flag else 0.5, 1.0], np.float32)),))
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


@pytest.mark.parametrize(
    "make",
    [
        lambda: GradScaler("cuda", policy=get_preset("megatron", init_scale=1024.0)),
        lambda: GradScaler(policy=get_preset("megatron", init_scale=1024.0)),
        lambda: GradScaler(init_loss_scaling=1024.0, decr_every_n_nan_or_inf=3),
    ],
    ids=["torch_megatron", "paddle_megatron", "paddle_hysteresis_3"],
)
@pytest.mark.slow
def test_a_rule_with_hysteresis_resumes_exactly_from_its_state_dict(make):
    """A PyTorch-format state had no place for the overflows counted towards the next backoff: resumed mid-count,
    a TorchGradScaler with Megatron's rule backed off an overflow late. (Paddle's format holds the count.)"""
    flags = [T, F, T, T, T, F, T]
    uninterrupted = _overflow_steps(make(), flags)
    first = make()
    _overflow_steps(first, flags[:1])  # one overflow counted, no backoff yet
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert resumed.get_state() == first.get_state()
    assert _overflow_steps(resumed, flags[1:]) == uninterrupted[1:]


def test_default_state_dicts_keep_their_frameworks_keys():
    torch_state = TorchGradScaler(init_scale=8.0).state_dict()
    assert sorted(torch_state) == ["_growth_tracker", "backoff_factor", "growth_factor", "growth_interval", "scale"]
    assert "consecutive_hysteresis" not in GradScaler().state_dict()
    assert "consecutive_hysteresis" not in GradScaler(policy="paddle").state_dict()


@pytest.mark.parametrize(
    "source, target",
    [
        (lambda: GradScaler(init_loss_scaling=32.0), lambda: GradScaler("cuda")),
        (lambda: GradScaler("cuda", policy="megatron"), lambda: GradScaler()),
        (lambda: GradScaler(policy="megatron"), lambda: GradScaler()),
    ],
    ids=["paddle_into_torch", "torch_megatron_into_paddle", "paddle_megatron_into_paddle"],
)
def test_a_state_whose_hysteresis_works_otherwise_is_refused_and_changes_nothing(source, target):
    """A Paddle state (back off on the 2nd overflow, counters refilled) loaded into PyTorch's rule gave a hybrid
    rule that is no library's (Megatron's no-refill with Paddle's count), silently."""
    saved = source()
    _overflow_steps(saved, [T])
    scaler = target()
    before = (scaler.state_dict(), scaler.get_state())
    with pytest.raises(ValueError, match=r"'state_dict' holds a rule with hysteresis 2 .* fixed when it is built"):
        scaler.load_state_dict(saved.state_dict())
    assert (scaler.state_dict(), scaler.get_state()) == before


def test_a_state_without_hysteresis_loads_into_either_spelling():
    saved = GradScaler(init_loss_scaling=32.0, decr_every_n_nan_or_inf=1)
    _overflow_steps(saved, [T])
    torch_scaler = GradScaler("cuda")
    torch_scaler.load_state_dict(saved.state_dict())
    assert torch_scaler.get_state() == saved.get_state() and torch_scaler.get_scale() == 16.0


def test_a_pytorch_scaler_refuses_a_fixed_paddle_state_and_changes_nothing():
    """A TorchGradScaler loaded a Paddle state with use_dynamic_loss_scaling=False and kept its scale fixed, but its
    state_dict() (PyTorch's keys) had no place for that: loaded again, the scale was dynamic. PyTorch's scale is
    always dynamic, so such a state is refused; the same state made dynamic loads."""
    fixed = GradScaler(init_loss_scaling=64.0, decr_every_n_nan_or_inf=1, use_dynamic_loss_scaling=False)
    torch_scaler = GradScaler("cuda", init_scale=256.0)
    before = torch_scaler.state_dict()
    with pytest.raises(ValueError, match=r"'state_dict\['use_dynamic_loss_scaling'\]' is False.*always dynamic"):
        torch_scaler.load_state_dict(fixed.state_dict())
    assert torch_scaler.state_dict() == before and torch_scaler.is_use_dynamic_loss_scaling()
    torch_scaler.load_state_dict(dict(fixed.state_dict(), use_dynamic_loss_scaling=True))
    assert torch_scaler.get_scale() == 64.0 and torch_scaler.is_use_dynamic_loss_scaling()


BAD_STATES = [
    ({}, RuntimeError, "state dict is empty"),
    ([1, 2], TypeError, "'state_dict' must be a dict"),
    ({"foo": 1}, ValueError, "neither a Paddle GradScaler state .* nor a PyTorch one"),
    ({"scale": 8.0, "growth_factor": 2.0}, ValueError, r"missing \['backoff_factor'"),
    ("nan", ValueError, "state_dict\\['scale'\\]"),
    ("none", TypeError, "state_dict\\['scale'\\]"),
    ("tracker", ValueError, "state_dict\\['_growth_tracker'\\].*5"),
    ("factor", AssertionError, "'growth_factor'.*0.5"),
    ("tracker_at_interval", ValueError, "state_dict\\['_growth_tracker'\\].*4"),  # grows at 4: never kept at 4
    ("empty_scale", ValueError, "state_dict\\['scale'\\]' must hold one number, but got 0 values"),
]


@pytest.mark.parametrize("state, error, pattern", BAD_STATES, ids=[str(c[0])[:20] for c in BAD_STATES])
def test_bad_state_dicts_change_nothing(state, error, pattern):
    scaler = GradScaler("cuda", init_scale=8.0, growth_interval=4)
    good = scaler.state_dict()
    if isinstance(state, str):
        state = {
            "nan": dict(good, scale=float("nan")),
            "none": dict(good, scale=None),
            "tracker": dict(good, _growth_tracker=5),
            "factor": dict(good, growth_factor=0.5),
            "tracker_at_interval": dict(good, _growth_tracker=4),
            "empty_scale": dict(good, scale=np.zeros(0, np.float32)),
        }[state]
    with pytest.raises(error, match=pattern):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == good


@pytest.mark.parametrize("key, value", [("incr_count", 4), ("decr_count", 2)])
def test_paddle_counters_at_their_limit_are_refused_and_change_nothing(key, value):
    """A count reaches its limit only to act (grow at incr_every_n_steps clean steps, back off at
    decr_every_n_nan_or_inf overflows) and restart: a state holding it was never saved by a scaler."""
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=4, decr_every_n_nan_or_inf=2)
    good = scaler.state_dict()
    with pytest.raises(ValueError, match=f"state_dict\\['{key}'\\].*{value}"):
        scaler.load_state_dict(dict(good, **{key: value}))
    assert scaler.state_dict() == good


def test_a_paddle_state_without_hysteresis_keys_works_as_the_scalers_own_rule():
    """Paddle's own state dicts name no hysteresis mode: one with a hysteresis loads into a scaler whose rule has
    one (here Megatron's, in Paddle's spelling) and works as that rule."""
    saved = GradScaler(policy="megatron")
    _overflow_steps(saved, [T])
    paddle_format = {
        key: value
        for key, value in saved.state_dict().items()
        if key not in ("consecutive_hysteresis", "refill_hysteresis_on_backoff")
    }
    scaler = GradScaler(policy="megatron")
    scaler.load_state_dict(paddle_format)
    assert scaler.get_state() == saved.get_state() and scaler.state_dict() == saved.state_dict()


@pytest.mark.slow
def test_pickle_between_iterations_only():
    scaler, net, opt, grad_fn = _pytorch_sgd_setup(init_scale=32.0, growth_interval=3)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    _, grads = grad_fn(x, y)
    scaler.step(opt, grads)
    with pytest.raises(RuntimeError, match="pickled at the beginning of an iteration"):
        pickle.dumps(scaler)
    scaler.update()
    copy = pickle.loads(pickle.dumps(scaler))
    assert type(copy) is TorchGradScaler and copy.state_dict() == scaler.state_dict()
    paddle = pickle.loads(pickle.dumps(GradScaler(init_loss_scaling=16.0, enable=False)))
    assert type(paddle) is GradScaler and not paddle.is_enable()


def test_pickle_keeps_an_explicit_name_when_it_is_free():
    """The Parameter names of an unpickled scaler: its own name in a new process (the original is gone), a
    free variant while the original lives (two scalers in one graph need distinct names)."""

    def names(scaler):
        return sorted(p.name for p in scaler._core.get_parameters())

    original = GradScaler(init_loss_scaling=64.0, name="pickled_gen")
    saved = pickle.dumps(original)
    twin = pickle.loads(saved)
    assert names(twin)[0].startswith("pickled_gen_1.") and twin.get_scale() == 64.0
    del original, twin
    gc.collect()
    assert names(pickle.loads(saved))[0].startswith("pickled_gen.")


def test_a_name_in_use_is_refused_whatever_the_front_end():
    """Two front-ends of one name would put two Parameters of each name in a graph: the second is refused (a
    GradScaler or a LossScaleOptimizer; no test built one, and without the check both were accepted), its
    optimizer left free to wrap, and the name is free again once its owner is gone."""
    scaler = GradScaler("cuda", name="taken")
    inner = _sgd(regression_net().trainable_params())
    builds = [lambda: GradScaler(init_loss_scaling=8.0, name="taken"), lambda: LossScaleOptimizer(inner, name="taken")]
    for build in builds:
        with pytest.raises(ValueError, match=r"'name' 'taken' is already used by another TorchGradScaler"):
            build()
    assert float(LossScaleOptimizer(inner, initial_scale=4.0).loss_scale.asnumpy()) == 4.0
    del scaler
    gc.collect()
    assert GradScaler(init_loss_scaling=8.0, name="taken").get_scale() == 8.0


# ---- setters ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setter, value, error, pattern",
    [
        ("set_incr_ratio", 1.0, AssertionError, r"'incr_ratio'.*1.0"),
        ("set_decr_ratio", 1.5, AssertionError, r"'decr_ratio'.*1.5"),
        ("set_decr_ratio", 0.0, ValueError, r"'decr_ratio'"),
        ("set_incr_every_n_steps", 0, ValueError, r"'incr_every_n_steps'.*0"),
        ("set_decr_every_n_nan_or_inf", 0, ValueError, r"'decr_every_n_nan_or_inf'.*0"),
        ("set_init_loss_scaling", -1.0, ValueError, r"'init_loss_scaling'.*-1.0"),
        ("set_init_loss_scaling", float("inf"), ValueError, r"'init_loss_scaling'.*inf"),
        ("set_growth_factor", 1.0, AssertionError, r"'incr_ratio'"),
    ],
)
def test_setters_validate_and_change_nothing_on_error(setter, value, error, pattern):
    scaler = GradScaler()
    before = scaler.state_dict()
    with pytest.raises(error, match=pattern):
        getattr(scaler, setter)(value)
    assert scaler.state_dict() == before


def test_getters_and_setters_of_both_spellings():
    scaler = GradScaler(
        init_loss_scaling=1024, incr_ratio=4.0, decr_ratio=0.25, incr_every_n_steps=3, decr_every_n_nan_or_inf=1
    )
    assert (
        scaler.get_init_loss_scaling(),
        scaler.get_incr_ratio(),
        scaler.get_decr_ratio(),
        scaler.get_incr_every_n_steps(),
        scaler.get_decr_every_n_nan_or_inf(),
    ) == (1024.0, 4.0, 0.25, 3, 1)
    torch = GradScaler("cuda")
    torch.set_growth_factor(3.0)
    torch.set_backoff_factor(0.125)
    torch.set_growth_interval(5)
    assert (torch.get_growth_factor(), torch.get_backoff_factor(), torch.get_growth_interval()) == (3.0, 0.125, 5)
    assert torch.state_dict()["growth_interval"] == 5


# ---- the backend's check, through a stand-in -----------------------------------------------------------------


def test_ascend_saturation_check_through_the_scaler():
    """The register is cleared as the scaled loss's backward begins (the forward pass's saturation is not
    counted); unscale_/step read it after the gradients and clear it again.

    Compiled only: in PyNative the stand-in's host callbacks run asynchronously, and on the first call the
    forward pass's callback ran after the backward's clear. What real NPU streams do there is unverified."""
    register = StatusRegister()
    scaler = GradScaler(
        "cuda", init_scale=1024.0, overflow_check=AscendSaturationCheck(register.clear_status, register.get_status)
    )
    net = SaturatingNet(register, forward=True)
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x):
        return scaler.scale(net(x))

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(x):
        _, grads = grad_fn(x)
        skipped = scaler.step(opt, grads)
        scaler.update()
        return skipped

    step = ms.jit(step)
    for x, expected in ((1.0, False), (200.0, True), (1.0, False)):
        register.log.clear()
        assert bool(step(Tensor(np.array([1.0, 2.0, x], np.float32))).asnumpy()) == expected
        assert register.log == ["forward", "forward", "clear", "backward", "get", "clear"]
    assert scaler.get_scale() == 512.0


def test_keys_must_be_constants_of_simple_types():
    scaler = GradScaler("cuda")
    grads = (Tensor(np.ones(2, np.float32)),)
    with pytest.raises(TypeError, match="'key' must be an int or a str"):
        scaler.unscale_(grads, key=1.5)
    with pytest.raises(TypeError, match="'key'"):
        scaler.unscale_(grads, key=True)


def test_one_scaler_serves_at_most_its_capacity_of_optimizer_keys():
    scaler = GradScaler("cuda")
    grads = (Tensor(np.ones(2, np.float32)), None)  # a None entry: run kernel by kernel, not compiled per key
    for key in range(DEFAULT_CAPACITY):
        scaler.unscale_(grads, key=key)
    with pytest.raises(ValueError, match=f"more than {DEFAULT_CAPACITY} optimizer keys in one GradScaler"):
        scaler.unscale_(grads, key="one too many")


@pytest.mark.slow
def test_a_new_scaler_with_a_freed_name_starts_with_no_optimizer_keys():
    """Keys were registered per scaler name: a sweep building a fresh scaler per model size in one process (each
    reusing the freed name) failed with 'more than 16 optimizer keys' at the 17th size."""
    for width in range(1, DEFAULT_CAPACITY + 3):
        scaler = GradScaler("cuda", name="sweep")
        # a None entry: the call runs kernel by kernel instead of compiling a graph for each new scaler (1 s each)
        grad, _ = scaler.unscale_((Tensor(np.ones(width, np.float32)), None))
        assert grad.asnumpy().tolist() == [2.0**-16] * width
        del scaler
        gc.collect()


def test_grad_capture_sees_unscaled_gradients():
    """What the optimizer receives equals the gradients of the unscaled loss (eager, no unscale_ call)."""
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    reference = regression_net()
    reference_opt = GradCapture(reference.trainable_params())
    _, expected = ms.value_and_grad(reference, None, reference_opt.parameters)(x, y)
    scaler = GradScaler(init_loss_scaling=2.0**12)
    net = regression_net()
    opt = GradCapture(net.trainable_params())
    _, grads = _grad_fn(scaler, net, opt)(x, y)
    scaler.step(opt, grads)
    for got, want in zip(opt.captured, expected):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6)


# ---- eager calls run compiled (lossscale.frontends._eager_calls) ------------------------------------------------


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph_mode"])
@pytest.mark.slow
def test_eager_calls_compile_once_and_train_as_the_control(mode, compilations):
    """From Python, unscale_, step and update each run one compiled graph (an eager MLP iteration 150 -> 46 ms):
    compiled once, not at every call (a tuple of gradients given as it is would be a constant of the compilation),
    and training exactly as the unscaled control, including the skipped inf iteration."""
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        net, control_net = regression_net(), regression_net()
        opt, control_opt = _sgd(net.trainable_params()), _sgd(control_net.trainable_params())
        scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1)
        grad_fn = _grad_fn(scaler, net, opt)
        control_fn = ms.value_and_grad(control_net, None, control_opt.parameters)
        compiled = compilations
        for iteration, (x, y) in enumerate(_batches(5)):
            _, grads = grad_fn(x, y)
            grads = scaler.unscale_(_poison(grads, Tensor(iteration == SKIP_ITER)))
            assert bool(scaler.step(opt, grads).asnumpy()) == (iteration == SKIP_ITER)
            scaler.update()
            if iteration != SKIP_ITER:
                control_opt(control_fn(x, y)[1])
            if iteration == 0:
                first = len(compiled)
        # unscale_, step and update each ran a compiled Cell of the scaler's (not the few hundred kernels of PyNative)
        assert len(scaler._calls._functions) == 3
        assert len(compiled) == first, compiled  # nothing compiled after the first iteration
        _same_training_state((net, opt), (control_net, control_opt))
        assert scaler.get_scale() == 128.0 * 2**4 * 0.5  # grew at each clean iteration, backed off at the inf one
    finally:
        ms.set_context(mode=previous)


@ms.jit_class
class _Multiplier:
    def __init__(self, factor):
        self.factor = factor

    def times(self, grads):
        return tuple(grad * self.factor for grad in grads)


def test_compiled_calls_keep_a_graph_per_object():
    """Two objects' methods of one name each run their own compiled graph, at every call (one keyed by the
    method's name alone would run the first object's, writing its Parameters); an empty tuple gives an empty
    tuple."""
    calls, double, triple = CompiledCalls(), _Multiplier(2.0), _Multiplier(3.0)
    grads = (Tensor(np.ones(2, np.float32)),)
    for _ in range(2):
        assert [calls.run(obj.times, grads)[0].asnumpy().tolist() for obj in (double, triple)] == [[2, 2], [3, 3]]
    assert calls.run(double.times, ()) == ()


@pytest.mark.parametrize("misuse", MISUSES)
@pytest.mark.slow
def test_an_eager_refusal_leaves_the_scaler_usable(misuse):
    """A misuse called from Python raises there, and the next iteration trains as the control: the compiled calls
    return refusal codes instead of raising (a compiled function that raised fails at every later call on
    MindSpore 2.10)."""
    x, y = _batches(1)[0]
    net, control_net = regression_net(), regression_net()
    opt, control_opt = _sgd(net.trainable_params()), _sgd(control_net.trainable_params())
    scaler = GradScaler("cuda", init_scale=1024.0)
    grad_fn, control_fn = _grad_fn(scaler, net, opt), ms.value_and_grad(control_net, None, control_opt.parameters)
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
    _same_training_state((net, opt), (control_net, control_opt))
    assert scaler.get_scale() == 1024.0


@pytest.mark.slow
def test_a_scaler_used_eagerly_is_freed():
    """The compiled calls hold the scaler's graph part, not the scaler: MindSpore keeps what a compiled Cell uses
    alive, and a compiled Cell holding the scaler (or a bound method of it) was never freed, nor its name."""
    scaler = GradScaler("cuda", name="freed_after_eager_use")
    opt = _sgd(regression_net().trainable_params())
    # Gradients made here: a function that MindSpore compiled for value_and_grad in GRAPH_MODE stays alive, and a
    # forward function calling scaler.scale would hold the scaler.
    grads = tuple(ops.ones_like(parameter) for parameter in opt.parameters)
    scaler.step(opt, scaler.unscale_(grads))
    scaler.update()
    alive = weakref.ref(scaler)
    del scaler
    gc.collect()
    assert alive() is None
    assert GradScaler("cuda", name="freed_after_eager_use").get_scale() == 65536.0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("value, scale_after", [(1.0, 1024.0), (np.inf, 512.0)], ids=["finite", "inf"])
def test_unscale_passes_a_none_gradient_through(compiled, value, scale_after):
    """PyTorch's unscale_ skips parameters without a gradient. Since unscale_ records the global norm of what it
    returns, a None entry crashed it ('NoneType' object has no attribute 'size' eagerly, a dtype error under jit)."""
    scaler = GradScaler("cuda", init_scale=1024.0)

    def unscale(grad):
        return scaler.unscale_((grad, None))

    unscale = ms.jit(unscale) if compiled else unscale
    grad, missing = unscale(Tensor(np.full(3, value * 1024.0, np.float32)))
    assert missing is None and grad.asnumpy().tolist() == [value] * 3
    scaler.update()  # the inf that unscale_ found backs off
    assert scaler.get_scale() == scale_after
