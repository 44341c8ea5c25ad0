"""MindFormers' adaptive window rule in the front-ends: both GradScaler spellings and the LossScaleOptimizer follow
the pure rule (:func:`lossscale.core.adaptive.run_adaptive`, itself held to MindFormers' transcribed source in
tests/core/test_adaptive.py) step for step, skip what overflowed, keep the window state in their state dicts and
resume from them exactly; what cannot hold the rule is refused, nothing changed."""

import pickle

import mindspore as ms
import numpy as np
import pytest
from grad_scaler_harness import MinimizeRun
from mindspore import Tensor, nn
from nets import changed_since, jit_if, training_state

from lossscale import LossScaleOptimizer, get_preset
from lossscale.core.adaptive import run_adaptive
from lossscale.paddle import GradScaler as PaddleGradScaler
from lossscale.torch import GradScaler as TorchGradScaler

T, F = True, False
SLOW = pytest.mark.slow
# Levels (2, 3, 4, 5, 6, 7, 8): small windows, so a short schedule moves the window up, down to the hidden level
# (a window of 1) and back up.
RULE = dict(init_scale=2.0**10, scale_window=2, min_scale_window=2, max_scale_window=8)
FLAGS = [F] * 6 + [T] * 3 + [F] * 5 + [T, F, F, T] + [F] * 4
SPELLINGS = {"torch": TorchGradScaler, "paddle": PaddleGradScaler}


def _rule(**overrides):
    return get_preset("mindformers", **dict(RULE, **overrides))


def _scaler(spelling, **overrides):
    return SPELLINGS[spelling].from_preset("mindformers", **dict(RULE, **overrides))


def _at(scaler, state):
    """Put ``scaler`` in ``state`` (an AdaptiveState), as its steps would (host writes of its Parameters)."""
    scaler._core.update_cell.set_state(state)


@pytest.mark.parametrize(
    "spelling, compiled",
    [
        ("torch", True),
        ("paddle", False),
        pytest.param("torch", False, marks=SLOW),
        pytest.param("paddle", True, marks=SLOW),
    ],
    ids=["torch-jit", "paddle-eager", "torch-eager", "paddle-jit"],
)
def test_grad_scaler_follows_the_rule_step_for_step(spelling, compiled):
    scaler = _scaler(spelling)
    expected = run_adaptive(_rule(), FLAGS)
    assert MinimizeRun(scaler, compiled).run(FLAGS) == [state.scale for state in expected]
    assert scaler.get_state() == expected[-1]
    window = scaler.get_incr_every_n_steps() if spelling == "paddle" else scaler.get_growth_interval()
    assert (window, scaler.get_backoff_factor(), scaler.get_decr_every_n_nan_or_inf()) == (expected[-1].window, 0.5, 1)


@pytest.mark.filterwarnings("ignore:LossScaleOptimizer applied gradients without")  # given as computed
def test_compiled_reads_follow_the_window_and_the_counter():
    """Inside mindspore.jit the window getter and LossScaleOptimizer's ``dynamic_counter`` are graph reads: a
    function compiled once sees the window and the count move (eagerly they are Python ints)."""
    scaler = _scaler("torch")
    _, opt = _wrapped(_rule())

    def values(one):
        return one * scaler.get_growth_interval(), one * opt.dynamic_growth_steps, one * opt.dynamic_counter

    compiled = ms.jit(values)
    expected = run_adaptive(_rule(), FLAGS[:10])  # up a level, then down to the hidden level: windows 3, then 1
    for flag, state in zip(FLAGS[:10], expected):
        _at(scaler, state)  # the GradScaler's steps are tested above; its Parameters moved here directly
        opt(_gradients(opt.inner_optimizer.parameters, flag))
        reads = [int(value.asnumpy()) for value in compiled(Tensor(1, ms.int32))]
        assert reads == [state.window, state.window, state.good_steps]
    assert (scaler.get_growth_interval(), opt.dynamic_counter) == (1, expected[-1].good_steps)


def test_state_dicts_hold_the_window_state_in_each_format():
    rule = _rule()
    state = run_adaptive(rule, FLAGS[:10])[-1]  # three back-offs to the hidden level, then a growth there
    torch_scaler, paddle_scaler = _scaler("torch"), _scaler("paddle")
    for scaler in (torch_scaler, paddle_scaler):
        _at(scaler, state)
    window_keys = dict(max_scale_window=8, min_scale_window=2, list_index=-1, window_up_count=1, window_down_count=0)
    assert torch_scaler.state_dict() == dict(
        scale=state.scale, growth_factor=2.0, backoff_factor=0.5, growth_interval=1, _growth_tracker=0, **window_keys
    )
    saved = paddle_scaler.state_dict()
    assert saved.pop("scale").tolist() == [state.scale]
    assert saved == dict(
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=1,
        decr_every_n_nan_or_inf=1,
        incr_count=0,
        decr_count=0,
        use_dynamic_loss_scaling=True,
        **window_keys,
    )


