"""LossScaleOptimizer, held to tf.keras' own loss_scale_optimizer_test.py (Keras 2, whose API it follows):
the Keras documentation's examples, the dynamic rule, skipped steps that still advance ``iterations``, float16 losses,
scale properties, checkpoints; plus the refusal of wrongly scaled gradients. Arguments: the _arguments file."""

import gc
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from nets import (
    Square,
    changed_since,
    group_optimizer,
    jit_if,
    keras_step,
    own_names,
    regression_batches,
    regression_net,
    scalar_of,
    tiered,
    training_state,
    with_inf,
)

from lossscale import LossScaleOptimizer, get_preset
from lossscale.core.policy import run

T, F = True, False


def test_keras_docs_minimize_example():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))
    assert not bool(opt.minimize(model).asnumpy())
    assert scalar_of(model.var) == 0.5


def test_keras_docs_manual_example_with_keras_pairs():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))
    opt.minimize(model)

    def forward():
        return opt.get_scaled_loss(model())

    scaled_loss, grads = ms.value_and_grad(forward, None, opt.parameters)()
    assert scalar_of(scaled_loss) == 0.25 * 2.0**15
    (grad,) = opt.get_unscaled_gradients(grads)
    opt.apply_gradients([(grad, model.var)])  # Keras' (gradient, variable) pairs
    assert scalar_of(model.var) == 0.25


@pytest.mark.parametrize("var_list", [False, True], ids=["no_var_list", "var_list"])
@pytest.mark.slow
def test_minimize_inside_a_compiled_function_trains_as_eagerly(var_list):
    """Keras users call minimize() inside tf.function; inside mindspore.jit it failed to compile ("Unsupported
    statement 'ImportFrom'", then callable() and the var_list identity check). Now the same skips, scales,
    iterations and weights as eagerly, an inf batch included."""
    batches = regression_batches(5)
    batches[1] = (with_inf(batches[1][0]), batches[1][1])

    def run_minimize(compiled):
        net = regression_net()
        opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), initial_scale=64.0, dynamic_growth_steps=2)
        variables = net.trainable_params() if var_list else None

        def iteration(x, y):
            def loss():
                return net(x, y)

            return opt.minimize(loss, variables)

        step = jit_if(compiled, iteration)
        history = [
            (bool(step(Tensor(x), Tensor(y))), scalar_of(opt.loss_scale), opt.iterations.asnumpy().item())
            for x, y in batches
        ]
        return history, [p.asnumpy() for p in net.trainable_params()]

    (history, weights), (eager_history, eager_weights) = run_minimize(True), run_minimize(False)
    assert history == eager_history == [(F, 64.0, 1), (T, 32.0, 2), (F, 32.0, 3), (F, 64.0, 4), (F, 64.0, 5)]
    for ours, control in zip(weights, eager_weights):
        np.testing.assert_array_equal(ours, control)


def test_fixed_loss_scale_applied_to_loss_with_minimize():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 1.0), dynamic=False, initial_scale=10.0)
    opt.minimize(model)
    assert scalar_of(model.var) == -1.0 and scalar_of(opt.loss_scale) == 10.0  # 1 - 1.0 * 2; the scale is fixed


def _keras_rule(flags, scale, growth_steps):
    """tf.keras' rule (as in tests/core/test_presets.py): floor 1, finite growth only."""
    return [s.scale for s in run(get_preset("tf_keras", init_scale=scale, growth_interval=growth_steps), flags)]


def test_dynamic_rule_skips_and_iterations_advance(compiled):
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.1), initial_scale=64.0, dynamic_growth_steps=2)

    def forward(bad):
        return opt.get_scaled_loss(model() * bad)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(bad):
        _, grads = grad_fn(bad)
        return opt.apply_gradients(opt.get_unscaled_gradients(grads))

    step = jit_if(compiled, step)
    flags = [F, T, F, F, T, T, F]
    scales = []
    for i, flag in enumerate(flags):
        before = scalar_of(model.var)
        assert bool(step(Tensor(np.float32(np.inf if flag else 1.0))).asnumpy()) == flag
        assert (scalar_of(model.var) == before) == flag
        assert int(opt.iterations.asnumpy()[0]) == i + 1  # tf.keras: a skipped step still advances iterations
        scales.append(scalar_of(opt.loss_scale))
    assert scales == _keras_rule(flags, 64.0, 2)


