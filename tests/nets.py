"""Small networks, data and training drivers shared by the tests."""

import json
import os
import subprocess

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.train import Callback

from lossscale import LossScaleOptimizer

TESTS = os.path.dirname(os.path.abspath(__file__))  # the tests folder: helpers, workers, data


# A hidden width whose first weight (6 x WIDE) is reduced alone (GEMV_PROBE_MIN_SIZE), not in a buffer with the
# others: a compiled GradScaler step then branches on the stage it reads (IterationGraph._read_decision).
WIDE = 11_000


def regression_net(in_features=6, out_features=3, seed=0, hidden=8):
    """``WithLossCell(Dense -> ReLU -> Dense, MSE)`` with deterministic weights."""
    rng = np.random.RandomState(seed)
    body = nn.SequentialCell(
        [
            nn.Dense(
                in_features,
                hidden,
                weight_init=Tensor(rng.randn(hidden, in_features).astype(np.float32) * 0.3),
                bias_init=Tensor(rng.randn(hidden).astype(np.float32) * 0.1),
            ),
            nn.ReLU(),
            nn.Dense(
                hidden,
                out_features,
                weight_init=Tensor(rng.randn(out_features, hidden).astype(np.float32) * 0.3),
                bias_init=Tensor(rng.randn(out_features).astype(np.float32) * 0.1),
            ),
        ]
    )
    return nn.WithLossCell(body, nn.MSELoss())


class BatchNormNet(nn.Cell):
    """Dense -> BatchNorm1d -> Dense with deterministic weights: a network whose forward pass updates running
    statistics. (``mint.nn.BatchNorm1d`` has no CPU kernel in MindSpore 2.10.)"""

    def __init__(self, in_features=4, hidden=4, out_features=1):
        super().__init__()
        rng = np.random.RandomState(0)
        weight, out_weight = rng.randn(hidden, in_features), rng.randn(out_features, hidden)
        self.dense = nn.Dense(in_features, hidden, weight_init=Tensor(weight.astype(np.float32)), bias_init="zeros")
        self.norm = nn.BatchNorm1d(hidden)
        self.out = nn.Dense(hidden, out_features, weight_init=Tensor(out_weight.astype(np.float32)), bias_init="zeros")

    def construct(self, x):
        return self.out(self.norm(self.dense(x)))


def running_statistics_of(net):
    """The network's BatchNorm moving statistics, concatenated (a NumPy vector)."""
    return np.concatenate([p.asnumpy().ravel() for p in net.get_parameters() if "moving" in p.name])


def regression_batches(count, batch=4, in_features=6, out_features=3, seed=1):
    rng = np.random.RandomState(seed)
    return [
        (rng.randn(batch, in_features).astype(np.float32), rng.randn(batch, out_features).astype(np.float32))
        for _ in range(count)
    ]


def with_inf(x):
    """A copy of the input batch ``x`` with an inf in its first element: every gradient of the step overflows."""
    x = x.copy()
    x[0, 0] = np.inf
    return x


def train_calls(step, batches, inject=(), start=0):
    """Call the train cell ``step`` on each ``(x, y)`` of ``batches``, numbered from ``start``, with an inf in
    the calls whose number is in ``inject``; return the lists of losses, overflow flags and scales."""
    losses, flags, scales = [], [], []
    for number, (x, y) in enumerate(batches, start):
        loss, overflow, scale = step(Tensor(with_inf(x) if number in inject else x), Tensor(y))[:3]
        losses.append(float(loss.asnumpy()))
        flags.append(bool(overflow.asnumpy()))
        scales.append(float(np.asarray(scale.asnumpy()).reshape(-1)[0]))
    return losses, flags, scales


def snapshot(cell):
    """Every Parameter of ``cell`` (weights, optimizer state, scale, counters) as numpy copies."""
    return {p.name: p.asnumpy().copy() for p in cell.get_parameters()}


# The loss-scale state's Parameter names in a train cell: its scale, the counters of lossscale's cells, of MindSpore's
# dynamic cell and of MindFormers' adaptive window (whose names it keeps).
_UPDATE_CELL_NAMES = {
    "current_iterator_step",
    "last_overflow_iterator_step",
    "scale_window",
    "list_index",
    "scale_window_up_count",
    "scale_window_down_count",
}


