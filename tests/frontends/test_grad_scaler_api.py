"""GradScaler's API, held to Paddle's and PyTorch's own tests: spellings, defaults and signatures, bad
arguments, update(new_scale), host-only methods, disabled scalers, getters and setters, optimizer keys, and the
compiled calls behind eager use."""

import gc
import inspect
import weakref

import mindspore as ms
import numpy as np
import pytest
from backend_standins import SaturatingNet, StatusRegister
from grad_scaler_harness import (
    SKIP_ITER,
    poisoned_grads,
    read_outputs,
    same_training_state,
    scaled_grad_fn,
    sgd,
    tensor_batches,
)
from mindspore import Tensor, nn, ops
from nets import GradCapture, jit_if, regression_batches, regression_net, training_state, with_inf

from lossscale import GradScaler, TorchGradScaler, get_preset
from lossscale.core.overflow import AscendSaturationCheck
from lossscale.frontends._eager_calls import CompiledCalls
from lossscale.frontends.optimizer_states import DEFAULT_CAPACITY

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
    assert torch._rule == get_preset("pytorch") and paddle._rule == get_preset("paddle")


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
    ({"policy": "tensorflow"}, ValueError, "'policy'.*'tensorflow'"),
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
    assert scaler.get_scale() == 65536.0 and scaler._rule == get_preset("pytorch")
    assert type(GradScaler.from_preset("pytorch")) is TorchGradScaler
    assert GradScaler.from_preset("megatron").get_decr_every_n_nan_or_inf() == 2


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
        read_outputs(only_update(Tensor(1.0)))
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
    _, grads = scaled_grad_fn(scaler, net, opt)(*[Tensor(a) for a in regression_batches(1)[0]])
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
        # the README's tier: one bad number, one bad type, one bad Tensor
        (0.0, ValueError),
        pytest.param(float("nan"), ValueError, marks=pytest.mark.slow),
        ("2", TypeError),
        pytest.param(Tensor(np.float32(-1.0)), ValueError, marks=pytest.mark.slow),
        (Tensor(np.float32(1e-40)), ValueError),  # 1/S is inf
        pytest.param(Tensor(np.float32([1.0, 2.0])), TypeError, marks=pytest.mark.slow),
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
        read_outputs(update(Tensor(new_scale)))
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
        grad_fn = scaled_grad_fn(scaler, net, opt)

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
            read_outputs(call(*args))
        assert scaler.get_scale() == 256.0
        return
    read_outputs(call(*args))
    assert scaler.get_scale() == new_scale
    resumed = _bounded_scaler()
    resumed.load_state_dict(scaler.state_dict())
    assert resumed.state_dict() == scaler.state_dict()


def test_disabled_scaler_is_an_exact_no_op_and_reports_like_its_framework():
    disabled = GradScaler(enable=False)
    net, control = regression_net(), regression_net()
    opt, control_opt = nn.SGD(net.trainable_params(), 0.05), nn.SGD(control.trainable_params(), 0.05)
    grad_fn, control_fn = scaled_grad_fn(disabled, net, opt), ms.value_and_grad(control, None, control_opt.parameters)
    for x, y in tensor_batches(3):
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
    _, grads = scaled_grad_fn(scaler, net, opt)(x, y)
    scaler.step(opt, grads)
    for got, want in zip(opt.captured, expected):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6)


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
        opt, control_opt = sgd(net.trainable_params()), sgd(control_net.trainable_params())
        scaler = GradScaler("cuda", init_scale=128.0, growth_interval=1)
        grad_fn = scaled_grad_fn(scaler, net, opt)
        control_fn = ms.value_and_grad(control_net, None, control_opt.parameters)
        compiled = compilations
        for iteration, (x, y) in enumerate(tensor_batches(5)):
            _, grads = grad_fn(x, y)
            grads = scaler.unscale_(poisoned_grads(grads, Tensor(iteration == SKIP_ITER)))
            assert bool(scaler.step(opt, grads).asnumpy()) == (iteration == SKIP_ITER)
            scaler.update()
            if iteration != SKIP_ITER:
                control_opt(control_fn(x, y)[1])
            if iteration == 0:
                first = len(compiled)
        # unscale_, step and update each ran a compiled Cell of the scaler's (not the few hundred kernels of PyNative)
        assert len(scaler._calls._functions) == 3
        assert len(compiled) == first, compiled  # nothing compiled after the first iteration
        same_training_state((net, opt), (control_net, control_opt))
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


@pytest.mark.slow
def test_a_scaler_used_eagerly_is_freed():
    """The compiled calls hold the scaler's graph part, not the scaler: MindSpore keeps what a compiled Cell uses
    alive, and a compiled Cell holding the scaler (or a bound method of it) was never freed, nor its name."""
    scaler = GradScaler("cuda", name="freed_after_eager_use")
    opt = sgd(regression_net().trainable_params())
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


@pytest.mark.parametrize("value, scale_after", [(1.0, 1024.0), (np.inf, 512.0)], ids=["finite", "inf"])
def test_unscale_passes_a_none_gradient_through(compiled, value, scale_after):
    """PyTorch's unscale_ skips parameters without a gradient. Since unscale_ records the global norm of what it
    returns, a None entry crashed it ('NoneType' object has no attribute 'size' eagerly, a dtype error under jit)."""
    scaler = GradScaler("cuda", init_scale=1024.0)

    def unscale(grad):
        return scaler.unscale_((grad, None))

    unscale = jit_if(compiled, unscale)
    grad, missing = unscale(Tensor(np.full(3, value * 1024.0, np.float32)))
    assert missing is None and grad.asnumpy().tolist() == [value] * 3
    scaler.update()  # the inf that unscale_ found backs off
    assert scaler.get_scale() == scale_after