def _square_steps(options, compiled):
    """A Square model, its wrapper (scale 64, growth every 2 steps) and one tf.keras step ``step(bad)`` that gives
    ``apply_gradients`` Keras' pairs and ``options`` (keywords; ``"positional"`` holds the positional ones)."""
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.1), initial_scale=64.0, dynamic_growth_steps=2)
    keywords = dict(options)
    positional = keywords.pop("positional", ())

    def forward(bad):
        return opt.get_scaled_loss(model() * bad)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(bad):
        _, grads = grad_fn(bad)
        (grad,) = opt.get_unscaled_gradients(grads)
        return opt.apply_gradients([(grad, model.var)], *positional, **keywords)

    return model, opt, (jit_if(compiled, step))


@pytest.mark.parametrize(
    "options",
    tiered(
        {
            "skip": {"skip_gradients_aggregation": True},
            "skip_positional": {"positional": (True,)},
            "no_skip_named": {"skip_gradients_aggregation": False, "name": "apply"},
            "legacy_keyword": {"experimental_aggregate_gradients": False, "name": None},
        },
        fast={"legacy_keyword"},
    ),
)
def test_tf_keras_apply_gradients_options_train_as_without_them(options, compiled):
    """tf.keras' apply_gradients(grads_and_vars, skip_gradients_aggregation=False, **kwargs) with its keywords
    (a TypeError before): the same skips, weights, iterations and scales as the call without them."""
    ours, control = _square_steps(options, compiled), _square_steps({}, compiled)
    for flag in [F, T, F, F, T, F]:
        bad = Tensor(np.float32(np.inf if flag else 1.0))
        skipped = [bool(step(bad).asnumpy()) for _, _, step in (ours, control)]
        assert skipped == [flag, flag]
        states = [
            (scalar_of(model.var), scalar_of(opt.loss_scale), scalar_of(opt.iterations))
            for model, opt, _ in (ours, control)
        ]
        assert states[0] == states[1]
    assert scalar_of(control[1].loss_scale) == _keras_rule([F, T, F, F, T, F], 64.0, 2)[-1]


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"skip_gradients_aggregation": "yes"}, "'skip_gradients_aggregation' must be a bool, but got str 'yes'"),
        ({"positional": (1,)}, "'skip_gradients_aggregation' must be a bool, but got int 1"),
        ({"name": 3}, "'name' must be a str or None, but got int 3"),
        ({"experimental_aggregate_gradients": 1}, "'experimental_aggregate_gradients' must be a bool, but got int 1"),
        ({"skip_gradient_aggregation": True}, "unexpected keyword argument 'skip_gradient_aggregation'"),
    ],
    ids=["skip_str", "skip_int", "name_int", "legacy_int", "misspelt"],
)
def test_bad_apply_gradients_options_are_refused_before_anything_is_applied(options, pattern, compiled):
    model, opt, step = _square_steps(options, compiled)
    with pytest.raises(TypeError, match=pattern):
        _read(step(Tensor(np.float32(1.0))))
    assert (scalar_of(model.var), scalar_of(opt.loss_scale), int(opt.iterations.asnumpy()[0])) == (1.0, 64.0, 0)
    assert opt.dynamic_counter == 0


def test_floor_at_one_and_no_growth_to_inf():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.0), initial_scale=4.0, dynamic_growth_steps=1)
    with pytest.warns(UserWarning, match="without get_scaled_loss"):
        for _ in range(5):
            opt.apply_gradients((Tensor(np.float32(np.nan)),))
    assert scalar_of(opt.loss_scale) == 1.0
    high = LossScaleOptimizer(nn.SGD(Square().trainable_params(), 0.0), initial_scale=2.0**127, dynamic_growth_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        high.apply_gradients((Tensor(np.float32(0.0)),))
    assert scalar_of(high.loss_scale) == 2.0**127


def test_float16_loss():
    """A float16 loss is scaled in float32 (the scaled value cannot overflow float16) and the gradient is exact."""
    model = Square(1.0, np.float16)
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25), initial_scale=2.0**15)

    def forward():
        return opt.get_scaled_loss(model())

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    scaled_loss, grads = grad_fn()
    assert scaled_loss.dtype == ms.float32 and scalar_of(scaled_loss) == 2.0**15
    # d(var**2 * S)/dvar = 2 * 2**15 = 65536 overflows float16: skipped, halved
    assert bool(opt.apply_gradients(opt.get_unscaled_gradients(grads)).asnumpy())
    assert scalar_of(model.var) == 1.0 and scalar_of(opt.loss_scale) == 2.0**14
    _, grads = grad_fn()
    assert not bool(opt.apply_gradients(opt.get_unscaled_gradients(grads)).asnumpy())
    assert scalar_of(model.var) == 0.5