@pytest.mark.parametrize(
    "saver, loader",
    [("torch", "torch"), pytest.param("paddle", "paddle", marks=SLOW), pytest.param("torch", "paddle", marks=SLOW)],
)
def test_a_resumed_scaler_continues_step_for_step(saver, loader):
    first = MinimizeRun(_scaler(saver), compiled=False)
    first.run(FLAGS[:10])
    resumed = _scaler(loader)
    resumed.load_state_dict(first.scaler.state_dict())
    assert resumed.get_scale() == first.scaler.get_scale()
    rest = FLAGS[10:]
    assert MinimizeRun(resumed, compiled=False).run(rest, seed=2) == first.run(rest, seed=2)
    assert [s.scale for s in run_adaptive(_rule(), FLAGS)][-1] == resumed.get_scale()


@pytest.mark.slow
def test_a_pickled_scaler_keeps_its_rule_and_state():
    scaler = _scaler("paddle")
    MinimizeRun(scaler, compiled=False).run(FLAGS[:9])
    restored = pickle.loads(pickle.dumps(scaler))
    assert restored.state_dict().keys() == scaler.state_dict().keys()
    assert restored.get_scale() == scaler.get_scale() and restored._rule == scaler._rule


@SLOW  # about 6 s; test_a_resumed_scaler_continues_step_for_step resumes a window state in the README's tier
def test_a_zero_window_level_saves_pickles_and_resumes():
    """MindFormers' levels for a max_scale_window between 101 and 199 start with a window of 0, which grows at every
    step as a window of 1: state_dict() and pickling work there, and a resumed scaler continues step for step."""
    zero = dict(scale_window=0, min_scale_window=20, max_scale_window=150)
    assert _rule(**zero).levels == (0, 150)
    first = MinimizeRun(_scaler("torch", **zero), compiled=False)
    done, rest = [F, T, F], [F, F, T, F]
    first.run(done)
    saved = first.scaler.state_dict()
    assert (saved["growth_interval"], saved["_growth_tracker"], saved["list_index"]) == (1, 0, 0)
    restored = pickle.loads(pickle.dumps(first.scaler))
    resumed = _scaler("paddle", **zero)
    resumed.load_state_dict(saved)
    expected = [state.scale for state in run_adaptive(_rule(**zero), done + rest)][len(done) :]
    assert MinimizeRun(resumed, compiled=False).run(rest, seed=2) == first.run(rest, seed=2) == expected
    assert MinimizeRun(restored, compiled=False).run(rest, seed=2) == expected


REFUSED_STATES = {  # what is loaded, from the scaler's own state dict: error
    "growth_factor": (lambda saved: dict(saved, growth_factor=4.0), r"'state_dict\['growth_factor'\]' is 4.0, .* 2.0"),
    "bounds": (lambda saved: dict(saved, max_scale_window=16), r"'state_dict\['max_scale_window'\]' is 16"),
    "level": (lambda saved: dict(saved, list_index=7), r"'state_dict\['list_index'\]' must be .*\[-1, 6\]"),
    "window": (
        lambda saved: dict(saved, growth_interval=3),
        r"'state_dict\['growth_interval'\]' must be the window of level 0 .*2, but got 3",
    ),
    "tracker": (lambda saved: dict(saved, _growth_tracker=2), r"'state_dict\['_growth_tracker'\]' must be .*\[0, 1\]"),
    "downs": (lambda saved: dict(saved, window_down_count=4), r"'state_dict\['window_down_count'\]'"),
    "scale": (lambda saved: dict(saved, scale=0.5), r"'state_dict\['scale'\]' must be a finite number in \[1.0, "),
    "fixed_window": (lambda saved: TorchGradScaler().state_dict(), r"fixed-window state \(no \['max_scale_window'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_STATES))
def test_a_state_of_another_rule_is_refused_and_nothing_changes(case):
    loaded, error = REFUSED_STATES[case]
    scaler = _scaler("torch")
    _at(scaler, run_adaptive(_rule(), FLAGS[:3])[-1])
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=error):
        scaler.load_state_dict(loaded(before))
    assert scaler.state_dict() == before


def test_a_window_state_is_refused_by_a_fixed_window_scaler():
    scaler = TorchGradScaler()
    pattern = r"holds \['list_index', .*which this scaler's rule \(LossScalePolicy\) does not"
    with pytest.raises(ValueError, match=pattern):
        scaler.load_state_dict(_scaler("torch").state_dict())
    assert scaler.state_dict() == TorchGradScaler().state_dict()


def test_setters_change_the_initial_scale_only():
    scaler = _scaler("paddle")
    _at(scaler, run_adaptive(_rule(), FLAGS[:5])[-1])
    counters = scaler.get_state()
    scaler.set_init_loss_scaling(64.0)
    assert scaler.get_state() == type(counters)(**dict(vars(counters), scale=64.0))
    assert scaler.get_init_loss_scaling() == 64.0
    for setter, value, name in [
        ("set_incr_ratio", 4.0, "incr_ratio"),
        ("set_growth_interval", 10, "incr_every_n_steps"),  # in this scaler's (Paddle's) spelling
        ("set_decr_every_n_nan_or_inf", 2, "decr_every_n_nan_or_inf"),
    ]:
        with pytest.raises(ValueError, match=f"'{name}' cannot change in AdaptiveWindowRule"):
            getattr(scaler, setter)(value)
    with pytest.raises(ValueError, match="'init_loss_scaling' must be"):
        scaler.set_init_loss_scaling(0.5)
    assert scaler.get_state().scale == 64.0


def test_a_fixed_adaptive_scaler_holds_its_scale_and_window():
    """Any rule can be held fixed (Paddle's use_dynamic_loss_scaling=False): overflows are still skipped, and neither
    the scale nor the window state moves; the state dict says so and loads back."""
    scaler = PaddleGradScaler(policy=_rule(), use_dynamic_loss_scaling=False)
    assert not scaler.is_use_dynamic_loss_scaling()
    assert MinimizeRun(scaler, compiled=False).run(FLAGS[:8]) == [_rule().init_scale] * 8
    assert scaler.get_state() == _rule().initial_state()
    saved = scaler.state_dict()
    assert saved["use_dynamic_loss_scaling"] is False
    restored = PaddleGradScaler(policy=_rule())
    restored.load_state_dict(saved)
    assert not restored.is_use_dynamic_loss_scaling() and restored.state_dict().keys() == saved.keys()


def _gradients(parameters, flag):
    return tuple(Tensor(np.full(p.shape, np.inf if flag else 0.01, np.float32)) for p in parameters)


def _wrapped(rule):
    net = nn.Dense(3, 2)
    return net, LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), policy=rule)


