"""The core against jmp's ``DynamicLossScale``, and the "keras" preset against Keras 3's ``LossScaleOptimizer``.

jmp (the model of :class:`lossscale.LossScaler`'s protocol) and Keras 3 run on JAX, whose current releases
need NumPy 2, while MindSpore needs NumPy < 2: they run in their own interpreter, named by
``LOSSSCALE_JAX_PYTHON`` (CI sets it when it can install ``jax``, ``jmp`` and ``keras``), and
``tests/references/jax_reference.py`` runs every case there once per session. Skipped when the variable is not set.

- jmp, step for step on the same losses and gradients (float32 and float16, with injected inf/nan): the
  scaled loss, the unscaled gradients, the finiteness decision, then the scale and counter after
  ``adjust``; :class:`lossscale.LossScaler` with the "jmp" preset, in one ``mindspore.jit`` step.
- Keras 3 (JAX backend), the same training as tests/references/test_reference_keras.py: the scale, the counter and the
  weights after every step of ``LossScaleOptimizer(policy=get_preset("keras"))``; and the preset's rule
  (the pure policy and the graph update cell) on flag sequences, with the deliberate differences pinned.
"""

import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from nets import LossScaleOptimizerRun, reference_batches, run_reference_script, training_case

from conftest import UpdateCellDriver
from lossscale import DynamicLossScaleUpdateCell, LossScaler, get_preset
from lossscale.core.policy import FLOAT32_TINY, run
from lossscale.core.presets import DIFFERENCES