def test_non_finite_loss_with_finite_gradients_is_skipped():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25), initial_scale=8.0)

    def forward(offset):
        return opt.get_scaled_loss(model() + offset)

    _, grads = ms.value_and_grad(forward, None, opt.parameters)(Tensor(np.float32(np.inf)))
    assert bool(opt.apply_gradients(opt.get_unscaled_gradients(grads)).asnumpy())
    assert scalar_of(model.var) == 1.0 and scalar_of(opt.loss_scale) == 4.0


def test_get_scaled_loss_callable_and_unscaled_gradients_with_none():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25), initial_scale=4.0)
    scaled = opt.get_scaled_loss(model)
    assert callable(scaled) and scalar_of(scaled()) == 4.0
    unscaled = opt.get_unscaled_gradients([Tensor(np.float32(8.0)), None])
    assert scalar_of(unscaled[0]) == 2.0 and unscaled[1] is None


def test_get_scaled_loss_of_a_callable_inside_a_compiled_function():
    """The callable form inside mindspore.jit (as Keras' inside tf.function) failed to compile (KeyError 'loss':
    callable() is not graph syntax); the scaled loss is the eager one, and the scaling call is recorded."""
    model = Square(3.0)
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25), initial_scale=4.0)

    def scaled_of_callable():
        return opt.get_scaled_loss(model)()

    assert scalar_of(ms.jit(scaled_of_callable)()) == 36.0
    assert bool(opt._iteration.loss_scaled.asnumpy())
    assert scalar_of(scaled_of_callable()) == 36.0


@pytest.mark.parametrize("call", ["apply_gradients", "call"])
def test_a_none_gradient_is_refused_by_position(compiled, call):
    """tf.keras leaves a variable whose gradient is None alone; a MindSpore optimizer updates all its parameters,
    so a None is refused, naming its position, before anything is applied (the wrapper's call gave MindSpore's
    "'int' object is not callable")."""
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25), initial_scale=4.0)

    def apply(grad):
        grads = (grad, None)
        return opt.apply_gradients(grads) if call == "apply_gradients" else opt(grads)

    apply = jit_if(compiled, apply)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(ValueError, match="gradient 1 is None: MindSpore optimizers need a gradient for every"):
            _read(apply(Tensor(np.float32(1.0))))
    assert scalar_of(model.var) == 1.0 and scalar_of(opt.loss_scale) == 4.0 and opt.dynamic_counter == 0


@pytest.mark.parametrize(
    "kwargs, initial_scale, growth_steps, trajectory",
    [
        (dict(), 2.0**15, 2000, [(1, 2.0**15), (2, 2.0**15), (3, 2.0**15)]),
        (dict(initial_scale=2.0, dynamic_growth_steps=3), 2.0, 3, [(1, 2.0), (2, 2.0), (0, 4.0)]),
    ],
)
@pytest.mark.slow
def test_dynamic_scale_properties(kwargs, initial_scale, growth_steps, trajectory):
    """tf.keras' test_getattr/test_dynamic_attrs: the defaults (2**15, 2000) or the given values; the counter
    counts clean steps and restarts when the scale grows (``trajectory``: counter and scale after each step)."""
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.0), **kwargs)
    assert (opt.dynamic, opt.dynamic_counter, opt.dynamic_growth_steps, opt.initial_scale) == (
        True,
        0,
        growth_steps,
        initial_scale,
    )
    after_each_step = []
    for _ in range(3):
        opt.minimize(model)
        after_each_step.append((opt.dynamic_counter, scalar_of(opt.loss_scale)))
    assert after_each_step == trajectory
    assert opt.initial_scale == initial_scale  # the initial scale, not the current one


def test_fixed_scale_properties_and_skips():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.1), dynamic=False, initial_scale=128.0)
    assert (opt.dynamic, opt.dynamic_counter, opt.dynamic_growth_steps, opt.initial_scale) == (False, None, None, 128.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert bool(opt.apply_gradients((Tensor(np.float32(np.inf)),)).asnumpy())  # Keras 2 would apply inf
    assert scalar_of(opt.loss_scale) == 128.0 and scalar_of(model.var) == 1.0


def _read(outputs):
    return outputs.asnumpy()


@pytest.mark.parametrize(
    "scale_loss, unscale, pattern",
    [
        (True, False, "loss_scale times too large"),
        (False, True, "1/loss_scale of the true gradients"),
    ],
)
@pytest.mark.slow
def test_wrongly_scaled_gradients_are_refused(compiled, scale_loss, unscale, pattern):
    net = regression_net()
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05))

    def forward(x, y):
        loss = net(x, y)
        return opt.get_scaled_loss(loss) if scale_loss else loss

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(x, y):
        _, grads = grad_fn(x, y)
        if unscale:
            grads = opt.get_unscaled_gradients(grads)
        return opt.apply_gradients(grads)

    step = jit_if(compiled, step)
    before = training_state(net)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match=pattern):
        warnings.simplefilter("always")
        _read(step(*[Tensor(a) for a in regression_batches(1)[0]]))
    assert changed_since(before, net) == []
    # one scaling call was made: the refusal says what is wrong, not the warning for neither call
    assert not [w for w in caught if "without get_scaled_loss" in str(w.message)]


