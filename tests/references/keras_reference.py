"""Run tf.keras' LossScaleOptimizer (Keras 2, TensorFlow <= 2.15) on cases read as JSON from stdin; print JSON.

Run by tests/references/test_reference_keras.py with the interpreter named by LOSSSCALE_KERAS_PYTHON: TensorFlow
2.15 needs protobuf < 5 and MindSpore 2.10 protobuf >= 7, so they cannot share a process. Only the
standard library, NumPy and TensorFlow are imported here.

Input: ``{"training": [run, ...], "constructions": {label: kwargs, ...}}``, where a run is
``{"weight": [[...]] (out x in), "batches": [[x, y], ...], "lr": float, "kwargs": {...}}``.
Output: per run, after every iteration, the loss scale, ``dynamic_counter``, ``iterations`` and the
weight (out x in); per construction, the exception's type and message (or None).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

LossScaleOptimizer = tf.keras.mixed_precision.LossScaleOptimizer


def train(run):
    weight = tf.Variable(np.asarray(run["weight"], np.float32).T)  # Keras' kernel is (in, out)
    optimizer = LossScaleOptimizer(tf.keras.optimizers.SGD(run["lr"]), **run["kwargs"])
    history = []
    for x, y in run["batches"]:
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, weight) - y))
            scaled_loss = optimizer.get_scaled_loss(loss)
        (grad,) = optimizer.get_unscaled_gradients(tape.gradient(scaled_loss, [weight]))
        optimizer.apply_gradients([(grad, weight)])
        history.append(
            {
                "loss_scale": float(optimizer.loss_scale.numpy()),
                "dynamic_counter": int(optimizer.dynamic_counter.numpy()) if optimizer.dynamic else None,
                "iterations": int(optimizer.iterations.numpy()),
                "weight": weight.numpy().T.tolist(),
            }
        )
    return history


def construct(kwargs):
    inner = kwargs.pop("inner", "sgd")
    if inner == "sgd":
        inner = tf.keras.optimizers.SGD(0.1)
    elif inner == "wrapped":
        inner = LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
    elif inner == "wrapped_twice":
        inner = tf.keras.optimizers.SGD(0.1)
        LossScaleOptimizer(inner)
    try:
        optimizer = LossScaleOptimizer(inner, **kwargs)
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {
        "type": None,
        "loss_scale": float(optimizer.loss_scale.numpy()),
        "dynamic": optimizer.dynamic,
        "dynamic_growth_steps": optimizer.dynamic_growth_steps if optimizer.dynamic else None,
    }


def main():
    cases = json.load(sys.stdin)
    json.dump(
        {
            "tensorflow": tf.__version__,
            "training": [train(run) for run in cases["training"]],
            "constructions": {label: construct(dict(kwargs)) for label, kwargs in cases["constructions"].items()},
        },
        sys.stdout,
        allow_nan=True,
    )


if __name__ == "__main__":
    main()
