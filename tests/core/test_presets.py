"""Presets against independent re-implementations of each original rule (written from each library's source),
and, where the library is installed (tests marked ``reference``), against the original itself: PyTorch's
``_amp_update_scale_``, DeepSpeed's ``DynamicLossScaler`` and Megatron-core's ``DynamicGradScaler``."""

import math

import numpy as np
import pytest
from nets import tiered

from conftest import UpdateCellDriver
from lossscale import AdaptiveLossScaleManager, DynamicLossScaleManager, DynamicLossScaleUpdateCell, get_preset
from lossscale.core.adaptive import AdaptiveWindowRule, run_adaptive
from lossscale.core.policy import FLOAT32_TINY, LossScalePolicy, run
from lossscale.core.presets import ADAPTIVE_PRESET_NAMES, DIFFERENCES, PRESET_NAMES

F32 = np.float32
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the originals grow to inf


# ---- the originals, written from each library's source (not from lossscale.core.policy) --------------------


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


def tf_keras_rule(flags, scale=2.0**15, growth_steps=2000):
    """tf.keras _DynamicLossScaleState.update: counter + 1 >= growth_steps grows (only to a finite
    scale); a non-finite step halves, floored at 1 (maximum(scale / 2, 1)), and resets the counter."""
    scale, counter, out = F32(scale), 0, []
    for non_finite in flags:
        if non_finite:
            scale, counter = max(F32(scale / F32(2.0)), F32(1.0)), 0
        elif counter + 1 >= growth_steps:
            grown = F32(scale * F32(2.0))
            scale, counter = (grown if np.isfinite(grown) else scale), 0
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


class DeepSpeedMinScaleError(Exception):
    """DeepSpeed's "Current loss scale already at minimum" exception, raised at overflow ``step`` after
    ``scales`` (the scale after each earlier step)."""

    def __init__(self, step, scales):
        super().__init__(step)
        self.step, self.scales = step, scales