@pytest.mark.slow
def test_every_iteration_is_checked_afresh(compiled):
    """The scaling calls are recorded per iteration: after a correct iteration, one that scales the loss but not
    the gradients (or the other way round) is refused too, not let through by the previous iteration's records."""
    net = regression_net()
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05))

    def forward(x, y):
        return opt.get_scaled_loss(net(x, y))

    scaled_fn, plain_fn = ms.value_and_grad(forward, None, opt.parameters), ms.value_and_grad(net, None, opt.parameters)

    def correct(x, y):
        return opt.apply_gradients(opt.get_unscaled_gradients(scaled_fn(x, y)[1]))

    def scaled_only(x, y):
        return opt.apply_gradients(scaled_fn(x, y)[1])

    def unscaled_only(x, y):
        return opt.apply_gradients(opt.get_unscaled_gradients(plain_fn(x, y)[1]))

    correct = jit_if(compiled, correct)
    x, y = [Tensor(a) for a in regression_batches(1)[0]]
    for wrong, pattern in ((scaled_only, "loss_scale times too large"), (unscaled_only, "1/loss_scale")):
        assert not bool(_read(correct(x, y)))
        before = training_state(net)
        with pytest.raises(RuntimeError, match=pattern):
            _read(jit_if(compiled, wrong)(x, y))
        assert changed_since(before, net) == []
    assert not bool(_read(correct(x, y)))


def test_applying_without_the_scaling_calls_warns_once():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))
    _, grads = ms.value_and_grad(model, None, opt.parameters)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.apply_gradients(grads)
        opt(grads)
    assert len(caught) == 1 and "without get_scaled_loss() and get_unscaled_gradients()" in str(caught[0].message)
    assert scalar_of(model.var) == 0.0  # the true gradients were applied twice: 1 - 0.5, then 0.5 - 0.5


@pytest.mark.parametrize("call", ["apply_gradients", "call"])
def test_the_warning_without_the_scaling_calls_names_the_callers_line(call):
    """Through the Cell's __call__ the warning named no file of the user's ('sys', line 1): a fixed stacklevel."""
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))
    _, grads = ms.value_and_grad(model, None, opt.parameters)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.apply_gradients(grads) if call == "apply_gradients" else opt(grads)
    assert [(w.category, w.filename) for w in caught] == [(UserWarning, __file__)]


@pytest.mark.parametrize("entry", [lambda g, v: (g,), lambda g, v: (g, v, v)], ids=["one", "three"])
def test_keras_pairs_of_other_lengths_are_refused_before_anything_is_applied(entry):
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))

    def forward():
        return opt.get_scaled_loss(model())

    grads = opt.get_unscaled_gradients(ms.value_and_grad(forward, None, opt.parameters)()[1])
    with pytest.raises(TypeError, match="entry 0 is not a pair of two"):
        opt.apply_gradients([entry(grads[0], model.var)])
    assert scalar_of(model.var) == 1.0 and scalar_of(opt.iterations) == 0


def test_eager_iterations_compile_once(compilations):
    """Called from Python, the apply step is one compiled Cell given the gradients as a mutable tuple: compiled at
    the first iteration only (a plain tuple of Tensors is a constant to MindSpore, so each new value of the
    gradients compiled it again, 0.2 s per call)."""
    net = regression_net()
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05))

    def forward(x, y):
        return opt.get_scaled_loss(net(x, y))

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for iteration, (x, y) in enumerate(regression_batches(3)):
        assert not bool(_read(opt.apply_gradients(opt.get_unscaled_gradients(grad_fn(Tensor(x), Tensor(y))[1]))))
        if iteration == 0:
            first = len(compilations)
    assert len(compilations) == first, compilations


def test_minimize_checks_var_list():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))
    for var_list in ([Parameter(Tensor(np.float32(1.0)), name="other")], []):
        with pytest.raises(ValueError, match="'var_list' must be the inner optimizer's parameters"):
            opt.minimize(model, var_list=var_list)
    with pytest.raises(ValueError, match="'loss' must be a callable"):
        opt.minimize(Tensor(np.float32(1.0)))
    opt.minimize(model, var_list=model.var)
    assert scalar_of(model.var) == 0.5


