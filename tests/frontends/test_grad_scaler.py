"""GradScaler training, held to PyTorch's and Paddle's own tests.

Structure after PyTorch's ``test_grad_scaling_*`` (``_run_scaling_case``: a control run without
scaling that skips the iteration where the scaled run gets an inf, compared parameter by
parameter, with the scale checked against growth**unskipped * backoff**skipped), then the rule's
trajectories and skip decisions, each eager and under mindspore.jit. The API, misuse, state and
where-features-meet tests are in the test_grad_scaler_*.py files beside this one.
"""

import re

import mindspore as ms
import numpy as np
import pytest
from grad_scaler_harness import (
    SKIP_ITER,
    F,
    MinimizeRun,
    T,
    basic_step,
    clipping_separate_unscale,
    control_step,
    poisoned_grads,
    read_outputs,
    same_training_state,
    scaled_grad_fn,
    sgd,
    tensor_batches,
)
from mindspore import Tensor, mint, nn, ops
from nets import (
    changed_since,
    jit_if,
    own_names,
    regression_batches,
    regression_net,
    slow_unless,
    training_state,
)

from lossscale import GradScaler, LossScaleOptimizer, get_preset
from lossscale.core.policy import run

SCALING_CASES = {"basic": (basic_step, None), "clipping_separate_unscale": (clipping_separate_unscale, 0.2)}


def _run_scaling_case(case, enabled, compiled, optimizer=sgd):
    build, clip = SCALING_CASES[case]
    control_net, scaled_net = regression_net(), regression_net()
    control_opt, scaled_opt = optimizer(control_net.trainable_params()), optimizer(scaled_net.trainable_params())
    # PyTorch's: a modest initial scale and growth every iteration, so growth errors are magnified.
    scaler = GradScaler("cuda", init_scale=128.0, growth_factor=2.0, enabled=enabled, growth_interval=1)
    control, scaled = control_step(control_net, control_opt, clip), build(scaler, scaled_net, scaled_opt)
    if compiled:
        control, scaled = ms.jit(control), ms.jit(scaled)
    for i, (x, y) in enumerate(tensor_batches()):
        control(x, y, Tensor(enabled and i == SKIP_ITER))
        scaled(x, y, Tensor(enabled and i == SKIP_ITER))
    return scaler, (control_net, control_opt), (scaled_net, scaled_opt)


@pytest.mark.lowest
@pytest.mark.parametrize(
    "case, enabled, compiled",
    [
        # test_eager_and_compiled_give_identical_training runs the clipping recipe eagerly in the README's tier
        pytest.param(case, enabled, compiled, id=f"{mode}-{case}", marks=slow_unless(case == "basic" or compiled))
        for case in sorted(SCALING_CASES)
        for (enabled, compiled, mode) in [(T, F, "eager"), (T, T, "jit"), (F, F, "disabled")]
    ],
)
def test_run_scaling_case(case, enabled, compiled):
    scaler, control, scaled = _run_scaling_case(case, enabled, compiled)
    assert scaler.get_scale() == (128.0 * 2.0**3 * 0.5 if enabled else 1.0)  # 3 unskipped, 1 skipped
    same_training_state(control, scaled)


@pytest.mark.lowest
@pytest.mark.parametrize(
    "optimizer",
    [
        lambda params: nn.Adam(params, learning_rate=0.05),
        # MindSpore's PyTorch-style optimizers (what a PyTorch user reaches for), called with the gradients too
        pytest.param(lambda params: ms.experimental.optim.Adam(params, lr=0.05), marks=pytest.mark.slow),
        pytest.param(lambda params: mint.optim.SGD(params, lr=0.05, momentum=0.9), marks=pytest.mark.slow),
        # an LR and an average that follow global_step, which a skipped iteration must not advance
        lambda params: nn.ASGD(params, learning_rate=0.05, t0=2.0),
    ],
    ids=["adam", "experimental_adam", "mint_sgd", "asgd"],
)
# Eagerly about 8 s each: the slow tier; test_run_scaling_case covers the eager path in the README's tier.
@pytest.mark.parametrize("compiled", [pytest.param(False, marks=pytest.mark.slow), True], ids=["eager", "jit"])
def test_run_scaling_case_with_optimizer_state(optimizer, compiled):
    _, control, scaled = _run_scaling_case("clipping_separate_unscale", True, compiled, optimizer=optimizer)
    same_training_state(control, scaled)  # moments and step counts untouched on the skipped iteration


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
        step = basic_step(scaler, net, opt) if scaled else control_step(net, opt)
        step = jit_if(compiled, step)
        weights = []
        for i, (x, y) in enumerate(tensor_batches(len(rates))):
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
    scaled_fn = scaled_grad_fn(scaler, net, opt)
    batches = tensor_batches(4)
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
    same_training_state(control_net, net)