def deepspeed_rule(flags, scale=2.0**16, window=1000, min_scale=1.0, delayed_shift=2, consecutive_hysteresis=False):
    """DeepSpeed 0.19 DynamicLossScaler.update_scale (raise_error_at_min_scale=True), with its fp16 config's
    defaults (initial_scale_power 16, loss_scale_window 1000, hysteresis 2, min_loss_scale 1). No preset has
    this rule: see test_deepspeed_is_megatron_but_grows_one_step_later."""
    cur_iter, last_overflow_iter, cur_hysteresis, out = 0, -1, delayed_shift, []
    for overflow in flags:
        if overflow:
            if delayed_shift == 1 or cur_hysteresis == 1:
                if scale == min_scale:
                    raise DeepSpeedMinScaleError(cur_iter, out)
                scale = max(scale / 2.0, min_scale)
            else:
                cur_hysteresis -= 1
            last_overflow_iter = cur_iter
        else:
            if consecutive_hysteresis:
                cur_hysteresis = delayed_shift
            stable_interval = (cur_iter - last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % window == 0:
                if not consecutive_hysteresis:
                    cur_hysteresis = delayed_shift
                scale *= 2.0
        cur_iter += 1
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


def _random_flags(seed, n=400, rate=0.15):
    """``n`` overflow flags, each True with probability ``rate``."""
    return [bool(v) for v in np.random.RandomState(seed).rand(n) < rate]


# (preset, overrides, the original rule with the same settings, overflow pattern)
PRESET_CASES = [
    ("pytorch", dict(growth_interval=3), lambda f: torch_rule(f, interval=3), [F, F, F, T, T, F, F, F, F, F, F]),
    ("pytorch", dict(), torch_rule, [T] * 170),  # reaches 0: no floor
    (
        "pytorch",
        dict(init_scale=2.0**127, growth_interval=1),
        lambda f: torch_rule(f, 2.0**127, interval=1),
        [F, F, T, F],
    ),
    ("paddle", dict(growth_interval=3), lambda f: paddle_rule(f, incr_n=3), [T, F, T, T, T, T, T, F, F, F, T]),
    ("paddle", dict(), paddle_rule, [T] * 330),  # no floor: 0
    (  # Paddle 2.5 and later: 2**16, 2000 clean steps, back off at every bad step
        "paddle_2_5",
        dict(growth_interval=3),
        lambda f: paddle_rule(f, 2.0**16, incr_n=3, decr_n=1),
        [T, F, T, T, F, F, F, F, F, T, F],
    ),
    ("paddle_2_5", dict(), lambda f: paddle_rule(f, 2.0**16, incr_n=2000, decr_n=1), [T] * 200),
    (
        "paddle_static",
        dict(growth_interval=2),
        lambda f: paddle_rule(f, incr_n=2, floor=1.0, guard=True),
        [T, T, F, F, T, T, T, T] + [T] * 40,
    ),
    (
        "paddle_static",
        dict(init_scale=2.0**127, growth_interval=1),
        lambda f: paddle_rule(f, 2.0**127, incr_n=1, floor=1.0, guard=True),
        [F, F, F],
    ),
    ("keras", dict(growth_interval=2), lambda f: keras_rule(f, growth_steps=2), [F, F, F, T, F, F, T, T, F]),
    ("keras", dict(), keras_rule, [T] * 180),
    ("tf_keras", dict(growth_interval=2), lambda f: tf_keras_rule(f, growth_steps=2), [F, F, F, T, F, F, T, T, F]),
    ("tf_keras", dict(), tf_keras_rule, [T] * 40),  # floor at 1
    ("tf_keras", dict(init_scale=2.0**127, growth_interval=1), lambda f: tf_keras_rule(f, 2.0**127, 1), [F, F, T]),
    ("jmp", dict(growth_interval=3), lambda f: jmp_rule(f, period=3), [F, F, F, T, T, F, F, F] + [T] * 20),
    ("jmp", dict(init_scale=2.0**127, growth_interval=1), lambda f: jmp_rule(f, 2.0**127, period=1), [F, F]),
    (
        "megatron",
        dict(growth_interval=3),
        lambda f: megatron_rule(f, interval=3),
        [T, F, T, T, T, F, F, F, T, F, T, T] + [T] * 40,
    ),
    ("mindspore", dict(growth_interval=3), lambda f: mindspore_rule(f, window=3), [F, F, F, T, T, F, F, F] + [T] * 30),
]


@pytest.mark.parametrize(
    "name, overrides, original, flags", PRESET_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(PRESET_CASES)]
)
def test_preset_equals_the_original_rule(name, overrides, original, flags):
    """Step for step, until the original's scale falls below the smallest normal float32: there the preset's
    is 0 (no subnormal scales, a deliberate difference of every preset without a floor) and stays 0."""
    ours, theirs = [s.scale for s in run(get_preset(name, **overrides), flags)], original(flags)
    cut = next((i for i, scale in enumerate(theirs) if 0 < scale < FLOAT32_TINY), len(theirs))
    assert ours[:cut] == theirs[:cut]
    assert all(scale == 0.0 for scale in ours[cut:])
    if cut < len(theirs):
        assert "subnormal" in DIFFERENCES[name]


@pytest.mark.parametrize(
    "name, original",
    [
        ("keras", lambda f: keras_rule(f, 2.0**127, growth_steps=1)),
        ("megatron", lambda f: megatron_rule(f, 2.0**127, interval=1)),
        ("paddle", lambda f: paddle_rule(f, 2.0**127, incr_n=1)),
        ("mindspore", lambda f: mindspore_rule(f, 2.0**127, window=1)),
    ],
)
def test_deliberate_difference_the_finiteness_guard(name, original):
    flags = [F, F]
    ours = [s.scale for s in run(get_preset(name, init_scale=2.0**127, growth_interval=1), flags)]
    assert math.isinf(original(flags)[-1]) and ours == [2.0**127, 2.0**127]
    assert "inf" in DIFFERENCES[name]