PYTHON = os.environ.get("LOSSSCALE_JAX_PYTHON")
pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(not PYTHON, reason="LOSSSCALE_JAX_PYTHON (a Python with jax, jmp, keras) not set"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

T, F = True, False


def _jmp_steps(count, injected, seed, gradient_magnitude=1.0):
    """``count`` steps of a loss and two gradients (float32 (3, 4), float16 (5,)), the gradients of the steps in
    ``injected`` made non-finite (inf in the float32 one, or nan in the float16 one, alternately)."""
    rng = np.random.RandomState(seed)
    steps = []
    for i in range(count):
        loss = np.array(rng.rand() * 4, np.float16 if i % 2 else np.float32)
        grads = [
            (rng.randn(3, 4) * gradient_magnitude).astype(np.float32),
            np.clip(rng.randn(5) * gradient_magnitude, -6e4, 6e4).astype(np.float16),
        ]
        if i in injected:
            grads[i % 2].reshape(-1)[1] = np.inf if i % 2 == 0 else np.nan
        steps.append((loss, grads))
    return steps


def _flags(count, probability, seed):
    rng = np.random.RandomState(seed)
    return {i for i in range(count) if rng.rand() < probability}


# label: (jmp's arguments, steps)
JMP_CASES = {
    "period_3": (
        dict(init_scale=2.0**15, period=3, factor=2, min_loss_scale=1.0),
        _jmp_steps(40, _flags(40, 0.3, 0), seed=1),
    ),
    "floor_at_min_loss_scale": (
        dict(init_scale=64.0, period=1000, factor=2, min_loss_scale=4.0),
        _jmp_steps(8, set(range(8)), seed=2),
    ),
    "floor_at_one": (
        dict(init_scale=4.0, period=1000, factor=2, min_loss_scale=1.0),
        _jmp_steps(5, set(range(5)), seed=3),
    ),
    "growth_guard_at_2_127": (
        dict(init_scale=2.0**127, period=1, factor=2, min_loss_scale=1.0),
        _jmp_steps(3, set(), seed=4),
    ),
    "factor_4": (dict(init_scale=2.0**10, period=2, factor=4, min_loss_scale=1.0), _jmp_steps(16, {3, 4, 9}, seed=5)),
    # float16 gradients unscaled at 2**30, where 1/S is 0 in float16 (MindSpore's own cells unscale there).
    "float16_at_2_30": (
        dict(init_scale=2.0**30, period=1000, factor=2, min_loss_scale=1.0),
        _jmp_steps(3, {1}, seed=6, gradient_magnitude=3e4),
    ),
}

KERAS_RUNS = {
    "dynamic": ({"initial_scale": 2.0**10, "dynamic_growth_steps": 2}, reference_batches(10, {2, 5, 6})),
    "defaults": ({}, reference_batches(4, {1})),
}
KERAS_LR = 0.05
# label: (Keras' arguments, flags: True = non-finite gradients)
KERAS_FLAGS = {
    "growth_steps_2": ({"initial_scale": 2.0**15, "dynamic_growth_steps": 2}, [F, F, F, T, F, F, T, T, F, F, F]),
    "to_zero_without_floor": ({"initial_scale": 2.0**15, "dynamic_growth_steps": 2000}, [T] * 180),
    "growth_from_2_127": ({"initial_scale": 2.0**127, "dynamic_growth_steps": 1}, [F, F]),
}


def _spec(array):
    return {"values": array.tolist(), "dtype": str(array.dtype)}


def _value(spec):
    return np.asarray(spec["values"], spec["dtype"])


@pytest.fixture(scope="module")
def jax_results():
    """jmp's and Keras 3's results for every case (one subprocess)."""
    cases = {
        "jmp": [
            dict(args, steps=[{"loss": _spec(loss), "grads": [_spec(g) for g in grads]} for loss, grads in steps])
            for args, steps in JMP_CASES.values()
        ],
        "keras_training": [training_case(kwargs, batches, KERAS_LR) for kwargs, batches in KERAS_RUNS.values()],
        "keras_flags": [{"kwargs": kwargs, "flags": flags} for kwargs, flags in KERAS_FLAGS.values()],
    }
    results = run_reference_script(PYTHON, "jax_reference.py", cases)
    assert int(results["versions"]["keras"].split(".")[0]) >= 3, results["versions"]
    return {
        "jmp": dict(zip(JMP_CASES, results["jmp"])),
        "keras_training": dict(zip(KERAS_RUNS, results["keras_training"])),
        "keras_flags": dict(zip(KERAS_FLAGS, results["keras_flags"])),
    }


def _jmp_core(label, init_scale, period, factor, min_loss_scale):
    """lossscale's core with jmp's rule, and one compiled step: scale, unscale, check, adjust."""
    policy = get_preset(
        "jmp",
        init_scale=init_scale,
        growth_interval=period,
        growth_factor=float(factor),
        backoff_factor=1.0 / factor,
        min_scale=min_loss_scale,
    )
    core = LossScaler(policy, name=f"jmp_reference_{label}")

    @ms.jit
    def step(loss, grads):
        scaled = core.scale(loss)
        unscaled = core.unscale(grads)
        overflow = core.is_overflow(core.flag(None, unscaled))
        core.adjust(overflow=overflow)
        return scaled, unscaled, overflow

    return core, step


@pytest.mark.parametrize("label", sorted(JMP_CASES))
def test_core_equals_jmp_step_for_step(jax_results, label):
    """Bit for bit: jmp unscales in float32 and keeps float32 (JAX promotes float16 * float32); the core
    unscales in float32 and casts back to the gradient's dtype, so its gradients are jmp's in that dtype."""
    args, steps = JMP_CASES[label]
    core, step = _jmp_core(label, **args)
    for i, ((loss, grads), theirs) in enumerate(zip(steps, jax_results["jmp"][label])):
        scaled, unscaled, overflow = step(Tensor(loss), tuple(Tensor(g) for g in grads))
        their_loss = _value(theirs["scaled_loss"])
        assert scaled.asnumpy().dtype == their_loss.dtype and scaled.asnumpy() == their_loss, i
        for ours, their_grad, given in zip(unscaled, theirs["unscaled"], grads):
            assert ours.asnumpy().dtype == given.dtype
            np.testing.assert_array_equal(ours.asnumpy(), _value(their_grad).astype(given.dtype), err_msg=str(i))
        assert bool(overflow.asnumpy()) == (not theirs["finite"]), i
        state = core.state_dict()
        assert (state["loss_scale"], state["good_steps"]) == (theirs["loss_scale"], theirs["counter"]), i


def test_jmp_cases_reach_what_they_are_named_for(jax_results):
    """The cases exercise the rule's corners: growth, backoff, both floors, the growth guard, float16 at 2**30."""
    scales = {label: [step["loss_scale"] for step in history] for label, history in jax_results["jmp"].items()}
    changes = [b / a for a, b in zip(scales["period_3"], scales["period_3"][1:]) if a != b]
    assert 2.0 in changes and 0.5 in changes
    assert scales["floor_at_min_loss_scale"][-3:] == [4.0] * 3 and scales["floor_at_one"][-2:] == [1.0] * 2
    assert scales["growth_guard_at_2_127"] == [2.0**127] * 3
    assert len(set(scales["factor_4"])) > 2
    nonzero = [
        np.count_nonzero(_value(step["unscaled"][1]).astype(np.float16))
        for step in jax_results["jmp"]["float16_at_2_30"]
    ]
    assert nonzero[0] == 5 and scales["float16_at_2_30"][1] == 2.0**29


def _keras_policy(kwargs):
    """The "keras" preset with the Keras 3 ``LossScaleOptimizer`` arguments ``kwargs`` (Keras' defaults otherwise)."""
    return get_preset(
        "keras",
        init_scale=kwargs.get("initial_scale", 2.0**15),
        growth_interval=kwargs.get("dynamic_growth_steps", 2000),
    )


@pytest.mark.parametrize("label", sorted(KERAS_RUNS))
def test_keras_preset_trains_like_keras_3(jax_results, label):
    """The same scales, counters and weights after every step; the weights untouched on the skipped ones."""
    kwargs, batches = KERAS_RUNS[label]
    ours = LossScaleOptimizerRun(KERAS_LR, policy=_keras_policy(kwargs))
    for i, ((x, y), theirs) in enumerate(zip(batches, jax_results["keras_training"][label])):
        ours.checked_iteration(x, y, i)
        observed = ours.observed()
        assert (observed["loss_scale"], observed["dynamic_counter"]) == (theirs["loss_scale"], theirs["counter"]), i
        np.testing.assert_allclose(ours.weight(), theirs["weight"], rtol=2e-5, atol=1e-6, err_msg=str(i))


@pytest.fixture(scope="module")
def keras_flag_runs():
    """Per flags case: (the pure policy's scales, the graph update cell's scales)."""
    runs = {}
    for label, (kwargs, flags) in KERAS_FLAGS.items():
        policy = _keras_policy(kwargs)
        cell = UpdateCellDriver(DynamicLossScaleUpdateCell.from_policy(policy))
        runs[label] = ([state.scale for state in run(policy, flags)], cell.run(flags))
    return runs


@pytest.mark.parametrize("label", ["growth_steps_2", "to_zero_without_floor"])
def test_keras_preset_rule_equals_keras_3(jax_results, keras_flag_runs, label):
    """Step for step, the pure policy and the update cell, down to 0 without a floor: JAX flushes subnormal
    results to zero on CPU, so Keras 3 on JAX, like lossscale, goes from 2**-126 to 0 (on its other backends
    it goes through subnormal scales: the difference lossscale.core.presets.DIFFERENCES names)."""
    theirs = [step["loss_scale"] for step in jax_results["keras_flags"][label]]
    for ours in keras_flag_runs[label]:
        assert ours == theirs
    if label == "to_zero_without_floor":
        assert theirs[-1] == 0.0 and theirs[theirs.index(0.0) - 1] == FLOAT32_TINY


def test_keras_3_grows_to_inf_where_the_preset_keeps_a_finite_scale(jax_results, keras_flag_runs):
    """The deliberate difference of every preset (lossscale.core.presets.DIFFERENCES): Keras 3 doubles 2**127."""
    theirs = [step["loss_scale"] for step in jax_results["keras_flags"]["growth_from_2_127"]]
    assert theirs == [float("inf")] * 2
    for ours in keras_flag_runs["growth_from_2_127"]:
        assert ours == [2.0**127] * 2
    assert "inf" in DIFFERENCES["keras"]
