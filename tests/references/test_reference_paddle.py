"""lossscale's Paddle spelling against paddle.amp.GradScaler itself, run side by side (needs paddle).

Paddle's dygraph scaler turns itself off on CPU ("AmpScaler can only be enabled on CUDAPlace ...")
and outside float16 autocast, which are deliberate differences of lossscale (docs/migration.md). To
compare its rule, skips and errors here, :func:`paddle_scaler` builds it as on a GPU (the place check
answers "GPU" during construction) with float16 as Paddle's AMP dtype; everything else is Paddle's
own code on its CPU kernels. The same model, data and injected infs in both frameworks: the scale
after every update, which iterations are skipped, the weights, ``state_dict()``, a state moved from
Paddle to lossscale, and Paddle's errors. Skipped when paddle is not installed (CI installs it when
the package registry has it).
"""

import numpy as np
import pytest
from mindspore import Tensor, nn
from nets import MISUSES, GradScalerRun, misuse_our_scaler, misuse_their_scaler, reference_batches, reference_weight

from lossscale import GradScaler

paddle = pytest.importorskip("paddle")
pytestmark = [
    pytest.mark.reference,  # Paddle's own backoff message converts its (1,)-shaped scale with float()
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

INJECTED = {2, 5, 6, 7}  # iterations whose input holds an inf (6, 7: two in a row, Paddle's default backoff)
CLIP = 0.5
RULE = {"init_loss_scaling": 2.0**10, "incr_every_n_steps": 2, "decr_every_n_nan_or_inf": 2}


class _GpuPlace:
    """Paddle's expected place, answering that it is a GPU (only the scaler's constructor asks)."""

    def __init__(self, place):
        self._place = place

    def is_gpu_place(self):
        return True

    def __getattr__(self, name):
        return getattr(self._place, name)


class _Tracer:
    def __init__(self, tracer):
        self._tracer = tracer
        self._expected_place = _GpuPlace(tracer._expected_place)

    def __getattr__(self, name):
        return getattr(self._tracer, name)


def paddle_scaler(**kwargs):
    """``paddle.amp.GradScaler(**kwargs)`` as Paddle builds it on a GPU for float16 training."""
    from paddle.amp import grad_scaler as module
    from paddle.amp.auto_cast import amp_global_state

    amp_global_state().amp_dtype = "float16"
    tracer = module._dygraph_tracer
    module._dygraph_tracer = lambda: _Tracer(tracer())
    try:
        return paddle.amp.GradScaler(**kwargs)
    finally:
        module._dygraph_tracer = tracer


def _data(count):
    return reference_batches(count, INJECTED)


class PaddleRun:
    """paddle.amp.GradScaler on a bias-free Linear with MSE and SGD (CPU, float32 weights)."""

    def __init__(self, clip, minimize=False, **scaler_args):
        self.model = paddle.nn.Linear(4, 3, bias_attr=False)
        self.model.weight.set_value(reference_weight().T)  # Paddle's Linear weight is (in, out)
        grad_clip = paddle.nn.ClipGradByGlobalNorm(CLIP) if clip else None
        self.optimizer = paddle.optimizer.SGD(
            learning_rate=0.05, parameters=self.model.parameters(), grad_clip=grad_clip
        )
        self.scaler = paddle_scaler(**scaler_args)
        self.clip, self.minimize = clip, minimize

    def iteration(self, x, y):
        loss = paddle.nn.functional.mse_loss(self.model(paddle.to_tensor(x)), paddle.to_tensor(y))
        scaled = self.scaler.scale(loss)
        scaled.backward()
        if self.minimize:
            self.scaler.minimize(self.optimizer, scaled)
        else:
            if self.clip:
                self.scaler.unscale_(self.optimizer)  # the optimizer's grad_clip then clips unscaled gradients
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.clear_grad()

    def weight(self):
        return self.model.weight.numpy().T.copy()


def LossScaleRun(clip, minimize=False, **scaler_args):
    """lossscale.GradScaler (Paddle's spelling) on the same model, in one mindspore.jit step."""
    return GradScalerRun(GradScaler(**scaler_args), CLIP if clip else None, minimize)


def _counts(scaler):
    state = scaler.state_dict()
    return float(state["scale"][0]), state["incr_count"], state["decr_count"]


def _assert_same_state(ours, theirs):
    """The same ``state_dict()``: Paddle's keys, each value equal."""
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[key], value, err_msg=key)