def test_known_facts_about_floors():
    from_2_16 = run(get_preset("pytorch"), [T] * 143)
    assert from_2_16[-2].scale == 2.0**-126 and from_2_16[-1].scale == 0.0  # no subnormal scales (see policy)
    assert run(get_preset("paddle_static"), [T] * 100)[-1].scale == 1.0
    assert run(get_preset("mindspore"), [T] * 100)[-1].scale == 1.0
    assert run(get_preset("jmp", min_scale=4.0), [T] * 100)[-1].scale == 4.0
    assert run(get_preset("keras"), [T] * 200)[-1].scale == 0.0


def test_paddle_counts_consecutive_bad_steps():
    policy = get_preset("paddle", init_scale=64.0)
    assert [s.scale for s in run(policy, [T, F, T, F, T, T, T, T])] == [64, 64, 64, 64, 64, 32, 32, 16]


@pytest.mark.parametrize(
    "name, overrides, backoff",
    [
        ("mindspore", dict(growth_factor=4.0), 0.25),  # MindSpore's backoff is 1/scale_factor: it follows the override
        ("mindspore", dict(growth_factor=4.0, backoff_factor=0.5), 0.5),  # unless the backoff is overridden too
        ("pytorch", dict(growth_factor=4.0), 0.5),  # PyTorch's backoff is its own argument
        ("megatron", dict(growth_factor=3.0), 0.5),
    ],
)
def test_growth_override_keeps_how_the_preset_defines_its_backoff(name, overrides, backoff):
    assert get_preset(name, **overrides).backoff_factor == backoff


def test_preset_errors():
    with pytest.raises(ValueError, match="'preset'.*'tensorflow'"):
        get_preset("tensorflow")
    with pytest.raises(TypeError, match="unknown LossScalePolicy field"):
        get_preset("pytorch", scale_window=10)
    with pytest.raises(TypeError, match=r"unknown AdaptiveWindowRule field\(s\) \['growth_interval'\]; allowed: \["):
        get_preset("mindformers", growth_interval=10)
    assert set(DIFFERENCES) == set(PRESET_NAMES)


def test_the_mindformers_preset_is_its_documented_adaptive_window():
    """MindFormers' feature guide configures AdaptiveLossScaleUpdateCell with 2**32, 2, 20, 1000 and 20."""
    assert ADAPTIVE_PRESET_NAMES == ("mindformers",)
    assert get_preset("mindformers") == AdaptiveWindowRule(2.0**32, 2, 20, max_scale_window=1000, min_scale_window=20)
    rule = get_preset("mindformers", scale_window=100, init_scale=8.0)
    flags = _random_flags(5, n=300, rate=0.05)
    manager = AdaptiveLossScaleManager.from_policy(rule)
    assert manager.rule == rule and rule.levels[rule.start_level()] == 100
    assert UpdateCellDriver(manager.get_update_cell()).run(flags) == [s.scale for s in run_adaptive(rule, flags)]


# The README's tier: MindSpore's (a floor of 1), Megatron's hysteresis and Paddle's consecutive hysteresis with
# refill; the slow tier every preset.
@pytest.mark.parametrize(
    "name",
    tiered(
        [name for name in PRESET_NAMES if isinstance(get_preset(name), LossScalePolicy)],
        {"mindspore", "megatron", "paddle_static"},
    ),
)
def test_graph_cells_and_managers_apply_presets(name):
    policy = get_preset(name, growth_interval=3, init_scale=2.0**20)
    flags = _random_flags(len(name), n=60, rate=0.3)
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
        torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3)
        theirs.append(float(scale))
    assert [s.scale for s in run(get_preset("pytorch", growth_interval=3), flags)] == theirs


