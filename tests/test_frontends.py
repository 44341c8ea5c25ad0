"""Presets against independent re-implementations of each original rule; GradScaler; LossScaleOptimizer."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from conftest import UpdateCellDriver
from lossscale import DynamicLossScaleManager, DynamicLossScaleUpdateCell, GradScaler, LossScaleOptimizer, get_preset
from lossscale.policy import run
from lossscale.presets import DIFFERENCES, PRESET_NAMES
from nets import GradCapture, regression_batches, regression_net, training_state

F32 = np.float32
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the originals grow to inf


# ---- the originals, written from each library's source (not from lossscale.policy) --------------------

def torch_rule(flags, scale=2.0**16, growth=2.0, backoff=0.5, interval=2000):
    """torch._amp_update_scale_: no floor; a non-finite growth keeps the scale."""
    scale, tracker, out = F32(scale), 0, []
    for found_inf in flags:
        if found_inf:
            scale, tracker = F32(scale * F32(backoff)), 0
        else:
            tracker += 1
            if tracker == interval:
                grown = F32(scale * F32(growth))
                scale, tracker = (grown if np.isfinite(grown) else scale), 0
        out.append(float(scale))
    return out


def paddle_rule(flags, scale=2.0**15, incr=2.0, decr=0.5, incr_n=1000, decr_n=2, floor=None, guard=False):
    """Paddle: dygraph AmpScaler._update (floor=None, guard=False) or the update_loss_scaling op (1, True)."""
    scale, incr_count, decr_count, out = F32(scale), 0, 0, []
    for found_inf in flags:
        if found_inf:
            incr_count, decr_count = 0, decr_count + 1
            if decr_count == decr_n:
                scale, decr_count = F32(scale * F32(decr)), 0
                if floor is not None and scale < floor:
                    scale = F32(floor)
        else:
            decr_count, incr_count = 0, incr_count + 1
            if incr_count == incr_n:
                grown = F32(scale * F32(incr))
                scale = grown if (np.isfinite(grown) or not guard) else scale
                incr_count = 0
        out.append(float(scale))
    return out


def keras_rule(flags, scale=2.0**15, growth_steps=2000):
    """Keras 3 LossScaleOptimizer: x2 when step_counter == growth_steps - 1 on a finite step; /2 otherwise."""
    scale, counter, out = F32(scale), 0, []
    for non_finite in flags:
        if non_finite:
            scale, counter = F32(scale / F32(2.0)), 0
        elif counter == growth_steps - 1:
            scale, counter = F32(scale * F32(2.0)), 0
        else:
            counter += 1
        out.append(float(scale))
    return out


def jmp_rule(flags, scale=2.0**15, period=2000, factor=2, min_loss_scale=1.0):
    """jmp.DynamicLossScale.adjust: first_finite guard, floor at min_loss_scale."""
    scale, counter, out = F32(scale), 0, []
    for non_finite in flags:
        finite = not non_finite
        if finite:
            if counter == period - 1:
                grown = F32(scale * F32(factor))
                scale = grown if np.isfinite(grown) else scale
        else:
            scale = max(F32(min_loss_scale), F32(scale / F32(factor)))
        counter = ((counter + 1) % period) * int(finite)
        out.append(float(scale))
    return out


def megatron_rule(flags, scale=2.0**32, min_scale=1.0, growth=2.0, backoff=0.5, interval=1000, hysteresis=2):
    """Megatron-LM DynamicGradScaler.update."""
    scale, growth_tracker, hysteresis_tracker, out = F32(scale), 0, hysteresis, []
    for found_inf in flags:
        if found_inf:
            growth_tracker = 0
            hysteresis_tracker -= 1
            if hysteresis_tracker <= 0:
                scale = max(F32(scale * F32(backoff)), F32(min_scale))
        else:
            growth_tracker += 1
            if growth_tracker == interval:
                growth_tracker, hysteresis_tracker = 0, hysteresis
                scale = F32(scale * F32(growth))
        out.append(float(scale))
    return out


def mindspore_rule(flags, scale=2.0**24, factor=2.0, window=2000):
    """mindspore.nn.DynamicLossScaleUpdateCell (grows to inf)."""
    scale, cur, last, out = F32(scale), 1, 0, []
    for overflow in flags:
        if overflow:
            scale, last = max(F32(scale * (F32(1) / F32(factor))), F32(1.0)), cur
        elif window <= cur - last:
            scale, last = F32(scale * F32(factor)), cur
        cur += 1
        out.append(float(scale))
    return out


T, F = True, False
# (preset, overrides, the original rule with the same settings, overflow pattern)
PRESET_CASES = [
    ("pytorch", dict(growth_interval=3), lambda f: torch_rule(f, interval=3), [F, F, F, T, T, F, F, F, F, F, F]),
    ("pytorch", dict(), torch_rule, [T] * 170),                                    # reaches 0: no floor
    ("pytorch", dict(init_scale=2.0**127, growth_interval=1), lambda f: torch_rule(f, 2.0**127, interval=1), [F, F, T, F]),
    ("paddle", dict(growth_interval=3), lambda f: paddle_rule(f, incr_n=3), [T, F, T, T, T, T, T, F, F, F, T]),
    ("paddle", dict(), paddle_rule, [T] * 330),                                     # no floor: 0
    ("paddle_static", dict(growth_interval=2), lambda f: paddle_rule(f, incr_n=2, floor=1.0, guard=True),
     [T, T, F, F, T, T, T, T] + [T] * 40),
    ("paddle_static", dict(init_scale=2.0**127, growth_interval=1),
     lambda f: paddle_rule(f, 2.0**127, incr_n=1, floor=1.0, guard=True), [F, F, F]),
    ("keras", dict(growth_interval=2), lambda f: keras_rule(f, growth_steps=2), [F, F, F, T, F, F, T, T, F]),
    ("keras", dict(), keras_rule, [T] * 180),
    ("jmp", dict(growth_interval=3), lambda f: jmp_rule(f, period=3), [F, F, F, T, T, F, F, F] + [T] * 20),
    ("jmp", dict(init_scale=2.0**127, growth_interval=1), lambda f: jmp_rule(f, 2.0**127, period=1), [F, F]),
    ("megatron", dict(growth_interval=3), lambda f: megatron_rule(f, interval=3),
     [T, F, T, T, T, F, F, F, T, F, T, T] + [T] * 40),
    ("mindspore", dict(growth_interval=3), lambda f: mindspore_rule(f, window=3), [F, F, F, T, T, F, F, F] + [T] * 30),
]


@pytest.mark.parametrize("name, overrides, original, flags", PRESET_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(PRESET_CASES)])
def test_preset_equals_the_original_rule(name, overrides, original, flags):
    assert [s.scale for s in run(get_preset(name, **overrides), flags)] == original(flags)


@pytest.mark.parametrize("name, original", [
    ("keras", lambda f: keras_rule(f, 2.0**127, growth_steps=1)),
    ("megatron", lambda f: megatron_rule(f, 2.0**127, interval=1)),
    ("paddle", lambda f: paddle_rule(f, 2.0**127, incr_n=1)),
    ("mindspore", lambda f: mindspore_rule(f, 2.0**127, window=1)),
])
def test_deliberate_difference_the_finiteness_guard(name, original):
    flags = [F, F]
    ours = [s.scale for s in run(get_preset(name, init_scale=2.0**127, growth_interval=1), flags)]
    assert math.isinf(original(flags)[-1]) and ours == [2.0**127, 2.0**127]
    assert "inf" in DIFFERENCES[name]


def test_known_facts_about_floors():
    from_2_16 = run(get_preset("pytorch"), [T] * 166)
    assert from_2_16[-2].scale == 2.0**-149 and from_2_16[-1].scale == 0.0   # ~150 overflows after reaching 1
    assert run(get_preset("paddle_static"), [T] * 100)[-1].scale == 1.0
    assert run(get_preset("mindspore"), [T] * 100)[-1].scale == 1.0
    assert run(get_preset("jmp", min_scale=4.0),
               [T] * 100)[-1].scale == 4.0
    assert run(get_preset("keras"), [T] * 200)[-1].scale == 0.0


def test_paddle_counts_consecutive_bad_steps():
    policy = get_preset("paddle", init_scale=64.0)
    assert [s.scale for s in run(policy, [T, F, T, F, T, T, T, T])] == [64, 64, 64, 64, 64, 32, 32, 16]


def test_preset_errors():
    with pytest.raises(ValueError, match="'preset'.*'tensorflow'"):
        get_preset("tensorflow")
    with pytest.raises(TypeError, match="unknown LossScalePolicy field"):
        get_preset("pytorch", scale_window=10)
    assert set(DIFFERENCES) == set(PRESET_NAMES)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_graph_cells_and_managers_apply_presets(name):
    policy = get_preset(name, growth_interval=3, init_scale=2.0**20)
    flags = [bool(x) for x in np.random.RandomState(len(name)).rand(60) < 0.3]
    cell = DynamicLossScaleUpdateCell.from_policy(policy)
    assert cell.policy == policy and DynamicLossScaleManager.from_policy(policy).policy == policy
    assert UpdateCellDriver(cell).run(flags) == [s.scale for s in run(policy, flags)]


@pytest.mark.reference
def test_pytorch_grad_scaler_live():
    torch = pytest.importorskip("torch")
    flags = [F, F, T, F, F, F, T, T] + [F] * 5
    scale, tracker, found = torch.tensor([2.0**16]), torch.tensor([0], dtype=torch.int32), torch.tensor([0.0])
    theirs = []
    for flag in flags:
        found.fill_(1.0 if flag else 0.0)
        torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3)  # pylint: disable=protected-access
        theirs.append(float(scale))
    assert [s.scale for s in run(get_preset("pytorch", growth_interval=3), flags)] == theirs


# ---- GradScaler -------------------------------------------------------------------------------------------

class SeedConv(nn.Cell):
    """The seeds' example: paddle.nn.Conv2D(3, 2, 3) and loss = mean(conv(x))."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, has_bias=True, pad_mode="valid", weight_init="normal", bias_init="zeros")

    def construct(self, x):
        return self.conv(x).mean()


