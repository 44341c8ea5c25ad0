"""Shared pieces of the GradScaler tests: the regression network's batches and gradients through a scaler,
PyTorch's ``_run_scaling_case`` steps (a scaled step, one clipped after a separate unscale_, and the control step
without scaling), the comparison of training states, and a network trained by ``minimize`` with overflows injected
by flag (:class:`MinimizeRun`)."""

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from nets import changed_since, jit_if, regression_batches, regression_net, training_state, with_inf

from lossscale import GradScaler

T, F = True, False


SKIP_ITER = 2


def scaled_grad_fn(scaler, net, optimizer):
    """``value_and_grad`` of ``scaler.scale(net(*inputs))`` (a network with its loss)."""

    def forward(*inputs):
        return scaler.scale(net(*inputs))

    return ms.value_and_grad(forward, None, optimizer.parameters)


def pytorch_sgd_setup(hidden=8, **scaler_arguments):
    """``(scaler, net, opt, grad_fn)``: a PyTorch-spelled GradScaler("cuda", **scaler_arguments), the regression
    net of width ``hidden``, SGD(0.05) over it and :func:`scaled_grad_fn` of the three."""
    scaler = GradScaler("cuda", **scaler_arguments)
    net = regression_net(hidden=hidden)
    opt = nn.SGD(net.trainable_params(), 0.05)
    return scaler, net, opt, scaled_grad_fn(scaler, net, opt)


def poisoned_grads(grads, flag):
    """The third gradient (the second layer's weight) replaced by inf where ``flag`` (PyTorch's fill_(inf))."""
    bad = ops.select(flag, ops.full_like(grads[2], np.inf), grads[2])
    return grads[:2] + (bad,) + grads[3:]


def tensor_batches(count=4):
    return [tuple(Tensor(a) for a in batch) for batch in regression_batches(count)]


def read_outputs(outputs):
    """Read a compiled call's outputs on the host: MindSpore reports a runtime raise of an asynchronously
    running graph at the next host read, and the refusal must surface here, not in a later test."""
    for value in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if isinstance(value, Tensor):
            value.asnumpy()
        elif isinstance(value, (tuple, list)):
            read_outputs(value)
        elif isinstance(value, GradScaler):
            value.get_scale()
    return outputs


def state_of(cells):
    """training_state of a Cell, or of several (a network and its optimizer) merged."""
    return {
        name: value
        for cell in (cells if isinstance(cells, tuple) else (cells,))
        for name, value in training_state(cell).items()
    }


def same_training_state(a, b, rtol=1e-5, atol=1e-7):
    expected, actual = state_of(a), state_of(b)
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol, err_msg=name)


def basic_step(scaler, net, opt):
    grad_fn = scaled_grad_fn(scaler, net, opt)

    def step(x, y, poison):
        _, grads = grad_fn(x, y)
        scaler.step(opt, poisoned_grads(grads, poison))
        scaler.update()
        return grads[0]

    return step


def clipping_separate_unscale(scaler, net, opt):
    grad_fn = scaled_grad_fn(scaler, net, opt)

    def step(x, y, poison):
        _, grads = grad_fn(x, y)
        grads = scaler.unscale_(poisoned_grads(grads, poison))
        grads = ops.clip_by_global_norm(grads, 0.2)
        scaler.step(opt, grads)
        scaler.update()
        return grads[0]

    return step


def control_step(net, opt, clip=None):
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(x, y, skip):
        _, grads = grad_fn(x, y)
        if clip is not None:
            grads = ops.clip_by_global_norm(grads, clip)
        if not skip:
            opt(grads)
        return grads[0]

    return step


def sgd(params):
    return nn.SGD(params, learning_rate=0.05)


class MinimizeRun:
    """A regression network trained by ``scaler.minimize`` (eagerly or compiled), overflows injected by flag."""

    def __init__(self, scaler, compiled):
        self.scaler, self.net = scaler, regression_net()
        opt = sgd(self.net.trainable_params())
        grad_fn = scaled_grad_fn(scaler, self.net, opt)

        def train_step(x, y):
            _, grads = grad_fn(x, y)
            return scaler.minimize(opt, grads)

        self.step = jit_if(compiled, train_step)

    def run(self, flags, seed=1):
        """The scale after each step; asserts each skip decision and that a skipped step changed nothing."""
        scales = []
        for flag, (x, y) in zip(flags, regression_batches(len(flags), seed=seed)):
            before = training_state(self.net)
            skipped = self.step(Tensor(with_inf(x) if flag else x), Tensor(y))
            assert bool(skipped.asnumpy()) == flag
            assert (changed_since(before, self.net) == []) == flag
            scales.append(self.scaler.get_scale())
        return scales