@pytest.mark.parametrize(
    "clip, minimize", [(False, False), (True, False), (False, True)], ids=["step_update", "unscale_clip", "minimize"]
)
def test_same_scales_counts_skips_weights_and_state_as_paddle(clip, minimize):
    theirs, ours = PaddleRun(clip, minimize, **RULE), LossScaleRun(clip, minimize, **RULE)
    for i, (x, y) in enumerate(_data(12)):
        theirs.iteration(x, y)
        ours.checked_iteration(x, y, i)
        assert _counts(ours.scaler) == _counts(theirs.scaler), i
        np.testing.assert_allclose(ours.weight(), theirs.weight(), rtol=2e-5, atol=1e-6, err_msg=str(i))
    _assert_same_state(ours.scaler, theirs.scaler)


def test_fixed_scale_skips_as_paddle():
    rule = dict(RULE, use_dynamic_loss_scaling=False)
    theirs, ours = PaddleRun(False, **rule), LossScaleRun(False, **rule)
    for i, (x, y) in enumerate(_data(8)):
        theirs.iteration(x, y)
        assert ours.iteration(x, y) == (i in INJECTED)
        np.testing.assert_allclose(ours.weight(), theirs.weight(), rtol=2e-5, atol=1e-6, err_msg=str(i))
        assert ours.scaler.get_scale() == float(theirs.scaler.state_dict()["scale"][0]) == RULE["init_loss_scaling"]
    assert ours.scaler.state_dict()["use_dynamic_loss_scaling"] is False
    _assert_same_state(ours.scaler, theirs.scaler)


def test_paddle_state_continues_identically_in_lossscale():
    theirs, ours = PaddleRun(False, **RULE), LossScaleRun(False)  # ours starts from the defaults
    data = _data(12)
    for x, y in data[:8]:  # stops after one inf past the backoff at 6: decr_count 1 is carried over
        theirs.iteration(x, y)
    saved = theirs.scaler.state_dict()
    assert saved["decr_count"] == 1
    ours.scaler.load_state_dict(saved)
    loaded = paddle_scaler()
    loaded.load_state_dict(saved)
    assert ours.scaler.get_init_loss_scaling() == loaded.get_init_loss_scaling() == float(saved["scale"][0])  # both
    ours.net.weight.set_data(Tensor(theirs.weight()))
    for x, y in data[8:]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
        assert _counts(ours.scaler) == _counts(theirs.scaler)


def test_the_paddle_2_5_preset_is_the_installed_paddles_default():
    """Paddle 2.5 changed its defaults (2**16, 2000, 1); the registry's Paddle has them."""
    theirs, ours = paddle_scaler(), GradScaler.from_preset("paddle_2_5")
    for name in ("init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf"):
        assert getattr(ours, f"get_{name}")() == getattr(theirs, f"get_{name}")(), name
    assert ours.get_scale() == float(theirs.state_dict()["scale"][0]) == 2.0**16


def test_getters_and_setters_as_paddle():
    theirs, ours = paddle_scaler(**RULE), GradScaler(**RULE)
    for name, value in (
        ("init_loss_scaling", 512.0),
        ("incr_ratio", 3.0),
        ("decr_ratio", 0.25),
        ("incr_every_n_steps", 7),
        ("decr_every_n_nan_or_inf", 3),
    ):
        for scaler in (theirs, ours):
            getattr(scaler, f"set_{name}")(value)
        assert getattr(ours, f"get_{name}")() == getattr(theirs, f"get_{name}")() == value, name
    assert ours.get_scale() == float(theirs.state_dict()["scale"][0]) == 512.0
    assert ours.is_enable() == theirs.is_enable() is True
    assert ours.is_use_dynamic_loss_scaling() == theirs.is_use_dynamic_loss_scaling() is True


