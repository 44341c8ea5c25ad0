"""Worker for the 2-rank data-parallel test, launched by msrun (not collected by pytest).

    msrun --worker_num=2 ... dp_worker.py OUT_DIR

Each rank trains the test regression net on its half of every global batch, twice: run
``inject`` (inf on rank 1 only, at INJECT_STEP) and run ``clean``. Run ``loss`` trains a net
whose loss is ``mean(w * y) + offset``, with ``offset = inf`` on rank 1 only at INJECT_STEP:
that rank's loss is not finite while every gradient is, so only the all-reduced overflow flag
can tell rank 0. Runs ``loss_torch`` and ``loss_keras`` do the same as ``loss`` with a compiled
``GradScaler`` (PyTorch's spelling) and ``LossScaleOptimizer`` step, the gradients reduced by the
user's ``DistributedGradReducer``; run ``minimize_keras`` with ``LossScaleOptimizer.minimize``, which
reduces them itself. Run ``accumulate`` is ``inject`` with windows of 2 micro-batches
(the window holding rank 1's inf is skipped). Run ``batchnorm`` is ``inject`` with a BatchNorm network, and
saves its running statistics instead of the weights (both ranks write theirs back on the skipped step). Run
``persistent`` has inf on rank 1 only at every step from INJECT_STEP on, with ``overflow_policy="raise"`` and
``max_consecutive_overflows=2``: both ranks must stop at the same step (one rank stopping alone would leave the
other waiting in its next all-reduce). Run ``automatic`` trains ``sum(w * x)`` with automatic loss scaling and a
compiled ``GradScaler``, no gradient reducer: rank 0's gradient reaches the upper bin from a scale of 4096 on,
rank 1's never, so only the all-reduced counts keep the ranks' scales together. It writes ``rank<R>.json``
(per-step overflow flags and scales, counters) and ``rank<R>_<run>.npy`` (the trainable weights, or statistics,
after every step, stacked).
"""

import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from nets import BatchNormNet, LossPlusInput, regression_batches, regression_net, running_statistics_of  # noqa: E402

from lossscale import (  # noqa: E402
    DynamicLossScaleManager,
    GradScaler,
    LossScaleOptimizer,
    PersistentOverflowError,
    TrainOneStepWithLossScaleCell,
)
from lossscale.core.automatic import AutomaticLossScaleRule  # noqa: E402
from lossscale.demo.msrun import init_data_parallel  # noqa: E402

STEPS, INJECT_STEP, GLOBAL_BATCH = 8, 3, 8
RUNS = (
    "inject",
    "clean",
    "loss",
    "loss_torch",
    "loss_torch_eager",
    "loss_keras",
    "minimize_keras",
    "accumulate",
    "batchnorm",
    "persistent",
    "automatic",
)
# The gradient of ``sum(w * x)`` on each rank in run ``automatic``: x itself.
AUTOMATIC_X = (np.array([1.0, 1e-3, 1e-3, 1e-3], np.float32), np.full(4, 1e-3, np.float32))


def manager():
    return DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)


def train(rank, size, inject_steps, batch_norm=False, **options):
    """Returns the report and, after every step, the trainable weights (or, with ``batch_norm``, the running
    statistics of a BatchNorm network), stacked. Rank 1's batch holds an inf at ``inject_steps``; ``options`` go to
    the train cell. A PersistentOverflowError ends the run (its step is the report's ``stopped_at``)."""
    net = nn.WithLossCell(BatchNormNet(6, 8, 3), nn.MSELoss()) if batch_norm else regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.Momentum(net.trainable_params(), 0.05, 0.9), manager().get_update_cell(), **options
    )
    step.set_train()
    share = GLOBAL_BATCH // size
    flags, scales, weights, stopped_at = [], [], [], None
    for i, (x, y) in enumerate(regression_batches(STEPS, batch=GLOBAL_BATCH)):
        x, y = x[rank * share : (rank + 1) * share].copy(), y[rank * share : (rank + 1) * share]
        if i in inject_steps and rank == 1:
            x[0, 0] = np.inf
        try:
            _, overflow, scale = step(Tensor(x), Tensor(y))
        except PersistentOverflowError:
            stopped_at = i
            break
        flags.append(bool(overflow.asnumpy()))
        scales.append(float(scale.asnumpy()))
        weights.append(
            running_statistics_of(net)
            if batch_norm
            else np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])
        )
    report = {"flags": flags, "scales": scales, "counters": step.overflow_counters(), "stopped_at": stopped_at}
    return report, np.stack(weights)


def _offset(rank, i):
    """The loss offset of ``rank`` at step ``i``: inf on rank 1 at INJECT_STEP, else 0."""
    return Tensor(np.float32(np.inf if i == INJECT_STEP and rank == 1 else 0.0))