def _gradient_method_step(method, compiled):
    """A regression net, its wrapper (Momentum, scale 2**10, growth every 2 steps) and one step ``step(x, y)`` taking
    its gradients from the wrapper: ``"recipe"`` is tf.keras' manual recipe (:func:`nets.keras_step`);
    ``"get_gradients"`` and ``"compute_gradients"`` are Keras' methods, then ``apply_gradients``."""
    net = regression_net()
    opt = LossScaleOptimizer(
        nn.Momentum(net.trainable_params(), 0.05, 0.9), initial_scale=2.0**10, dynamic_growth_steps=2
    )
    if method == "recipe":
        step = keras_step(net, opt)
    else:

        def step(x, y):
            def loss():
                return net(x, y)

            if method == "get_gradients":
                return opt.apply_gradients(zip(opt.get_gradients(loss, opt.parameters), opt.parameters))
            return opt.apply_gradients(opt.compute_gradients(loss, opt.parameters))

    return net, opt, (jit_if(compiled, step))


@pytest.mark.parametrize("method", ["get_gradients", "compute_gradients"])
@pytest.mark.slow
def test_keras_gradient_methods_train_as_the_manual_recipe(method, compiled):
    """Keras' get_gradients (the documentation: "in methods minimize and get_gradients, it scales the loss and
    unscales the gradients") and compute_gradients were missing (AttributeError). Followed by apply_gradients they
    train as get_scaled_loss / get_unscaled_gradients / apply_gradients: the same skips, weights, moments, scales and
    iterations, with a batch of inf, and without the warning about missing scaling calls."""
    ours, control = _gradient_method_step(method, compiled), _gradient_method_step("recipe", compiled)
    batches = regression_batches(5)
    batches[2] = (with_inf(batches[2][0]), batches[2][1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for index, (x, y) in enumerate(batches):
            skipped = [bool(_read(step(Tensor(x), Tensor(y)))) for _, _, step in (ours, control)]
            assert skipped == [index == 2] * 2
            assert changed_since(training_state(control[0]), ours[0]) == []
            counters = [
                (scalar_of(opt.loss_scale), opt.dynamic_counter, scalar_of(opt.iterations))
                for _, opt, _ in (ours, control)
            ]
            assert counters[0] == counters[1] and counters[1][2] == index + 1
    assert scalar_of(control[1].loss_scale) == _keras_rule([F, F, T, F, F], 2.0**10, 2)[-1]


@pytest.mark.parametrize("method, argument", [("get_gradients", "params"), ("compute_gradients", "var_list")])
def test_keras_gradient_methods_refuse_before_anything_changes(method, argument):
    """A loss Tensor (Keras' get_gradients takes the loss of a graph; MindSpore differentiates a function), variables
    that are not the inner optimizer's parameters in order, and (compute_gradients) a gradient tape."""
    net = regression_net()
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05))
    compute = getattr(opt, method)
    x, y = (Tensor(value) for value in regression_batches(1)[0])
    before = training_state(net)
    with pytest.raises(ValueError, match="'loss' must be a callable returning the loss, but got Tensor"):
        compute(net(x, y), opt.parameters)
    with pytest.raises(ValueError, match=f"'{argument}' must be the inner optimizer's parameters, in order"):
        compute(lambda: net(x, y), tuple(reversed(opt.parameters)))
    if method == "compute_gradients":
        with pytest.raises(ValueError, match="'tape' must be None, but got object"):
            compute(lambda: net(x, y), opt.parameters, tape=object())
    assert changed_since(before, net) == [] and opt.dynamic_counter == 0 and scalar_of(opt.iterations) == 0


def _pair_makers(net, opt):
    """Functions ``grads -> pairs`` (each a plain function, so a compiled step can call it)."""
    in_network_order = ms.ParameterTuple(net.trainable_params())
    in_optimizer_order = opt.parameters
    look_alike = Parameter(Tensor(np.zeros(in_optimizer_order[0].shape, np.float32)), name="look_alike")

    def network_order(grads):
        return zip(grads, in_network_order)

    def optimizer_order(grads):
        return zip(grads, in_optimizer_order)

    def subset(grads):
        return list(zip(grads, in_optimizer_order))[:2]

    def with_a_look_alike(grads):
        return [(grads[0], look_alike)] + list(zip(grads, in_optimizer_order))[1:]

    return {
        "network order": network_order,
        "optimizer order": optimizer_order,
        "subset": subset,
        "look-alike": with_a_look_alike,
    }


def _one_keras_step(opt, net, pairs, compiled, x, y):
    """One step of :func:`nets.keras_step` with ``apply_gradients(pairs(grads))`` (or the gradient tuple if
    ``pairs`` is None), read on the host."""
    step = keras_step(net, opt, pairs)
    return _read(jit_if(compiled, step)(x, y))