@pytest.mark.slow
def test_the_same_errors_as_paddle():
    model = paddle.nn.Linear(2, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    net = nn.Dense(2, 1)
    opt = nn.SGD(net.trainable_params(), 0.1)
    grads = (Tensor(np.ones((1, 2), np.float32)), Tensor(np.ones(1, np.float32)))

    for kind in MISUSES[:3]:  # Paddle's update() needs no step
        with pytest.raises(RuntimeError) as expected:
            scaler = paddle_scaler()
            scaler.scale(model(paddle.ones((1, 2))).sum()).backward()
            misuse_their_scaler(scaler, optimizer, kind)
        optimizer.clear_grad()
        with pytest.raises(RuntimeError) as got:
            misuse_our_scaler(GradScaler(), opt, grads, kind)
        assert str(got.value).startswith(str(expected.value).rstrip(".")), kind
    for bad in ({"incr_ratio": 1.0}, {"decr_ratio": 1.0}):
        with pytest.raises(AssertionError):
            paddle_scaler(**bad)
        with pytest.raises(AssertionError):
            GradScaler(**bad)
    for scaler in (GradScaler(), paddle_scaler()):
        with pytest.raises(RuntimeError, match="The input state dict is empty"):
            scaler.load_state_dict({})


def test_a_disabled_scaler_reports_as_paddle():
    theirs, ours = paddle_scaler(enable=False, **RULE), GradScaler(enable=False, **RULE)
    assert ours.state_dict() == theirs.state_dict() == {}
    assert ours.get_init_loss_scaling() == theirs.get_init_loss_scaling() == 1.0
    assert ours.is_enable() == theirs.is_enable() is False
    assert ours.is_use_dynamic_loss_scaling() == theirs.is_use_dynamic_loss_scaling() is False
    saved = paddle_scaler(**RULE).state_dict()
    theirs.load_state_dict(saved)
    ours.load_state_dict(saved)  # ignored by both
    assert ours.state_dict() == theirs.state_dict() == {}


# ---- deliberate differences, pinned (docs/migration.md) --------------------------------------------------

PADDLE_2_5_DEFAULTS = {"init_loss_scaling": 2.0**16, "incr_every_n_steps": 2000, "decr_every_n_nan_or_inf": 1}


def test_paddle_2_5_defaults_are_three_explicit_arguments():
    """Paddle 2.5 changed its defaults from the documented 2**15, 1000, 2 (lossscale's) to 2**16, 2000, 1."""
    theirs, ours = PaddleRun(False), LossScaleRun(False, **PADDLE_2_5_DEFAULTS)
    assert _counts(GradScaler()) == (2.0**15, 0, 0) and GradScaler().get_decr_every_n_nan_or_inf() == 2
    for i, (x, y) in enumerate(_data(9)):
        theirs.iteration(x, y)
        assert ours.iteration(x, y) == (i in INJECTED)
        assert _counts(ours.scaler) == _counts(theirs.scaler), i
    _assert_same_state(ours.scaler, theirs.scaler)


def test_update_without_a_step_counts_a_clean_iteration_where_paddle_repeats_the_last_decision():
    rule = dict(RULE, decr_every_n_nan_or_inf=3)
    theirs, ours = PaddleRun(False, **rule), LossScaleRun(False, **rule)
    x, y = _data(3)[2]  # holds an inf
    theirs.iteration(x, y)
    ours.iteration(x, y)
    assert _counts(ours.scaler) == _counts(theirs.scaler) == (1024.0, 0, 1)
    theirs.scaler.update()
    ours.scaler.update()
    assert _counts(theirs.scaler) == (1024.0, 0, 2)  # the overflow counted again
    assert _counts(ours.scaler) == (1024.0, 1, 0)  # nothing overflowed since the last update()


@pytest.mark.slow
def test_update_backs_off_if_any_optimizer_overflowed_where_paddle_looks_at_the_last_step():
    """Two optimizers, the first one's gradients hold an inf: both skip it alike, then Paddle's update() sees only
    the second (clean) step and counts a clean iteration; lossscale backs the overflow off (PyTorch's rule)."""
    rule = dict(RULE, decr_every_n_nan_or_inf=1)
    paddle_models = [paddle.nn.Linear(4, n, bias_attr=False) for n in (3, 2)]
    paddle_opts = [paddle.optimizer.SGD(learning_rate=0.05, parameters=m.parameters()) for m in paddle_models]
    theirs = paddle_scaler(**rule)
    x = np.ones((2, 4), np.float32)
    loss = sum(model(paddle.to_tensor(x)).mean() for model in paddle_models)
    theirs.scale(loss).backward()
    grad = paddle_models[0].weight.grad
    grad.set_value(np.where(np.arange(grad.size).reshape(grad.shape) == 0, np.inf, grad.numpy()).astype(np.float32))
    skipped_before = [m.weight.numpy().copy() for m in paddle_models]
    for opt in paddle_opts:
        theirs.step(opt)
    theirs.update()
    assert np.array_equal(paddle_models[0].weight.numpy(), skipped_before[0])  # Paddle skips the first ...
    assert not np.array_equal(paddle_models[1].weight.numpy(), skipped_before[1])  # ... and steps the second
    assert _counts(theirs) == (1024.0, 1, 0)  # a clean iteration

    ours = GradScaler(**rule)
    opts = [nn.SGD(nn.Dense(4, n, has_bias=False).trainable_params(), 0.05) for n in (3, 2)]
    grads = [(Tensor(np.full((3, 4), np.inf, np.float32)),), (Tensor(np.ones((2, 4), np.float32)),)]
    assert [bool(ours.step(opt, g).asnumpy()) for opt, g in zip(opts, grads)] == [True, False]
    ours.update()
    assert _counts(ours) == (512.0, 0, 0)  # backed off


@pytest.mark.parametrize(
    "setter, value, injected, theirs_after, ours_after",
    [
        # 3 clean iterations (incr_count 3), window lowered to 2: Paddle's count passes 2 and never matches it again
        (
            "set_incr_every_n_steps",
            2,
            set(),
            [(1024.0, 4, 0), (1024.0, 5, 0), (1024.0, 6, 0)],
            [(2048.0, 0, 0), (2048.0, 1, 0), (4096.0, 0, 0)],
        ),
        # 2 bad iterations (decr_count 2), backoff after 1 bad one: Paddle never backs off again
        (
            "set_decr_every_n_nan_or_inf",
            1,
            {0, 1, 2, 3, 4},
            [(1024.0, 0, 3), (1024.0, 0, 4), (1024.0, 0, 5)],
            [(512.0, 0, 0), (256.0, 0, 0), (128.0, 0, 0)],
        ),
    ],
)
def test_a_count_beyond_a_lowered_setting_is_clipped_where_paddle_never_acts_again(
    setter, value, injected, theirs_after, ours_after
):
    """Paddle compares its counts with ``==``: lowering the window (or the bad steps per backoff) below the current
    count stops growth (or backoff) for good. lossscale clips the count to the new setting."""
    rule = dict(RULE, incr_every_n_steps=4, decr_every_n_nan_or_inf=3)
    theirs, ours = PaddleRun(False, **rule), LossScaleRun(False, **rule)
    data = reference_batches(6, injected)
    before = 3 if not injected else 2
    for x, y in data[:before]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
    assert _counts(ours.scaler) == _counts(theirs.scaler)
    for scaler in (theirs.scaler, ours.scaler):
        getattr(scaler, setter)(value)
    observed_theirs, observed_ours = [], []
    for x, y in data[before : before + 3]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
        observed_theirs.append(_counts(theirs.scaler))
        observed_ours.append(_counts(ours.scaler))
    assert observed_theirs == theirs_after
    assert observed_ours == ours_after