def _seed_loop(scaler, compiled, steps=4):
    ms.set_seed(0)
    model = SeedConv()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.01)

    def forward(data):
        return scaler.scale(model(data))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(data):
        scaled, grads = grad_fn(data)
        scaler.minimize(optimizer, grads)
        return scaled

    train_step = ms.jit(train_step) if compiled else train_step
    data = Tensor(np.random.RandomState(0).rand(10, 3, 32, 32).astype(np.float32))
    losses = [float(train_step(data).asnumpy()) / scaler.get_scale() for _ in range(steps)]
    return losses, model


@pytest.mark.parametrize("compiled", [False, True], ids=["pynative", "jit"])
def test_seed_example_trains(compiled):
    scaler = GradScaler(init_loss_scaling=1024)
    losses, _ = _seed_loop(scaler, compiled)
    assert losses[-1] < losses[0] and scaler.get_scale() == 1024.0


def test_disabled_scaler_is_an_exact_no_op():
    disabled = GradScaler(enable=False)
    _, scaled_model = _seed_loop(disabled, compiled=False, steps=3)
    ms.set_seed(0)
    model = SeedConv()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(model, None, optimizer.parameters)
    data = Tensor(np.random.RandomState(0).rand(10, 3, 32, 32).astype(np.float32))
    for _ in range(3):
        _, grads = grad_fn(data)
        optimizer(grads)
    for a, b in zip(scaled_model.trainable_params(), model.trainable_params()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    assert disabled.state_dict() == {} and disabled.get_scale() == 1.0 and not disabled.is_enable()


def _regression_grad_fn(scaler, net, optimizer):
    def forward(x, y):
        return scaler.scale(net(x, y))

    return ms.value_and_grad(forward, None, optimizer.parameters)


@pytest.mark.parametrize("compiled", [False, True], ids=["pynative", "jit"])
def test_scale_trajectory_and_skips_follow_the_paddle_rule(compiled):
    scaler = GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=2)
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.05)
    grad_fn = _regression_grad_fn(scaler, net, optimizer)

    def train_step(x, y):
        _, grads = grad_fn(x, y)
        return scaler.minimize(optimizer, grads)

    train_step = ms.jit(train_step) if compiled else train_step
    flags = [F, T, F, T, T, T, F, F, F]
    scales = []
    for batch, flag in zip(regression_batches(len(flags)), flags):
        x, y = batch
        x = x.copy()
        if flag:
            x[0, 0] = np.inf
        before = training_state(net)
        skipped = bool(np.asarray(train_step(Tensor(x), Tensor(y)).asnumpy()))
        assert skipped == flag
        assert all(np.array_equal(before[k], v) for k, v in training_state(net).items()) == flag
        scales.append(scaler.get_scale())
    assert scales == paddle_rule(flags, scale=2.0**10, incr_n=2)