# From Python the pairs' variables are checked by identity. Inside a compiled function a Parameter's identity is
# not visible: the variables are not checked, the gradients apply by position (here computed for the optimizer's
# parameters, so the mislabelled "network order" trains correctly), and MindSpore refuses gradients that do not
# fit the optimizer ("subset") while compiling.
PAIR_CASES = [
    (False, "network order", True),
    (False, "optimizer order", False),
    (False, "subset", True),
    (False, "look-alike", True),
    (True, "network order", False),
    (True, "optimizer order", False),
    (True, "subset", True),
]


@pytest.mark.parametrize("compiled, make_pairs, refused", PAIR_CASES)
@pytest.mark.slow
def test_keras_pairs_must_name_the_inner_optimizers_parameters_in_order(compiled, make_pairs, refused):
    """Keras' (gradient, variable) pairs name each gradient's variable, but a MindSpore optimizer applies its i-th
    gradient to its i-th parameter: pairs in another order (a group-parameter optimizer lists its groups in turn)
    would update a parameter with another one's gradient. A refused call applies nothing; an accepted one
    trains as the gradient tuple does."""
    net = regression_net()
    opt = LossScaleOptimizer(group_optimizer(net), initial_scale=2.0**10)
    pairs = _pair_makers(net, opt)[make_pairs]
    x, y = (Tensor(a) for a in regression_batches(1)[0])
    before = training_state(net)
    if refused:
        pattern = "shape|length" if compiled else "'grads_and_vars' must be the inner optimizer's parameters, in order"
        with pytest.raises((ValueError, RuntimeError), match=pattern):
            _one_keras_step(opt, net, pairs, compiled, x, y)
        assert changed_since(before, net) == []
        assert (scalar_of(opt.loss_scale), opt.dynamic_counter, opt.iterations.asnumpy().item()) == (2.0**10, 0, 0)
        return
    assert not bool(_one_keras_step(opt, net, pairs, compiled, x, y))
    assert changed_since(before, net) != []
    paired = training_state(net)
    control_net = regression_net()
    control = LossScaleOptimizer(group_optimizer(control_net), initial_scale=2.0**10)
    _one_keras_step(control, control_net, None, False, x, y)
    for name, value in training_state(control_net).items():
        np.testing.assert_array_equal(paired[name], value, err_msg=name)


def test_keras_pairs_under_bytecode_capture_are_refused_with_the_way_out():
    """mindspore.jit(capture_mode="bytecode") hands the pairs' variables over as plain Tensors: their order cannot
    be checked. The refusal said "expected ['0.weight', ...], but got ['Tensor', ...]. Pass them in the order of
    opt.parameters", which they were; it now says why and what works (the gradients alone, tested in
    test_compatibility.py, or capture_mode='ast'). Nothing is applied."""
    net = regression_net()
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=2.0**10)
    step = ms.jit(keras_step(net, opt, lambda grads: list(zip(grads, opt.parameters))), capture_mode="bytecode")
    before = training_state(net)
    with pytest.raises(
        ValueError,
        match=r"the variables of 'grads_and_vars' are plain Tensors, not the inner "
        r"optimizer's Parameters.*Pass the gradients alone",
    ):
        step(*(Tensor(a) for a in regression_batches(1)[0]))
    assert changed_since(before, net) == []
    assert (scalar_of(opt.loss_scale), opt.dynamic_counter, opt.iterations.asnumpy().item()) == (2.0**10, 0, 0)