@pytest.mark.filterwarnings("ignore:LossScaleOptimizer applied gradients without")  # given as computed
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=SLOW)], ids=["eager", "jit"])
def test_loss_scale_optimizer_follows_the_rule_and_resumes(compiled):
    rule = _rule()
    net, opt = _wrapped(rule)

    def apply(grads):
        return opt(grads)

    apply = jit_if(compiled, apply)
    expected = run_adaptive(rule, FLAGS)
    for flag, state in zip(FLAGS[:10], expected):
        before = training_state(net)
        assert bool(apply(_gradients(net.trainable_params(), flag)).asnumpy()) == flag
        assert (changed_since(before, net) == []) == flag
        assert float(opt.loss_scale.asnumpy()) == state.scale
    resumed_net, resumed = _wrapped(rule)
    resumed.load_state_dict(opt.state_dict())
    for flag in FLAGS[10:]:
        opt(_gradients(net.trainable_params(), flag))
        resumed(_gradients(resumed_net.trainable_params(), flag))
    assert (
        opt.state_dict()
        == resumed.state_dict()
        == dict(
            loss_scale=expected[-1].scale,
            scale_window=expected[-1].window,
            list_index=expected[-1].level,
            window_up_count=expected[-1].ups,
            window_down_count=expected[-1].downs,
            cur_iter=len(FLAGS) + 1,
            last_overflow_iter=expected[-1].last_step,
        )
    )
    assert (opt.dynamic_growth_steps, opt.dynamic_counter) == (expected[-1].window, expected[-1].good_steps)


def test_loss_scale_optimizer_refuses_a_foreign_window_state():
    _, opt = _wrapped(_rule())
    cell = opt._core.update_cell
    cell.counters[1].set_data(Tensor(np.int32(3)))  # list_index, as a checkpoint of a wrapper with other bounds
    with pytest.raises(
        ValueError, match=r"'\S+\.scale_window' must be the window of level 3, 5, .*dynamic_growth_steps=2"
    ):
        opt.check_state()
    before = opt.state_dict()
    with pytest.raises(ValueError, match=r"'state_dict\['list_index'\]' must be"):
        opt.load_state_dict(dict(before, list_index=9))
    assert opt.state_dict() == before


@pytest.mark.parametrize(
    "arguments, saved",
    [
        (dict(), dict(loss_scale=2.0**15, good_steps=0, hysteresis_left=1)),
        (dict(dynamic=False, initial_scale=8.0), dict(loss_scale=8.0)),
    ],
    ids=["dynamic", "fixed"],
)
def test_loss_scale_optimizer_state_dict_of_the_other_rules(arguments, saved):
    net = nn.Dense(3, 2)
    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), **arguments)
    assert opt.state_dict() == saved
    opt.load_state_dict(saved)
    with pytest.raises(ValueError, match="loss_scale"):
        opt.load_state_dict(dict(saved, loss_scale=4.0 if "good_steps" not in saved else -1.0))
    assert opt.state_dict() == saved