def is_loss_scale_state(name):
    """Whether a Parameter name belongs to a train cell's loss-scale state."""
    return name == "scale_sense" or name.startswith("loss_scale_") or name in _UPDATE_CELL_NAMES


def training_state(cell):
    """Weights and optimizer state only (what a skipped step must leave bit-identical)."""
    return {name: value for name, value in snapshot(cell).items() if not is_loss_scale_state(name)}


def changed_since(before, cell, state=training_state):
    """The sorted names whose values in ``state(cell)`` differ from ``before`` (an earlier ``state(cell)``; NaN equals
    NaN): ``assert changed_since(before, net) == []`` after a step that must change nothing names what it changed."""
    return sorted(
        name for name, value in state(cell).items() if not np.array_equal(before[name], value, equal_nan=True)
    )


def group_optimizer(net, lr=0.05, weight_decay=0.01):
    """``nn.SGD`` with the usual weight-decay groups: its parameters are the weights, then the biases, not the
    network's order (gradients taken with respect to ``net.trainable_params()`` do not fit it)."""
    weights = [p for p in net.trainable_params() if "weight" in p.name]
    biases = [p for p in net.trainable_params() if "bias" in p.name]
    return nn.SGD([{"params": weights, "weight_decay": weight_decay}, {"params": biases}], lr)


def own_names(optimizer, prefix):
    """Prefix an optimizer's own Parameters (learning_rate, global_step, moments): several optimizers in one
    graph need unique names in MindSpore, whatever the loss scaling."""
    weights = {id(p) for p in optimizer.parameters}
    for parameter in optimizer.get_parameters():
        if id(parameter) not in weights:
            parameter.name = f"{prefix}.{parameter.name}"
    return optimizer


class Fp16SquareLoss(nn.Cell):
    """``loss = mean((x * w)^2)`` entirely in float16; overflows for |x| >= 256 when w = 1."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(1, np.float16)), name="w")

    def construct(self, x):
        y = ops.cast(x, mstype.float16) * self.w
        return ops.reduce_mean(y * y)


class Fp16Linear(nn.Cell):
    """``loss = sum(float32(w * x)) * 2**-20`` with float16 ``w``: small true gradients ``x * 2**-20``."""

    def __init__(self, size=4):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(size, np.float16)), name="w")
        self.factor = Tensor(2.0**-20, mstype.float32)

    def construct(self, x):
        return ops.reduce_sum(ops.cast(self.w * x, mstype.float32)) * self.factor


class LossPlusInput(nn.Cell):
    """``loss = mean(w * y) + offset``: finite gradients whatever ``offset`` is."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(3, np.float32)), name="w")

    def construct(self, y, offset):
        return ops.reduce_mean(self.w * y) + offset


class GradCapture(nn.Optimizer):
    """An 'optimizer' that stores the gradients it receives (to inspect what the train cell passes on)."""

    def __init__(self, params):
        super().__init__(0.0, params)
        self.captured = self._parameters.clone(prefix="captured", init="zeros")

    def construct(self, grads):
        return self.hyper_map(ops.assign, self.captured, grads)


class PlainSGD(nn.Optimizer):
    """``w -= lr * g`` with no optimizer state (MindSpore's own optimizers cannot clone a zero-size
    Parameter, nor update float64 ones)."""

    def construct(self, grads):
        return self.hyper_map(ops.partial(_sgd_update, self.get_lr()), self._parameters, grads)


_sgd_update = ops.MultitypeFuncGraph("_sgd_update")


@_sgd_update.register("Tensor", "Tensor", "Tensor")
def _tensor_sgd_update(lr, weight, grad):
    return ops.assign(weight, weight - lr * grad)


