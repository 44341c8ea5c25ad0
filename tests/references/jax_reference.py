"""Run jmp's ``DynamicLossScale`` and Keras 3's ``LossScaleOptimizer`` (JAX backend) on cases read as JSON
from stdin; print JSON.

Run by tests/references/test_reference_jax.py with the interpreter named by LOSSSCALE_JAX_PYTHON: jmp needs JAX,
whose current releases need NumPy 2, and MindSpore needs NumPy < 2, so they cannot share a process. Only
the standard library, NumPy, JAX, jmp and Keras are imported here.

Input: ``{"jmp": [case, ...], "keras_training": [run, ...], "keras_flags": [flags case, ...]}``:

- a jmp case: ``{"init_scale", "period", "factor", "min_loss_scale", "steps": [{"loss": array, "grads":
  [array, ...]}, ...]}`` where an array is ``{"values": nested list, "dtype": str}``; per step jmp's
  ``scale(loss)``, ``unscale(grads)``, ``all_finite`` of the unscaled gradients, then ``adjust``;
- a Keras training run: ``{"weight": (out x in), "batches": [[x, y], ...], "lr", "kwargs"}``: a bias-free
  linear layer, MSE, SGD inside the LossScaleOptimizer; ``scale_loss``, ``jax.grad``, ``stateless_apply``;
- a Keras flags case: ``{"kwargs", "flags": [bool, ...]}``: ``stateless_apply`` of one gradient, inf where the flag is
  True, else 0.

Output: per step the values named above, the loss scale and the counter after it (and the weight).
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jmp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402


def _array(spec):
    return jnp.asarray(np.asarray(spec["values"], spec["dtype"]))


def _listed(array):
    return {"values": np.asarray(array).tolist(), "dtype": str(array.dtype)}


def run_jmp(case):
    loss_scale = jmp.DynamicLossScale(
        jnp.float32(case["init_scale"]),
        period=case["period"],
        factor=case["factor"],
        min_loss_scale=jnp.float32(case["min_loss_scale"]),
    )
    history = []
    for step in case["steps"]:
        scaled_loss = loss_scale.scale(_array(step["loss"]))
        unscaled = loss_scale.unscale([_array(grad) for grad in step["grads"]])
        finite = jmp.all_finite(unscaled)
        loss_scale = loss_scale.adjust(finite)
        history.append(
            {
                "scaled_loss": _listed(scaled_loss),
                "unscaled": [_listed(grad) for grad in unscaled],
                "finite": bool(finite),
                "loss_scale": float(loss_scale.loss_scale),
                "counter": int(loss_scale.counter),
            }
        )
    return history


def _keras_optimizer(kwargs, lr, variables):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(lr), **kwargs)
    optimizer.build(variables)
    return optimizer


def _keras_apply(optimizer, grads, variables):
    """``optimizer.apply(grads, variables)`` the way Keras 3 trains on JAX: ``stateless_apply``, then the new
    values assigned (the stateful ``apply`` of Keras' JAX backend leaks tracers outside ``jax.jit``)."""
    new_values, new_optimizer_values = optimizer.stateless_apply(
        [v.value for v in optimizer.variables], grads, [v.value for v in variables]
    )
    for variable, value in zip([*variables, *optimizer.variables], [*new_values, *new_optimizer_values]):
        variable.assign(value)


def _keras_state(optimizer):
    return {"loss_scale": float(optimizer.dynamic_scale.value), "counter": int(optimizer.step_counter.value)}


def run_keras_training(run):
    weight = keras.Variable(np.asarray(run["weight"], np.float32).T)  # Keras' kernel is (in, out)
    optimizer = _keras_optimizer(run["kwargs"], run["lr"], [weight])
    history = []
    for x, y in run["batches"]:
        x, y = jnp.asarray(np.asarray(x, np.float32)), jnp.asarray(np.asarray(y, np.float32))

        def scaled_loss(kernel, x=x, y=y):
            return optimizer.scale_loss(jnp.mean(jnp.square(x @ kernel - y)))

        _keras_apply(optimizer, [jax.grad(scaled_loss)(weight.value)], [weight])
        history.append(dict(_keras_state(optimizer), weight=np.asarray(weight.value).T.tolist()))
    return history


def run_keras_flags(case):
    variable = keras.Variable(np.zeros(1, np.float32))
    optimizer = _keras_optimizer(case["kwargs"], 0.0, [variable])
    history = []
    for non_finite in case["flags"]:
        _keras_apply(optimizer, [jnp.asarray([np.inf if non_finite else 0.0], jnp.float32)], [variable])
        history.append(_keras_state(optimizer))
    return history


def main():
    cases = json.load(sys.stdin)
    json.dump(
        {
            "versions": {"jax": jax.__version__, "jmp": getattr(jmp, "__version__", "?"), "keras": keras.__version__},
            "jmp": [run_jmp(case) for case in cases["jmp"]],
            "keras_training": [run_keras_training(run) for run in cases["keras_training"]],
            "keras_flags": [run_keras_flags(case) for case in cases["keras_flags"]],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