@pytest.mark.lowest
@pytest.mark.parametrize(
    "spelling, condition",
    [
        # the README's tier: each spelling with one kind of condition
        pytest.param(
            spelling, condition, id=f"{name}-{kind}", marks=slow_unless((name == "torch") == (kind == "tensor"))
        )
        for name, spelling in [
            ("paddle", {"init_loss_scaling": 1024.0, "incr_every_n_steps": 2}),
            ("torch", {"init_scale": 1024.0, "growth_interval": 2}),
        ]
        for kind, condition in [("python_bool", bool), ("tensor", Tensor)]
    ],
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

        train_step = jit_if(compiled, train_step)
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

    step = jit_if(compiled, step)
    for i, (x, y) in enumerate(tensor_batches()):
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
    batches = tensor_batches()

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
        scaler.step(opt, poisoned_grads(grads, poisoned))
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
    same_training_state(control_net, scaled_net, rtol=1e-4, atol=1e-6)


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
    for x, y in tensor_batches(2):
        _, grads = scaled_grad_fn(scaler, net, opt)(x, y)
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
@pytest.mark.slow
def test_trajectory_and_skips_follow_the_rule(case, compiled):
    make, expected = TRAJECTORY_CASES[case]
    assert MinimizeRun(make(), compiled).run(FLAGS) == expected(FLAGS)  # skipped steps changed nothing


@pytest.mark.lowest
def test_eager_and_compiled_give_identical_training():
    results = []
    for compiled in (False, True):
        scaler = GradScaler("cuda", init_scale=2.0**12, growth_interval=2)
        net = regression_net()
        opt = nn.Adam(net.trainable_params(), 0.01)
        step = clipping_separate_unscale(scaler, net, opt)
        step = jit_if(compiled, step)
        for i, (x, y) in enumerate(tensor_batches(5)):
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
    grad_fn = scaled_grad_fn(scaler, net, opt)
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


@pytest.mark.slow
def test_paddle_fixed_scale_two_optimizers_unscaled_before_their_steps_train_as_the_control(compiled):
    """Paddle's step() at a fixed scale ends the iteration for every optimizer, so the second optimizer's unscaled
    gradients were divided again (a 1/S update); here each optimizer's step applies its own unscaled gradients."""
    scaler = GradScaler(init_loss_scaling=1024.0, use_dynamic_loss_scaling=False)
    net, control_net = regression_net(), regression_net()
    params = net.trainable_params()
    first, last = own_names(nn.SGD(params[:2], 0.05), "first"), own_names(nn.SGD(params[2:], 0.05), "last")
    grad_fn = scaled_grad_fn(scaler, net, nn.SGD(params, 0.05))
    control = control_step(control_net, nn.SGD(control_net.trainable_params(), 0.05))

    def step(x, y):
        _, grads = grad_fn(x, y)
        firsts, lasts = scaler.unscale_(grads[:2]), scaler.unscale_(grads[2:])
        skipped = ops.logical_or(scaler.step(first, firsts), scaler.step(last, lasts))
        scaler.update()
        return skipped

    step = jit_if(compiled, step)
    for x, y in tensor_batches(2):
        assert not bool(read_outputs(step(x, y)).asnumpy())
        control(x, y, False)
    same_training_state(control_net, net)


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

    train_step = jit_if(compiled, train_step)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    before = training_state(net)
    assert bool(train_step(x, y, Tensor(np.float32(np.inf))).asnumpy())  # finite gradients, non-finite loss
    assert scaler.get_scale() == 32.0 and changed_since(before, net) == []
    assert not bool(train_step(x, y, Tensor(np.float32(0.0))).asnumpy())  # the next iteration starts clean
    assert scaler.get_scale() == 32.0 and changed_since(before, net) != []