# DeepSpeed DynamicLossScaler arguments (besides init_scale 2**16, min_scale 1) and overflow flags
DEEPSPEED_CASES = [
    (dict(window=1000, delayed_shift=2), [T, F, T, T, F, T, F, F, T, T, T] + [F] * 30 + [T, T]),
    (dict(window=3, delayed_shift=2), [F] * 7 + [T] + [F] * 7 + [T, F, T, T] + [F] * 9),
    (dict(window=3, delayed_shift=1), [F] * 4 + [T, T] + [F] * 8),
    (dict(window=2, delayed_shift=3, consecutive_hysteresis=True), [T, F, T, T, F, T, T, T] + [F] * 6),
    (dict(window=5, delayed_shift=2), _random_flags(0)),
    (dict(window=4, delayed_shift=3, consecutive_hysteresis=True), _random_flags(1, rate=0.3)),
    (dict(window=2, delayed_shift=1, min_scale=2.0**10), _random_flags(2, rate=0.5)),
]


def _deepspeed_live(config, flags):
    """DeepSpeed's own DynamicLossScaler on ``flags``: ``(scales, index of the overflow it raised at, or None)``.
    Its rank-0 logging needs an initialised process group; that module is given a single-rank stand-in."""
    pytest.importorskip("torch")
    loss_scaler = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    scaler = loss_scaler.DynamicLossScaler(
        init_scale=2.0**16,
        scale_window=config["window"],
        min_scale=config["min_scale"],
        delayed_shift=config["delayed_shift"],
        consecutive_hysteresis=config["consecutive_hysteresis"],
    )
    scales = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loss_scaler, "dist", type("SingleRank", (), {"get_rank": staticmethod(lambda: 0)}))
        for i, overflow in enumerate(flags):
            try:
                scaler.update_scale(overflow)
            except Exception as error:  # # DeepSpeed raises a bare Exception
                assert "already at minimum" in str(error)
                return scales, i
            scales.append(float(scaler.loss_scale))
    return scales, None


def _deepspeed_reimplemented(config, flags):
    """:func:`deepspeed_rule` in the form of :func:`_deepspeed_live`."""
    try:
        return deepspeed_rule(flags, **config), None
    except DeepSpeedMinScaleError as error:
        return error.scales, error.step


@pytest.mark.reference
@pytest.mark.parametrize(
    "config, flags",
    DEEPSPEED_CASES,
    ids=[
        "fp16_defaults",
        "window_3",
        "no_hysteresis",
        "consecutive_hysteresis",
        "random",
        "random_consecutive",
        "random_floor",
    ],
)
def test_deepspeed_rule_is_deepspeeds_own(config, flags):
    """The re-implementation above against DeepSpeed's DynamicLossScaler itself, where deepspeed is installed:
    the same scale after every step, and the same step where it raises at its floor."""
    config = {"min_scale": 1.0, "consecutive_hysteresis": False, **config}
    theirs = _deepspeed_live(config, flags)
    assert _deepspeed_reimplemented(config, flags) == theirs
    assert theirs[1] is None or config["min_scale"] > 1  # only the floor case reaches the floor