def test_clipping_after_unscale_clips_the_true_gradients():
    batch = [Tensor(a) for a in regression_batches(1)[0]]
    net = regression_net()
    reference_opt = GradCapture(net.trainable_params())
    _, true_grads = ms.value_and_grad(net, None, reference_opt.parameters)(*batch)
    expected = ops.clip_by_global_norm(true_grads, 0.05)
    scaler = GradScaler(init_loss_scaling=2.0**12)
    net = regression_net()
    optimizer = GradCapture(net.trainable_params())
    _, grads = _regression_grad_fn(scaler, net, optimizer)(*batch)
    grads = ops.clip_by_global_norm(scaler.unscale_(grads), 0.05)
    scaler.step(optimizer, grads)   # does not unscale a second time
    scaler.update()
    for got, want in zip(optimizer.captured, expected):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-8)


def test_accumulation_over_four_micro_steps_equals_one_big_batch():
    micro = regression_batches(4, batch=4)
    big = [np.concatenate(parts) for parts in zip(*micro)]
    control = regression_net()
    control_opt = nn.Momentum(control.trainable_params(), 0.05, 0.9)
    _, grads = ms.value_and_grad(control, None, control_opt.parameters)(*[Tensor(a) for a in big])
    control_opt(grads)
    scaler = GradScaler(init_loss_scaling=2.0**12)
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    grad_fn = _regression_grad_fn(scaler, net, optimizer)
    total = None
    for batch in micro:           # scale every micro-loss; the scale is constant within the window
        _, grads = grad_fn(*[Tensor(a) for a in batch])
        total = grads if total is None else tuple(t + g for t, g in zip(total, grads))
    mean = tuple(t / 4 for t in total)
    scaler.step(optimizer, mean)  # step and update once per window
    scaler.update()
    for name, value in training_state(control).items():
        np.testing.assert_allclose(training_state(net)[name], value, rtol=2e-5, atol=1e-7, err_msg=name)


