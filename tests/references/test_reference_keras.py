"""lossscale's LossScaleOptimizer against tf.keras' own (Keras 2), run side by side (needs TensorFlow <= 2.15).

TensorFlow 2.15, the last with Keras 2 inside, needs protobuf < 5 and MindSpore protobuf >= 7, so
tf.keras runs in its own interpreter: ``LOSSSCALE_KERAS_PYTHON`` names it (CI sets it when it can
install ``tensorflow-cpu==2.15.1``), and ``tests/references/keras_reference.py`` runs the cases there once per
session. The same model, data and injected infs in both: the loss scale, ``dynamic_counter``,
``iterations`` and the weights after every step; the construction errors. Skipped when the
variable is not set.
"""

import os

import numpy as np
import pytest
from mindspore import nn
from nets import LossScaleOptimizerRun, reference_batches, run_reference_script, training_case

from lossscale import LossScaleOptimizer

PYTHON = os.environ.get("LOSSSCALE_KERAS_PYTHON")
pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(not PYTHON, reason="LOSSSCALE_KERAS_PYTHON (a Python with tensorflow<=2.15) not set"),
]

INJECTED = {2, 5, 6}
LR = 0.05


def _data(count, injected=INJECTED):
    return reference_batches(count, injected)


RUNS = {
    "dynamic": ({"initial_scale": 2.0**10, "dynamic_growth_steps": 2}, _data(10)),
    "floor_at_one": ({"initial_scale": 2.0, "dynamic_growth_steps": 100}, _data(5, injected={0, 1, 2})),
    "fixed": ({"dynamic": False, "initial_scale": 8.0}, _data(4, injected={2})),
}
CONSTRUCTIONS = {
    "defaults": {},
    "fixed": {"dynamic": False, "initial_scale": 8.0},
    "fixed_without_scale": {"dynamic": False},
    "fixed_with_growth_steps": {"dynamic": False, "initial_scale": 8.0, "dynamic_growth_steps": 10},
    "dynamic_not_bool": {"dynamic": "yes"},
    "not_an_optimizer": {"inner": None},
    "wrapping_a_wrapper": {"inner": "wrapped"},
    "wrapping_one_optimizer_twice": {"inner": "wrapped_twice"},
    "unknown_keyword": {"momentum": 0.9},
}


@pytest.fixture(scope="module")
def keras():
    """tf.keras' results for RUNS and CONSTRUCTIONS (one subprocess)."""
    cases = {
        "training": [training_case(kwargs, batches, LR) for kwargs, batches in RUNS.values()],
        "constructions": CONSTRUCTIONS,
    }
    results = run_reference_script(PYTHON, "keras_reference.py", cases)
    version = tuple(int(part) for part in results["tensorflow"].split(".")[:2])
    assert version <= (2, 15), f"tf.keras must be Keras 2 (TensorFlow <= 2.15), got {results['tensorflow']}"
    return {"training": dict(zip(RUNS, results["training"])), "constructions": results["constructions"]}


@pytest.mark.parametrize("run", ["dynamic", "floor_at_one"])
def test_same_scales_counters_iterations_and_weights_as_tf_keras(keras, run):
    kwargs, batches = RUNS[run]
    ours = LossScaleOptimizerRun(LR, **kwargs)
    for i, ((x, y), theirs) in enumerate(zip(batches, keras["training"][run])):
        ours.checked_iteration(x, y, i)
        assert ours.observed() == {k: theirs[k] for k in ("loss_scale", "dynamic_counter", "iterations")}, i
        np.testing.assert_allclose(ours.weight(), theirs["weight"], rtol=2e-5, atol=1e-6, err_msg=str(i))


def test_a_fixed_scale_skips_where_tf_keras_applies_non_finite_gradients(keras):
    """A deliberate difference (docs/migration.md): tf.keras applies them, and the weights become non-finite."""
    kwargs, batches = RUNS["fixed"]
    ours = LossScaleOptimizerRun(LR, **kwargs)
    for i, ((x, y), theirs) in enumerate(zip(batches, keras["training"]["fixed"])):
        before = ours.weight()
        assert ours.iteration(x, y) == (i == 2)
        assert ours.observed() == {"loss_scale": 8.0, "dynamic_counter": None, "iterations": i + 1}
        assert theirs["loss_scale"] == 8.0 and theirs["iterations"] == i + 1
        if i < 2:
            np.testing.assert_allclose(ours.weight(), theirs["weight"], rtol=2e-5, atol=1e-6)
            continue
        assert not np.all(np.isfinite(theirs["weight"]))  # tf.keras applied the inf at 2 and stays non-finite
        assert np.all(np.isfinite(ours.weight()))
        assert np.array_equal(ours.weight(), before) == (i == 2)  # skipped at 2, stepped at 3


def _construct(kwargs):
    kwargs = dict(kwargs)
    inner = kwargs.pop("inner", "sgd")
    if inner in ("sgd", "wrapped", "wrapped_twice"):
        sgd = nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1)
        if inner == "wrapped_twice":
            LossScaleOptimizer(sgd)  # the first wrapper; the one built below is the second
        inner = LossScaleOptimizer(sgd) if inner == "wrapped" else sgd
    try:
        optimizer = LossScaleOptimizer(inner, **kwargs)
    except Exception as error:
        return error
    return {
        "type": None,
        "loss_scale": float(optimizer.loss_scale.asnumpy()),
        "dynamic": optimizer.dynamic,
        "dynamic_growth_steps": optimizer.dynamic_growth_steps if optimizer.dynamic else None,
    }


@pytest.mark.parametrize("label", sorted(CONSTRUCTIONS))
def test_constructions_give_tf_keras_values_and_error_types(keras, label):
    theirs, ours = keras["constructions"][label], _construct(CONSTRUCTIONS[label])
    if theirs["type"] is None:
        assert ours == theirs
        return
    assert isinstance(ours, Exception), f"tf.keras raised {theirs['type']}: {theirs['message']}"
    assert isinstance(ours, {"TypeError": TypeError, "ValueError": ValueError}[theirs["type"]]), theirs["message"]
    if label == "wrapping_one_optimizer_twice":
        assert str(ours).replace("'", '"').startswith(theirs["message"])
