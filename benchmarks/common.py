"""Shared pieces of the benchmarks: networks, inputs, timing with rotation, statistics."""

import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from lossscale.core.compat import prefer_fast_cpu_convolutions  # noqa: E402

# As the command line does; before any MindSpore operation (benchmarks/bench_cpu_kernels.py measures the difference).
prefer_fast_cpu_convolutions()

MODELS = {"mlp": 128, "lenet5": 32, "dense16": 128}  # model -> batch size
LEVELS = ("O0", "O2", "O3")


def make_network(model):
    """The benchmark networks: MLP 784-1024-1024-10 (6 parameter tensors), LeNet5 on 1x32x32 (10) and ``dense16``,
    16 Dense layers of width 64 (32 small tensors: the per-tensor cost)."""
    from lossscale_models import MLP, LeNet5

    if model == "dense16":
        return MLP(64, 64, 15)
    return MLP(784, 1024, 2) if model == "mlp" else LeNet5()


def make_inputs(model, seed=0):
    """A fixed random batch (float32 data, int32 labels) for ``model``."""
    from mindspore import Tensor

    rng = np.random.RandomState(seed)
    batch = MODELS[model]
    shape = {"mlp": (batch, 784), "lenet5": (batch, 1, 32, 32), "dense16": (batch, 64)}[model]
    return Tensor(rng.rand(*shape).astype(np.float32)), Tensor(rng.randint(0, 10, batch).astype(np.int32))


def synchronised(step, inputs):
    """Run one step and wait for its output (the loss) on the host; return seconds. A step that returns a Python
    number (PyTorch's ``loss.item()``) has already waited."""
    start = time.perf_counter()
    outputs = step(*inputs)
    loss = outputs[0] if isinstance(outputs, tuple) else outputs
    if hasattr(loss, "asnumpy"):
        loss.asnumpy()
    return time.perf_counter() - start


def first_call_seconds(step, inputs):
    """Compile + first step."""
    return synchronised(step, inputs)


def rotating_rounds(variants, inputs, rounds, steps, warmup):
    """Time every variant ``steps`` times per round, rotating the order each round (A B C, B C A, ...).

    Returns ``{name: [[seconds per step] per round]}``.
    """
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            synchronised(variants[name], inputs)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append([synchronised(variants[name], inputs) for _ in range(steps)])
    return times


def summarise(times, baselines):
    """Median and interquartile range per variant (ms), and paired ratios vs each baseline.

    A paired ratio is the median over rounds of (median of A in round r) / (median of B in round r).
    """
    summary = {}
    for name, per_round in times.items():
        flat = np.concatenate(per_round) * 1e3
        summary[name] = {
            "median_ms": float(np.median(flat)),
            "iqr_ms": float(np.subtract(*np.percentile(flat, [75, 25]))),
            "steps": int(flat.size),
        }
    ratios = {}
    for a, b in baselines:
        per_round = [np.median(ra) / np.median(rb) for ra, rb in zip(times[a], times[b])]
        ratios[f"{a}/{b}"] = float(np.median(per_round))
    return summary, ratios


def emit(payload):
    """Print the result as the last line of stdout (read by run.py)."""
    print("RESULT " + json.dumps(payload), flush=True)