def test_several_optimizers_decide_independently_and_update_backs_off_once():
    scaler = GradScaler(init_loss_scaling=2.0**10, decr_every_n_nan_or_inf=1)
    nets = [regression_net(seed=0), regression_net(seed=1)]
    optimizers = [nn.SGD(n.trainable_params(), 0.05) for n in nets]
    grad_fns = [_regression_grad_fn(scaler, n, o) for n, o in zip(nets, optimizers)]
    x, y = regression_batches(1)[0]
    bad = x.copy()
    bad[0, 0] = np.inf
    before = [training_state(n) for n in nets]
    _, grads_a = grad_fns[0](Tensor(bad), Tensor(y))
    _, grads_b = grad_fns[1](Tensor(x), Tensor(y))
    grads_a = scaler.unscale_(grads_a, key=0)
    assert bool(scaler.step(optimizers[0], grads_a, key=0).asnumpy())
    assert not bool(scaler.step(optimizers[1], grads_b, key=1).asnumpy())
    scaler.update()
    assert all(np.array_equal(before[0][k], v) for k, v in training_state(nets[0]).items())
    assert not all(np.array_equal(before[1][k], v) for k, v in training_state(nets[1]).items())
    assert scaler.get_scale() == 512.0


def _usage_scaler():
    scaler = GradScaler()
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.05)
    _, grads = _regression_grad_fn(scaler, net, optimizer)(*[Tensor(a) for a in regression_batches(1)[0]])
    return scaler, optimizer, grads