# Megatron-core DynamicGradScaler arguments (besides MEGATRON_DEFAULTS) and overflow flags
MEGATRON_DEFAULTS = {"min_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5}
MEGATRON_CASES = [
    (dict(initial_scale=2.0**32, growth_interval=1000, hysteresis=2), [T, F, T, T, F, T, F, F, T, T, T] + [F] * 20),
    (dict(initial_scale=2.0**16, growth_interval=3, hysteresis=2), [F] * 7 + [T] + [F] * 7 + [T, F, T, T] + [F] * 9),
    (dict(initial_scale=2.0**16, growth_interval=2, hysteresis=1, min_scale=2.0**10), [T] * 9 + [F] * 5 + [T] * 3),
    (dict(initial_scale=2.0**20, growth_interval=5, hysteresis=3), _random_flags(3, rate=0.3)),
    (
        dict(
            initial_scale=2.0**12,
            growth_interval=2,
            hysteresis=2,
            min_scale=1.0,
            growth_factor=4.0,
            backoff_factor=0.25,
        ),
        _random_flags(4, rate=0.45),
    ),
]


def _megatron_live(config, flags):
    """Megatron-core's own ``DynamicGradScaler(**config)`` on ``flags``: its scale after every update. It puts its
    tensors on 'cuda'; a torch function mode moves them to the CPU (the arithmetic is torch's float32 either way)."""
    torch = pytest.importorskip("torch")
    grad_scaler = pytest.importorskip("megatron.core.optimizer.grad_scaler")

    class CudaOnCpu(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    with CudaOnCpu():
        scaler = grad_scaler.DynamicGradScaler(**config)
        scales = []
        for overflow in flags:
            scaler.update(overflow)
            scales.append(float(scaler.scale))
    return scales


@pytest.mark.reference
@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron: "Transformer Engine and Apex are not installed"
@pytest.mark.parametrize(
    "config, flags", MEGATRON_CASES, ids=["defaults", "window_3", "floor", "random_hysteresis_3", "random_factors"]
)
def test_megatron_preset_is_megatrons_own(config, flags):
    """The ``megatron`` preset (and the re-implementation above) against Megatron-core's DynamicGradScaler itself,
    where megatron-core is installed: the same scale after every step."""
    config = {**MEGATRON_DEFAULTS, **config}
    theirs = _megatron_live(config, flags)
    preset = get_preset(
        "megatron", **{"init_scale" if name == "initial_scale" else name: value for name, value in config.items()}
    )
    assert [state.scale for state in run(preset, flags)] == theirs
    assert (
        megatron_rule(
            flags,
            config["initial_scale"],
            config["min_scale"],
            config["growth_factor"],
            config["backoff_factor"],
            config["growth_interval"],
            config["hysteresis"],
        )
        == theirs
    )


@pytest.mark.reference
@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron: "Transformer Engine and Apex are not installed"
def test_megatron_preset_has_megatrons_defaults():
    """Megatron-core builds its DynamicGradScaler from its OptimizerConfig (initial_loss_scale, min_loss_scale,
    loss_scale_window, hysteresis) with factors 2 and 0.5: the preset holds those defaults. (The comparison above
    passes every value to both sides, so a wrong default passed it.)"""
    config = pytest.importorskip("megatron.core.optimizer").OptimizerConfig()
    preset = get_preset("megatron")
    assert (preset.init_scale, preset.min_scale, preset.growth_interval, preset.hysteresis) == (
        config.initial_loss_scale,
        config.min_loss_scale,
        config.loss_scale_window,
        config.hysteresis,
    )
    assert (preset.growth_factor, preset.backoff_factor) == (2.0, 0.5)


def test_deepspeed_is_megatron_but_grows_one_step_later():
    """DeepSpeed users: ``get_preset("megatron", init_scale=2**16)`` is DeepSpeed's fp16 rule with its defaults
    (hysteresis 2 refilled by a growth, window 1000, floor 1) but for two things (docs/migration.md): DeepSpeed
    grows after ``window + 1`` clean steps following the start or an overflow, then every ``window``; and it
    raises at its floor where lossscale stays there (the train cell's ``overflow_policy="raise"`` does that)."""
    deepspeed_like = get_preset("megatron", init_scale=2.0**16)
    backoffs_only = [T, F, T, T, F, T, F, F, T, T, T] + [F] * 30 + [T, T]
    assert [s.scale for s in run(deepspeed_like, backoffs_only)] == deepspeed_rule(backoffs_only)
    window = 3
    clean_then_overflow = [F] * 7 + [T] + [F] * 7
    ours = [
        s.scale for s in run(get_preset("megatron", init_scale=2.0**16, growth_interval=window), clean_then_overflow)
    ]
    theirs = deepspeed_rule(clean_then_overflow, window=window)
    growths = [[i for i in range(1, len(scales)) if scales[i] == 2 * scales[i - 1]] for scales in (ours, theirs)]
    assert growths == [
        [2, 5, 10, 13],
        [3, 6, 11, 14],
    ]  # the overflow at 7 only spends hysteresis and restarts the count
    at_floor = run(get_preset("megatron", init_scale=2.0), [T] * 4)
    assert [s.scale for s in at_floor] == [2.0, 1.0, 1.0, 1.0]
    with pytest.raises(DeepSpeedMinScaleError):
        deepspeed_rule([T] * 4, scale=2.0)