class Float64Regression(nn.Cell):
    """A float64 linear regression (float64 weights, inputs and gradients)."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.random.RandomState(3).randn(6, 3)), name="w")

    def construct(self, x, y):
        return ((ops.matmul(x, self.w) - y) ** 2).mean()


# ---- the reference tests (tests/test_reference_*.py): one model and data in every framework ------------------


def reference_batches(count, injected, seed=3):
    """``count`` batches ``(x (8, 4), y (8, 3))`` with an inf in ``x`` at the iterations in ``injected``."""
    rng = np.random.RandomState(seed)
    batches = []
    for i in range(count):
        x, y = rng.randn(8, 4).astype(np.float32), rng.randn(8, 3).astype(np.float32)
        if i in injected:
            x[1, 2] = np.inf
        batches.append((x, y))
    return batches


def reference_weight():
    """The initial (3, 4) weight of the bias-free Linear/Dense every reference run trains."""
    return np.random.RandomState(0).randn(3, 4).astype(np.float32) * 0.5


class ReferenceRun:
    """The bias-free Dense of :func:`reference_weight` trained with MSE in one ``mindspore.jit`` step (called
    eagerly with ``compiled=False``; ``compiled="bytecode"`` compiles with that ``capture_mode``):
    ``apply(grads)`` on the gradients of ``scale_loss(loss)`` with respect to ``parameters``."""

    def __init__(self, net, scale_loss, parameters, apply, compiled=True):
        self.net = net
        loss_net = nn.WithLossCell(net, nn.MSELoss())

        def forward(x, y):
            return scale_loss(loss_net(x, y))

        grad_fn = ms.value_and_grad(forward, None, parameters)

        def train_step(x, y):
            _, grads = grad_fn(x, y)
            return apply(grads)

        if compiled == "bytecode":
            self.train_step = ms.jit(train_step, capture_mode="bytecode")
        else:
            self.train_step = jit_if(compiled, train_step)

    def iteration(self, x, y):
        """One step on numpy ``x, y``; True if it was skipped."""
        return bool(self.train_step(Tensor(x), Tensor(y)).asnumpy())

    def checked_iteration(self, x, y, label=None):
        """:meth:`iteration`, asserting that it skipped exactly when ``x`` holds a non-finite value (the injected
        batches of :func:`reference_batches`), and that the weights changed exactly when it did not."""
        before = self.weight()
        skipped = self.iteration(x, y)
        assert skipped == (not np.all(np.isfinite(x))), label
        assert np.array_equal(before, self.weight()) == skipped, label
        return skipped

    def weight(self):
        return self.net.weight.asnumpy().copy()


def reference_net():
    """The bias-free Dense(4, 3) of :func:`reference_weight`."""
    return nn.Dense(4, 3, has_bias=False, weight_init=Tensor(reference_weight()))


class GradScalerRun(ReferenceRun):
    """``scaler`` (a lossscale GradScaler) with SGD: ``unscale_`` and global-norm clipping to ``clip`` if given,
    then ``step`` + ``update``, or ``minimize``."""

    def __init__(self, scaler, clip=None, minimize=False, lr=0.05, compiled=True):
        net = reference_net()
        self.optimizer = optimizer = nn.SGD(net.trainable_params(), learning_rate=lr)
        self.scaler = scaler

        def apply(grads):
            if clip is not None:
                grads = ops.clip_by_global_norm(scaler.unscale_(grads), clip)
            if minimize:
                return scaler.minimize(optimizer, grads)
            skipped = scaler.step(optimizer, grads)
            scaler.update()
            return skipped

        super().__init__(net, scaler.scale, optimizer.parameters, apply, compiled)


def keras_step(loss_fn, optimizer, pairs=None):
    """The tf.keras recipe as one (uncompiled) step ``step(x, y) -> skipped``: ``get_scaled_loss(loss_fn(x, y))``,
    differentiated, ``get_unscaled_gradients``, ``apply_gradients`` of the LossScaleOptimizer ``optimizer`` (of
    ``pairs(grads)``, Keras' ``(gradient, variable)`` pairs, if ``pairs`` is given)."""

    def forward(x, y):
        return optimizer.get_scaled_loss(loss_fn(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        _, grads = grad_fn(x, y)
        grads = optimizer.get_unscaled_gradients(grads)
        return optimizer.apply_gradients(grads if pairs is None else pairs(grads))

    return step


class LossScaleOptimizerRun(ReferenceRun):
    """A lossscale ``LossScaleOptimizer(SGD(lr), **kwargs)``, the tf.keras way: ``get_scaled_loss``,
    ``get_unscaled_gradients``, ``apply_gradients``."""

    def __init__(self, lr, compiled=True, **kwargs):
        net = reference_net()
        self.optimizer = optimizer = LossScaleOptimizer(nn.SGD(net.trainable_params(), learning_rate=lr), **kwargs)

        def apply(grads):
            return optimizer.apply_gradients(optimizer.get_unscaled_gradients(grads))

        super().__init__(net, optimizer.get_scaled_loss, optimizer.parameters, apply, compiled)

    def observed(self):
        opt = self.optimizer
        return {
            "loss_scale": float(opt.loss_scale.asnumpy()),
            "dynamic_counter": opt.dynamic_counter,
            "iterations": int(opt.iterations.asnumpy().reshape(-1)[0]),
        }


def training_case(kwargs, batches, lr):
    """A training run of the reference model as JSON for a reference script: the weight (out x in), the
    learning rate, the scaler's ``kwargs`` and the ``batches``."""
    return {
        "weight": reference_weight().tolist(),
        "lr": lr,
        "kwargs": kwargs,
        "batches": [[x.tolist(), y.tolist()] for x, y in batches],
    }


def run_reference_script(python, script, cases):
    """Run ``tests/references/<script>`` under the interpreter ``python`` (a framework that cannot share this
    process) with ``cases`` as JSON on stdin; return its JSON output."""
    path = os.path.join(TESTS, "references", script)
    done = subprocess.run(
        [python, path], input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


MISUSES = ("unscale_twice", "step_twice", "unscale_after_step", "update_without_step")


def misuse_their_scaler(scaler, optimizer, kind):
    """Misuse ``kind`` of PyTorch's or Paddle's own GradScaler (gradients already in ``optimizer``'s parameters)."""
    if kind == "unscale_twice":
        scaler.unscale_(optimizer)
        scaler.unscale_(optimizer)
    elif kind == "step_twice":
        scaler.step(optimizer)
        scaler.step(optimizer)
    elif kind == "unscale_after_step":
        scaler.step(optimizer)
        scaler.unscale_(optimizer)
    else:
        scaler.update()


def misuse_our_scaler(scaler, optimizer, grads, kind):
    """The same misuse of a lossscale GradScaler, which takes the gradients as values."""
    if kind == "unscale_twice":
        scaler.unscale_(scaler.unscale_(grads))
    elif kind == "step_twice":
        scaler.step(optimizer, grads)
        scaler.step(optimizer, grads)
    elif kind == "unscale_after_step":
        scaler.step(optimizer, grads)
        scaler.unscale_(grads)
    else:
        scaler.update()


class Square(nn.Cell):
    """Keras' example: ``loss = var ** 2`` with ``var = 1``."""

    def __init__(self, value=1.0, dtype=np.float32):
        super().__init__()
        self.var = Parameter(Tensor(np.array(value, dtype)), name="var")

    def construct(self):
        return self.var**2


def scalar_of(opt_or_param):
    """The host float of a one-element Tensor or Parameter."""
    return float(opt_or_param.asnumpy().item())


def tiered(cases, fast):
    """``pytest.param`` of each case (``{id: value}``, or names that are their own values): those whose id is in
    ``fast`` run in the README's tier, the others only in the slow tier (which CI runs too), so that the five-minute
    tier keeps one of each kind."""
    if not isinstance(cases, dict):
        cases = {name: name for name in cases}
    unknown = set(fast) - set(cases)
    assert not unknown, f"no such cases: {unknown}"
    return [pytest.param(value, id=name, marks=slow_unless(name in fast)) for name, value in cases.items()]


def slow_unless(in_readme_tier):
    """The marks of a case that runs in the README's tier only when ``in_readme_tier`` (else the slow tier)."""
    return [] if in_readme_tier else [pytest.mark.slow]


def jit_if(compiled, function):
    """``mindspore.jit(function)`` when ``compiled``, else ``function``: the one switch of the tests that run each
    case eagerly and compiled (the ``compiled`` fixture of conftest.py)."""
    return ms.jit(function) if compiled else function


class StepRecorder(Callback):
    """Records (overflow, scale) from the train network's outputs after every step."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_step_end(self, run_context):
        outputs = run_context.original_args().net_outputs
        self.rows.append((bool(outputs[1].asnumpy()), float(outputs[2].asnumpy())))