def test_misuse_raises_with_what_to_do():
    scaler, optimizer, grads = _usage_scaler()
    unscaled = scaler.unscale_(grads)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) was already called.*once per iteration"):
        scaler.unscale_(grads)
    scaler.step(optimizer, unscaled)
    with pytest.raises(RuntimeError, match=r"step\(\) was already called.*update\(\) once per iteration"):
        scaler.step(optimizer, unscaled)
    scaler.update()
    scaler.step(optimizer, grads)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) after step\(\)"):
        scaler.unscale_(grads)
    scaler.update()
    scaler.minimize(optimizer, grads)  # a new iteration is fine


def test_misuse_inside_jit_is_reported_when_compiling():
    scaler, optimizer, grads = _usage_scaler()

    @ms.jit
    def twice(g):
        g = scaler.unscale_(g)
        return scaler.unscale_(g)

    with pytest.raises(RuntimeError, match=r"unscale_\(\) was already called"):
        twice(grads)
    scaler.minimize(optimizer, grads)  # nothing recorded while compiling leaks into eager use


@pytest.mark.parametrize("setter, value, pattern", [
    ("set_incr_ratio", 1.0, r"'incr_ratio'.*1.0"),
    ("set_decr_ratio", 1.5, r"'decr_ratio'.*1.5"),
    ("set_decr_ratio", 0.0, r"'decr_ratio'"),
    ("set_incr_every_n_steps", 0, r"'incr_every_n_steps'.*0"),
    ("set_decr_every_n_nan_or_inf", 0, r"'decr_every_n_nan_or_inf'.*0"),
    ("set_init_loss_scaling", -1.0, r"'init_loss_scaling'.*-1.0"),
])
def test_setters_validate(setter, value, pattern):
    scaler = GradScaler()
    before = scaler.state_dict()
    with pytest.raises((ValueError, TypeError), match=pattern):
        getattr(scaler, setter)(value)
    assert scaler.state_dict() == before


def test_getters_setters_and_state_dict_round_trip():
    scaler = GradScaler(init_loss_scaling=1024, incr_ratio=4.0, decr_ratio=0.25, incr_every_n_steps=3,
                        decr_every_n_nan_or_inf=1)
    assert (scaler.get_init_loss_scaling(), scaler.get_incr_ratio(), scaler.get_decr_ratio(),
            scaler.get_incr_every_n_steps(), scaler.get_decr_every_n_nan_or_inf()) == (1024.0, 4.0, 0.25, 3, 1)
    scaler.set_incr_ratio(3.0)
    scaler.set_decr_every_n_nan_or_inf(2)
    scaler.set_init_loss_scaling(512.0)
    assert (scaler.get_incr_ratio(), scaler.get_decr_every_n_nan_or_inf(), scaler.get_scale()) == (3.0, 2, 512.0)
    saved = scaler.state_dict()
    assert saved["scale"] == 512.0 and saved["decr_every_n_nan_or_inf"] == 2
    other = GradScaler()
    other.load_state_dict(saved)
    assert other.state_dict() == saved and float(other.get_loss_scaling().asnumpy()) == 512.0
    with pytest.raises(ValueError, match="empty"):
        other.load_state_dict({})


def test_pytorch_spelling_and_preset():
    scaler = GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=7)
    assert (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval()) == (256.0, 4.0, 0.25, 7)
    assert not GradScaler(enabled=False).is_enabled()
    with pytest.raises(ValueError, match="either 'init_loss_scaling'.*or 'init_scale'"):
        GradScaler(init_loss_scaling=8.0, init_scale=8.0)
    torch_like = GradScaler.from_preset("pytorch")
    assert torch_like.get_scale() == 65536.0 and torch_like.get_decr_every_n_nan_or_inf() == 1
    with pytest.raises(ValueError, match="either 'policy'"):
        GradScaler(init_loss_scaling=8.0, policy=get_preset("pytorch"))


