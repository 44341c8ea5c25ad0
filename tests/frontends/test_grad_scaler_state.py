"""GradScaler state: state_dict round trips in each framework's keys, resuming from state_dict and checkpoint,
hysteresis across spellings, refused states that change nothing, pickling and names."""

import gc
import logging
import pickle

import mindspore as ms
import numpy as np
import pytest
from grad_scaler_harness import (
    F,
    T,
    basic_step,
    clipping_separate_unscale,
    pytorch_sgd_setup,
    read_outputs,
    same_training_state,
    sgd,
    tensor_batches,
)
from mindspore import Tensor, nn
from nets import keras_step, regression_batches, regression_net

from lossscale import GradScaler, LossScaleOptimizer, TorchGradScaler, get_preset


def test_pytorch_state_dict_round_trip():
    """PyTorch's test_grad_scaling_state_dict: s1 takes s0's state, also after s1 has been used (compiled)."""
    for used in (False, True):
        s0 = GradScaler("cuda", init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
        s1 = GradScaler("cuda", init_scale=6.0, growth_factor=7.0, backoff_factor=0.8, growth_interval=1)
        if used:
            net = regression_net()
            step = ms.jit(basic_step(s1, net, nn.SGD(net.trainable_params(), 0.05)))
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
    torch_step = ms.jit(clipping_separate_unscale(scaler, net, opt))
    keras_net = regression_net()
    keras_opt = LossScaleOptimizer(nn.SGD(keras_net.trainable_params(), 0.05))
    keras = ms.jit(keras_step(keras_net, keras_opt))
    x, y = tensor_batches(1)[0]
    ms_logger.addHandler(records)
    try:
        read_outputs(torch_step(x, y, Tensor(False)))
        read_outputs(keras(x, y))
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
        return net, opt, scaler, ms.jit(basic_step(scaler, net, opt))

    def train(parts, batches, first):
        _, _, scaler, step = parts
        scales = []
        for i, (x, y) in enumerate(batches, start=first):
            read_outputs(step(x, y, Tensor(i in poisoned)))
            scales.append(scaler.get_scale())
        return scales

    batches = tensor_batches(8)
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
    same_training_state((uninterrupted[0], uninterrupted[1]), (resumed[0], resumed[1]), rtol=0, atol=0)


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
    scaler, net, opt, grad_fn = pytorch_sgd_setup(init_scale=32.0, growth_interval=3)
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
    inner = sgd(regression_net().trainable_params())
    builds = [lambda: GradScaler(init_loss_scaling=8.0, name="taken"), lambda: LossScaleOptimizer(inner, name="taken")]
    for build in builds:
        with pytest.raises(ValueError, match=r"'name' 'taken' is already used by another TorchGradScaler"):
            build()
    assert float(LossScaleOptimizer(inner, initial_scale=4.0).loss_scale.asnumpy()) == 4.0
    del scaler
    gc.collect()
    assert GradScaler(init_loss_scaling=8.0, name="taken").get_scale() == 8.0