@pytest.mark.slow
def test_a_checkpoint_resumes_exactly_in_another_wrapper(tmp_path):
    """MindSpore's checkpoint path: ``save_checkpoint(opt)`` holds the inner optimizer's state (with the weights
    it updates) and the wrapper's (scale, counter, under its ``name``); ``load_param_into_net`` into a new
    wrapper continues exactly as an uninterrupted run, overflow and growth included. A wrapper used in a
    compiled step stays alive in MindSpore's caches, so in one process the new one has another name and the
    keys are renamed (in a fresh process the same name is free: docs/migration.md)."""
    batches = [(with_inf(x) if i == 1 else x, y) for i, (x, y) in enumerate(regression_batches(7))]

    def build(name):
        net = regression_net()
        opt = LossScaleOptimizer(
            nn.Momentum(net.trainable_params(), 0.05, 0.9), initial_scale=2.0**10, dynamic_growth_steps=2, name=name
        )
        return net, opt, keras_step(net, opt)

    def train(step, part):
        return [bool(_read(step(Tensor(x), Tensor(y)))) for x, y in part]

    net, opt, step = build("keras_uninterrupted")
    expected = train(step, batches)
    assert expected == [False, True, False, False, False, False, False]
    _, first, first_step = build("keras_first")
    assert train(first_step, batches[:3]) == expected[:3]
    path = str(tmp_path / "keras.ckpt")
    ms.save_checkpoint(first, path)
    resumed_net, resumed, resumed_step = build("keras_resumed")
    saved = {key.replace("keras_first.", "keras_resumed.", 1): value for key, value in ms.load_checkpoint(path).items()}
    not_loaded, _ = ms.load_param_into_net(resumed, saved)
    assert not_loaded == []
    assert (scalar_of(resumed.loss_scale), resumed.dynamic_counter) == (2.0**9, 1)
    assert train(resumed_step, batches[3:]) == expected[3:]
    assert (scalar_of(resumed.loss_scale), resumed.dynamic_counter) == (scalar_of(opt.loss_scale), opt.dynamic_counter)
    assert scalar_of(opt.loss_scale) == 2.0**11  # backed off once, grew twice
    for name, value in training_state(net).items():
        np.testing.assert_array_equal(training_state(resumed_net)[name], value, err_msg=name)


def test_default_names_follow_the_inner_optimizer_so_wrappers_resume_in_any_order(tmp_path):
    """Two wrappers with default names, saved in one checkpoint and built again in the other order: each gets its
    own scale back. Named by creation order, the two states were swapped silently."""

    def build(order):
        nets = {role: regression_net(seed=seed) for seed, role in enumerate(("generator", "discriminator"))}
        for role, net in nets.items():
            for parameter in net.trainable_params():
                parameter.name = f"{role}.{parameter.name}"
        return {
            role: LossScaleOptimizer(nn.SGD(nets[role].trainable_params(), 0.05), initial_scale=scale)
            for role, scale in order
        }

    saved = build([("generator", 1024.0), ("discriminator", 64.0)])
    path = str(tmp_path / "wrappers.ckpt")
    own = [p for wrapper in saved.values() for p in wrapper.get_parameters() if p.name.startswith("loss_scale_opt")]
    assert "loss_scale_optimizer.generator.0.weight.scale" in [p.name for p in own]
    ms.save_checkpoint(own, path)
    del saved
    gc.collect()  # never used in a graph: the names are free again
    resumed = build([("discriminator", 2.0), ("generator", 2.0)])
    checkpoint = ms.load_checkpoint(path)
    for wrapper in resumed.values():
        not_loaded = ms.load_param_into_net(wrapper, checkpoint)[0]
        assert [name for name in not_loaded if name.startswith("loss_scale_opt")] == []
    assert {role: scalar_of(wrapper.loss_scale) for role, wrapper in resumed.items()} == {
        "generator": 1024.0,
        "discriminator": 64.0,
    }


def test_a_checkpoint_of_a_wrapper_with_another_growth_interval_is_reported(tmp_path, compiled):
    """Three clean steps counted under dynamic_growth_steps=4, loaded into a wrapper with 2: the count is beyond
    its window, reported when the step is compiled, before anything is applied; check_state() says it too."""

    def build(name, growth_steps):
        net = regression_net()
        opt = LossScaleOptimizer(
            nn.SGD(net.trainable_params(), 0.05), initial_scale=2.0**10, dynamic_growth_steps=growth_steps, name=name
        )
        return net, opt, keras_step(net, opt)

    _, saved, step = build(f"keras_window4_{compiled}", 4)
    for x, y in regression_batches(3):
        step(Tensor(x), Tensor(y))
    path = str(tmp_path / "window4.ckpt")
    ms.save_checkpoint(saved, path)
    net, resumed, step = build(f"keras_window2_{compiled}", 2)
    checkpoint = {key.replace("window4", "window2", 1): value for key, value in ms.load_checkpoint(path).items()}
    ms.load_param_into_net(resumed, checkpoint)
    step = jit_if(compiled, step)
    before = training_state(net)
    refusal = r"'keras_window2_\w+\.good_steps' must be an int in \[0, 1\], but got 3.*dynamic_growth_steps=2"
    with pytest.raises(ValueError, match=refusal):
        _read(step(*(Tensor(a) for a in regression_batches(1)[0])))
    assert changed_since(before, net) == []
    with pytest.raises(ValueError, match=refusal):
        resumed.check_state()