def test_fixed_scale_still_skips_overflowing_steps():
    scaler = GradScaler(init_loss_scaling=64.0, use_dynamic_loss_scaling=False)
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.05)
    x, y = regression_batches(1)[0]
    x = x.copy()
    x[0, 0] = np.nan
    for _ in range(3):
        _, grads = _regression_grad_fn(scaler, net, optimizer)(Tensor(x), Tensor(y))
        assert bool(scaler.minimize(optimizer, grads).asnumpy())
    assert scaler.get_scale() == 64.0 and not scaler.is_use_dynamic_loss_scaling()


# ---- LossScaleOptimizer -------------------------------------------------------------------------------------

class Square(nn.Cell):
    def __init__(self):
        super().__init__()
        self.var = Parameter(Tensor(np.float32(1.0)), name="var")

    def construct(self):
        return self.var ** 2


def test_keras_seed_example():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))

    def forward():
        return opt.get_scaled_loss(model())

    scaled_loss, grads = ms.value_and_grad(forward, None, opt.parameters)()
    assert float(scaled_loss.asnumpy()) == 2.0**15
    grads = opt.get_unscaled_gradients(grads)
    assert not bool(opt(grads).asnumpy())
    assert float(model.var.asnumpy()) == 0.5
    assert opt.dynamic_counter == 1


def test_loss_scale_optimizer_skips_and_follows_the_keras_rule():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.1), initial_scale=64.0, dynamic_growth_steps=2)
    flags = [F, T, F, F, T, T, F]
    scales = []
    for flag in flags:
        grads = (Tensor(np.float32(np.inf if flag else 1.0)),)
        before = float(model.var.asnumpy())
        assert bool(opt.apply_gradients(grads).asnumpy()) == flag
        assert (float(model.var.asnumpy()) == before) == flag
        scales.append(float(opt.loss_scale.asnumpy()))
    assert scales == keras_rule(flags, 64.0, growth_steps=2)


def test_loss_scale_optimizer_delegates_hyperparameters():
    inner = nn.Adam(Square().trainable_params(), learning_rate=0.01, beta1=0.8)
    opt = LossScaleOptimizer(inner)
    assert opt.inner_optimizer is inner and float(opt.beta1.asnumpy()) == pytest.approx(0.8)
    opt.learning_rate = 0.5
    assert float(inner.learning_rate.asnumpy()) == 0.5 and float(opt.learning_rate.asnumpy()) == 0.5
    assert opt.parameters is inner.parameters


def test_loss_scale_optimizer_fixed_and_invalid_arguments():
    params = Square().trainable_params()
    fixed = LossScaleOptimizer(nn.SGD(params, 0.1), dynamic=False, initial_scale=128.0)
    assert (fixed.dynamic, fixed.dynamic_counter, fixed.dynamic_growth_steps, fixed.initial_scale) == (
        False, None, None, 128.0)
    fixed((Tensor(np.float32(np.inf)),))
    assert float(fixed.loss_scale.asnumpy()) == 128.0
    for kwargs, pattern in [
        (dict(dynamic=False), "'initial_scale' must be given"),
        (dict(dynamic=False, initial_scale=8.0, dynamic_growth_steps=10), "'dynamic_growth_steps' cannot"),
        (dict(dynamic="yes"), "'dynamic' must be a bool"),
        (dict(initial_scale=-1.0), "'initial_scale'"),
        (dict(dynamic_growth_steps=0), "'dynamic_growth_steps'"),
        (dict(dynamic_growth_steps=2.5), "'dynamic_growth_steps'"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            LossScaleOptimizer(nn.SGD(params, 0.1), **kwargs)
    with pytest.raises(ValueError, match="'inner_optimizer'"):
        LossScaleOptimizer("sgd")


def test_loss_scale_optimizer_inside_jit():
    model = Square()
    opt = LossScaleOptimizer(nn.SGD(model.trainable_params(), 0.25))

    def forward():
        return opt.get_scaled_loss(model())

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step():
        _, grads = grad_fn()
        return opt(opt.get_unscaled_gradients(grads))

    step()
    step()
    assert float(model.var.asnumpy()) == 0.25 and opt.dynamic_counter == 2