def _nonfinite_loss_run(rank, net, step, scale):
    """Train ``net`` (a LossPlusInput, ``y`` differing by rank) with ``step(y, offset) -> skipped`` for STEPS
    steps, rank 1's loss inf at INJECT_STEP: the skip flags, ``scale()`` after each step, and the weights."""
    y = Tensor(np.full(3, rank + 1.0, np.float32))
    flags, scales, weights = [], [], []
    for i in range(STEPS):
        flags.append(bool(step(y, _offset(rank, i)).asnumpy()))
        scales.append(scale())
        weights.append(net.w.asnumpy().copy())
    return {"flags": flags, "scales": scales}, np.stack(weights)


def train_with_nonfinite_loss(rank):
    net = LossPlusInput()
    cell = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), manager().get_update_cell())
    report, weights = _nonfinite_loss_run(rank, net, lambda y, offset: cell(y, offset)[1], cell.get_loss_scale)
    return dict(report, counters=cell.overflow_counters()), weights


def _front_end_step(front_end, net, size):
    """A compiled step ``(y, offset) -> skipped`` and a ``scale()`` reader for ``front_end`` (2**10, growth
    after 2 clean steps, as :func:`manager`), the gradients averaged over the ranks by a DistributedGradReducer.
    ``front_end`` ending in ``_eager``: the step is called from Python instead (the front-end's own calls then
    run their compiled graphs, all-reduce included)."""
    eager = front_end.endswith("_eager")
    front_end = front_end[: -len("_eager")] if eager else front_end
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    if front_end == "keras":
        optimizer = LossScaleOptimizer(optimizer, initial_scale=2.0**10, dynamic_growth_steps=2)
        scale_loss, unscale, scale = (
            optimizer.get_scaled_loss,
            optimizer.get_unscaled_gradients,
            lambda: float(optimizer.loss_scale.asnumpy()),
        )
    else:
        scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        scale_loss, unscale, scale = scaler.scale, None, scaler.get_scale
    reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=size)

    def forward(y, offset):
        return scale_loss(net(y, offset))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(y, offset):
        _, grads = grad_fn(y, offset)
        grads = reducer(grads)
        if unscale is not None:
            return optimizer.apply_gradients(unscale(grads))
        skipped = scaler.step(optimizer, grads)
        scaler.update()
        return skipped

    return (step if eager else ms.jit(step)), scale


def train_front_end_with_nonfinite_loss(rank, size, front_end):
    net = LossPlusInput()
    return _nonfinite_loss_run(rank, net, *_front_end_step(front_end, net, size))


def train_minimize_with_nonfinite_loss(rank):
    """``loss`` with ``LossScaleOptimizer.minimize``, which computes (and must reduce) the gradients itself."""
    net = LossPlusInput()
    optimizer = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=2.0**10, dynamic_growth_steps=2)

    def step(y, offset):
        def loss():
            return net(y, offset)

        return optimizer.minimize(loss)

    return _nonfinite_loss_run(rank, net, step, lambda: float(optimizer.loss_scale.asnumpy()))


class _Linear(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(4, np.float32)), name="w")

    def construct(self, x):
        return (self.w * x).sum()


def train_automatic(rank):
    net = _Linear()
    optimizer = nn.SGD(net.trainable_params(), 0.0)
    scaler = GradScaler("cpu", policy=AutomaticLossScaleRule(init_scale=1024.0))

    def forward(x):
        return scaler.scale(net(x))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def step(x):
        _, grads = grad_fn(x)
        skipped = scaler.step(optimizer, grads)
        scaler.update()
        return skipped

    scales = []
    for _ in range(STEPS):
        step(Tensor(AUTOMATIC_X[rank]))
        scales.append(scaler.get_scale())
    return {"scales": scales}, np.array(scales)


def main(out):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rank, size = init_data_parallel()  # the library's, as the command line's data-parallel training uses it
    report = {"size": size}
    for run in RUNS:
        if run == "loss":
            report[run], weights = train_with_nonfinite_loss(rank)
        elif run.startswith("loss_"):
            report[run], weights = train_front_end_with_nonfinite_loss(rank, size, run[len("loss_") :])
        elif run == "minimize_keras":
            report[run], weights = train_minimize_with_nonfinite_loss(rank)
        elif run == "accumulate":
            report[run], weights = train(rank, size, [INJECT_STEP], accumulation_steps=2)
        elif run == "batchnorm":
            report[run], weights = train(rank, size, [INJECT_STEP], batch_norm=True)
        elif run == "automatic":
            report[run], weights = train_automatic(rank)
        elif run == "persistent":
            report[run], weights = train(
                rank, size, range(INJECT_STEP, STEPS), overflow_policy="raise", max_consecutive_overflows=2
            )
        else:
            report[run], weights = train(rank, size, [INJECT_STEP] if run == "inject" else [])
        np.save(os.path.join(out, f"rank{rank}_{run}.npy"), weights)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(sys.argv[1])