@pytest.mark.slow
def test_a_fixed_scale_is_a_constant_that_no_checkpoint_changes(tmp_path, compiled):
    """As in tf.keras (a Python constant): a fixed wrapper holds no scale Parameter, so a checkpoint of a dynamic
    wrapper of the same name leaves its scale alone (the fixed scale must not silently become the saved one
    while ``initial_scale`` reports the fixed one)."""

    def build(name, **kwargs):
        net = regression_net()
        return net, LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), name=name, **kwargs)

    name = f"keras_fixed_vs_dynamic_{compiled}"  # a wrapper used in a graph keeps its name: one per case
    _, dynamic = build(name, initial_scale=512.0)
    path = str(tmp_path / "dynamic.ckpt")
    ms.save_checkpoint(dynamic, path)
    del dynamic
    gc.collect()  # never used in a graph: the name is free again
    net, fixed = build(name, dynamic=False, initial_scale=128.0)
    _, unused = ms.load_param_into_net(fixed, ms.load_checkpoint(path))
    assert f"{name}.scale" in unused
    control_net, control = build(None, dynamic=False, initial_scale=128.0)
    step, control_step = keras_step(net, fixed), keras_step(control_net, control)
    step = jit_if(compiled, step)
    for x, y in regression_batches(2):
        _read(step(Tensor(x), Tensor(y)))
        control_step(Tensor(x), Tensor(y))
    assert scalar_of(fixed.loss_scale) == fixed.initial_scale == 128.0
    for name, value in training_state(control_net).items():
        np.testing.assert_array_equal(training_state(net)[name], value, err_msg=name)


@pytest.mark.slow
def test_eager_and_compiled_give_identical_training():
    results = []
    for compiled in (False, True):
        net = regression_net()
        opt = LossScaleOptimizer(nn.Adam(net.trainable_params(), 0.01), initial_scale=2.0**10, dynamic_growth_steps=2)
        step = keras_step(net, opt)
        step = jit_if(compiled, step)
        for i, (x, y) in enumerate(regression_batches(5)):
            if i == 2:
                x = with_inf(x)
            step(Tensor(x), Tensor(y))
        results.append((scalar_of(opt.loss_scale), opt.dynamic_counter, training_state(net)))
    assert results[0][:2] == results[1][:2]
    for name, value in results[0][2].items():
        np.testing.assert_array_equal(results[1][2][name], value, err_msg=name)


def test_two_wrappers_in_one_graph():
    models = [Square(1.0), Square(2.0)]
    for index, model in enumerate(models):
        model.var.name = f"var{index}"
    opts = [
        LossScaleOptimizer(own_names(nn.SGD(m.trainable_params(), 0.25), f"opt{i}"), initial_scale=8.0)
        for i, m in enumerate(models)
    ]

    def forward_fn(model, opt):
        def forward():
            return opt.get_scaled_loss(model())

        return ms.value_and_grad(forward, None, opt.parameters)

    grad_fns = [forward_fn(m, o) for m, o in zip(models, opts)]

    @ms.jit
    def step():
        skipped = ()
        for grad_fn, opt in zip(grad_fns, opts):
            _, grads = grad_fn()
            skipped = skipped + (opt.apply_gradients(opt.get_unscaled_gradients(grads)),)
        return skipped

    assert [bool(s.asnumpy()) for s in step()] == [False, False]
    assert [scalar_of(m.var) for m in models] == [0.5, 1.0]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph_mode", "pynative"])
@pytest.mark.parametrize("call", ["apply_gradients", "call"])
@pytest.mark.slow
def test_a_refused_apply_leaves_the_wrapper_usable(mode, call):
    """In GRAPH_MODE (and now in PyNative) the apply step is a compiled Cell, and on MindSpore 2.10 a compiled Cell
    that raised fails at every later call ("Invalid output number for flatten stub output nodes"): after one
    refused apply_gradients, every later one failed. The refusal is now decided from Python, before the Cell runs."""
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        net, control_net = regression_net(), regression_net()
        opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05))
        control_opt = nn.SGD(control_net.trainable_params(), 0.05)
        apply = opt.apply_gradients if call == "apply_gradients" else opt

        def forward(x, y):
            return opt.get_scaled_loss(net(x, y))

        grad_fn = ms.value_and_grad(forward, None, opt.parameters)
        control_fn = ms.value_and_grad(control_net, None, control_opt.parameters)
        batches = [tuple(Tensor(a) for a in batch) for batch in regression_batches(3)]
        with pytest.raises(RuntimeError, match="loss_scale times too large"):
            apply(grad_fn(*batches[0])[1])
        for x, y in batches:
            assert not bool(apply(opt.get_unscaled_gradients(grad_fn(x, y)[1])).asnumpy())
            control_opt(control_fn(x, y)[1])
        after, expected = training_state(net), training_state(control_net)
        for name, value in expected.items():
            np.testing.assert_allclose(after[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    finally:
        ms.set_context(mode=previous)
