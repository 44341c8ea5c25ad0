"""lossscale's PyTorch spelling against torch.amp.GradScaler itself, run side by side (needs torch).

The same model, data and injected infs in both frameworks: the scale after every update, which
iterations are skipped, the weights, ``state_dict()``, a state moved from PyTorch to lossscale, and
PyTorch's errors. Skipped when torch is not installed (CI installs the CPU wheel when it can).
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from nets import (
    MISUSES,
    GradScalerRun,
    misuse_our_scaler,
    misuse_their_scaler,
    own_names,
    reference_batches,
    reference_weight,
)

from lossscale import GradScaler, get_preset

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.reference

INJECTED = {2, 5, 6}  # iterations whose input holds an inf
CLIP = 0.5


def _data(count):
    return reference_batches(count, INJECTED)


class TorchRun:
    """torch.amp.GradScaler on a bias-free Linear with MSE and SGD (CPU, float32)."""

    def __init__(self, clip, **scaler_args):
        self.model = torch.nn.Linear(4, 3, bias=False)
        with torch.no_grad():
            self.model.weight.copy_(torch.from_numpy(reference_weight()))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.scaler = torch.amp.GradScaler("cpu", **scaler_args)
        self.clip = clip

    def iteration(self, x, y):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(torch.from_numpy(x)), torch.from_numpy(y))
        self.scaler.scale(loss).backward()
        if self.clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def weight(self):
        return self.model.weight.detach().numpy().copy()


def LossScaleRun(clip, **scaler_args):
    """lossscale.GradScaler (PyTorch's spelling) on the same model, in one mindspore.jit step."""
    return GradScalerRun(GradScaler("cuda", **scaler_args), CLIP if clip else None)


@pytest.mark.parametrize("clip", [False, True], ids=["basic", "unscale_clip"])
@pytest.mark.slow
def test_same_scales_skips_weights_and_state_as_pytorch(clip):
    theirs, ours = (
        TorchRun(clip, init_scale=2.0**10, growth_interval=2),
        LossScaleRun(clip, init_scale=2.0**10, growth_interval=2),
    )
    for i, (x, y) in enumerate(_data(10)):
        theirs.iteration(x, y)
        ours.checked_iteration(x, y, i)
        assert ours.scaler.get_scale() == theirs.scaler.get_scale(), i
        np.testing.assert_allclose(ours.weight(), theirs.weight(), rtol=2e-5, atol=1e-6, err_msg=str(i))
    assert ours.scaler.state_dict() == theirs.scaler.state_dict()


def test_pytorch_state_continues_identically_in_lossscale():
    theirs, ours = TorchRun(False, init_scale=2.0**12, growth_interval=3), LossScaleRun(False)
    data = _data(10)
    for x, y in data[:4]:
        theirs.iteration(x, y)
    ours.scaler.load_state_dict(theirs.scaler.state_dict())
    ours.net.weight.set_data(Tensor(theirs.weight()))
    for x, y in data[4:]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
        assert ours.scaler.get_scale() == theirs.scaler.get_scale()
    assert ours.scaler.state_dict() == theirs.scaler.state_dict()


@pytest.mark.slow
def test_the_same_errors_as_pytorch():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    net = nn.Dense(2, 1)
    opt = nn.SGD(net.trainable_params(), 0.1)
    grads = (Tensor(np.ones((1, 2), np.float32)), Tensor(np.ones(1, np.float32)))

    for kind in MISUSES:
        with pytest.raises((RuntimeError, AssertionError)) as expected:
            scaler = torch.amp.GradScaler("cpu")
            scaler.scale(model(torch.ones(1, 2)).sum()).backward()
            misuse_their_scaler(scaler, optimizer, kind)
        with pytest.raises(type(expected.value)) as got:
            misuse_our_scaler(GradScaler("cpu"), opt, grads, kind)
        assert str(got.value).startswith(str(expected.value).rstrip(".")), kind
    for bad in ({"growth_factor": 1.0}, {"backoff_factor": 1.0}):
        with pytest.raises(AssertionError):
            torch.amp.GradScaler("cpu", **bad)
        with pytest.raises(AssertionError):
            GradScaler("cpu", **bad)
    assert GradScaler("cpu", enabled=False).state_dict() == torch.amp.GradScaler("cpu", enabled=False).state_dict()
    for scaler in (GradScaler("cpu"), torch.amp.GradScaler("cpu")):
        with pytest.raises(RuntimeError, match="The source state dict is empty"):
            scaler.load_state_dict({})


def test_a_state_with_our_hysteresis_keys_loads_into_pytorch():
    """A TorchGradScaler whose rule has hysteresis saves it under keys of its own; PyTorch reads its five."""
    ours = GradScaler("cpu", policy=get_preset("megatron", init_scale=512.0, growth_interval=7))
    saved = ours.state_dict()
    assert saved["hysteresis"] == 2 and saved["_hysteresis_tracker"] == 0
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(saved)
    assert theirs.get_scale() == 512.0 and theirs.get_growth_interval() == 7


class TwoModels:
    """Two bias-free Linear models with ``weights`` trained on one summed MSE loss, side by side: in torch (SGD,
    ``torch.amp.GradScaler("cpu", **scaler_args)``) and in MindSpore (SGD, ``GradScaler("cuda", **scaler_args)``,
    ``grad_fn`` of the scaled loss). ``prefix`` keeps the MindSpore Parameter names unique in one graph."""

    def __init__(self, weights, prefix, **scaler_args):
        self.models = [torch.nn.Linear(4, w.shape[0], bias=False) for w in weights]
        for model, w in zip(self.models, weights):
            with torch.no_grad():
                model.weight.copy_(torch.from_numpy(w))
        self.torch_opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in self.models]
        self.torch_scaler = torch.amp.GradScaler("cpu", **scaler_args)
        self.nets = [nn.Dense(4, w.shape[0], has_bias=False, weight_init=Tensor(w)) for w in weights]
        for index, net in enumerate(self.nets):
            net.weight.name = f"{prefix}{index}.weight"
        self.opts = [
            own_names(nn.SGD(n.trainable_params(), learning_rate=0.05), f"{prefix}_opt{i}")
            for i, n in enumerate(self.nets)
        ]
        self.scaler = scaler = GradScaler("cuda", **scaler_args)
        nets, mse = self.nets, nn.MSELoss()

        def forward(x, y0, y1):
            return scaler.scale(mse(nets[0](x), y0) + mse(nets[1](x), y1))

        self.grad_fn = ms.value_and_grad(forward, None, self.opts[0].parameters + self.opts[1].parameters)

    def torch_backward(self, x, y0, y1):
        """zero_grad, then backward of the scaled loss in torch."""
        for opt in self.torch_opts:
            opt.zero_grad()
        tx = torch.from_numpy(x)
        loss = torch.nn.functional.mse_loss(self.models[0](tx), torch.from_numpy(y0)) + torch.nn.functional.mse_loss(
            self.models[1](tx), torch.from_numpy(y1)
        )
        self.torch_scaler.scale(loss).backward()

    def assert_same(self, label):
        """The same scale and weights in both frameworks."""
        assert self.scaler.get_scale() == self.torch_scaler.get_scale(), label
        for net, model in zip(self.nets, self.models):
            np.testing.assert_allclose(
                net.weight.asnumpy(), model.weight.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=label
            )


def test_two_optimizers_one_overflowing_as_pytorch():
    """PyTorch's test_grad_scaling_multiple: the optimizer whose gradients hold an inf skips, the other steps,
    and update() backs off once. The inf is put into one gradient after backward (a finite loss)."""
    poisoned = {1, 4}
    rng = np.random.RandomState(5)
    weights = [rng.randn(3, 4).astype(np.float32), rng.randn(2, 4).astype(np.float32)]
    batches = [
        (rng.randn(8, 4).astype(np.float32), rng.randn(8, 3).astype(np.float32), rng.randn(8, 2).astype(np.float32))
        for _ in range(6)
    ]

    pair = TwoModels(weights, "model", init_scale=2.0**10, growth_interval=2)
    scaler, opts, grad_fn = pair.scaler, pair.opts, pair.grad_fn

    @ms.jit
    def train_step(x, y0, y1, poison):
        _, (g0, g1) = grad_fn(x, y0, y1)
        g1 = ops.select(poison, ops.full_like(g1, np.inf), g1)
        skipped = (scaler.step(opts[0], (g0,)), scaler.step(opts[1], (g1,)))
        scaler.update()
        return skipped

    for i, (x, y0, y1) in enumerate(batches):
        pair.torch_backward(x, y0, y1)
        if i in poisoned:
            pair.models[1].weight.grad[0, 0] = float("inf")
        for opt in pair.torch_opts:
            pair.torch_scaler.step(opt)
        pair.torch_scaler.update()
        skipped = train_step(Tensor(x), Tensor(y0), Tensor(y1), Tensor(i in poisoned))
        assert [bool(s.asnumpy()) for s in skipped] == [False, i in poisoned], i
        pair.assert_same(str(i))
    assert scaler.state_dict() == pair.torch_scaler.state_dict()


def test_a_tracker_beyond_a_lowered_growth_interval_is_clipped_where_pytorch_never_grows_again():
    """A deliberate difference (docs/migration.md): PyTorch's update compares ``tracker + 1 == growth_interval``,
    so after set_growth_interval() below the current tracker the scale never grows again; lossscale clips the
    tracker to the new interval."""
    theirs, ours = (
        TorchRun(False, init_scale=2.0**10, growth_interval=4),
        LossScaleRun(False, init_scale=2.0**10, growth_interval=4),
    )
    data = reference_batches(6, set())
    for x, y in data[:3]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
    assert ours.scaler.state_dict() == theirs.scaler.state_dict()  # tracker 3
    for scaler in (theirs.scaler, ours.scaler):
        scaler.set_growth_interval(2)
    scales = {"theirs": [], "ours": []}
    for x, y in data[3:]:
        theirs.iteration(x, y)
        ours.iteration(x, y)
        scales["theirs"].append(theirs.scaler.get_scale())
        scales["ours"].append(ours.scaler.get_scale())
    assert scales == {"theirs": [1024.0] * 3, "ours": [2048.0, 2048.0, 4096.0]}
    assert theirs.scaler.state_dict()["_growth_tracker"] == 6


def _random_mask(rng, shape):
    """An additive poison for a gradient: inf everywhere, or one +inf, -inf or nan."""
    mask = np.zeros(shape, np.float32)
    kind = rng.randint(4)
    if kind == 0:
        mask[:] = np.inf
    else:
        mask.flat[rng.randint(mask.size)] = (np.inf, -np.inf, np.nan)[kind - 1]
    return mask


@pytest.mark.slow
def test_random_iterations_with_two_optimizers_as_pytorch():
    """Random iterations, side by side with torch.amp.GradScaler: each optimizer's gradient poisoned or not,
    unscale_ or not per optimizer, then nothing, nan_to_num or global-norm clipping, either step order, eager
    or compiled. Found the false "step() got the scaled gradients" refusal of an inf after unscale_."""
    rng = np.random.RandomState(11)
    shapes = [(3, 4), (2, 4)]
    pair = TwoModels(
        [rng.randn(*shape).astype(np.float32) for shape in shapes], "random", init_scale=2.0**8, growth_interval=2
    )
    scaler, opts, grad_fn = pair.scaler, pair.opts, pair.grad_fn

    def make_step(unscale, after, order):
        def train_step(x, y0, y1, poison0, poison1):
            _, (g0, g1) = grad_fn(x, y0, y1)
            grads = [(g0 + poison0,), (g1 + poison1,)]
            for k in (0, 1):
                if unscale[k]:
                    grads[k] = scaler.unscale_(grads[k])
                    if after == "nan_to_num":
                        grads[k] = tuple(ops.nan_to_num(g, 0.0, 1.0, -1.0) for g in grads[k])
                    elif after == "clip":
                        grads[k] = ops.clip_by_global_norm(grads[k], 0.5)
            skipped = [scaler.step(opts[k], grads[k]) for k in order]
            scaler.update()
            return skipped[0], skipped[1]

        return train_step

    compiled = {}
    for i in range(12):
        x, y0, y1 = (
            rng.randn(8, 4).astype(np.float32),
            rng.randn(8, 3).astype(np.float32),
            rng.randn(8, 2).astype(np.float32),
        )
        poisons = [_random_mask(rng, s) if rng.rand() < 0.3 else np.zeros(s, np.float32) for s in shapes]
        unscale = (bool(rng.rand() < 0.5), bool(rng.rand() < 0.5))
        after = ("none", "nan_to_num", "clip")[rng.randint(3)]
        order = (0, 1) if rng.rand() < 0.5 else (1, 0)
        pair.torch_backward(x, y0, y1)
        for model, poison, opt, k in zip(pair.models, poisons, pair.torch_opts, (0, 1)):
            with torch.no_grad():
                model.weight.grad.add_(torch.from_numpy(poison))
            if unscale[k]:
                pair.torch_scaler.unscale_(opt)
                with torch.no_grad():
                    if after == "nan_to_num":
                        model.weight.grad.nan_to_num_(0.0, 1.0, -1.0)
                    elif after == "clip":
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        for k in order:
            pair.torch_scaler.step(pair.torch_opts[k])
        pair.torch_scaler.update()

        step = make_step(unscale, after, order)
        if rng.rand() < 0.7:
            step = compiled.setdefault((unscale, after, order), ms.jit(step))
        step(*(Tensor(a) for a in (x, y0, y1, *poisons)))
        pair.assert_same(f"iteration {i}: unscale_ {unscale}, then {after}, order {order}")
    assert scaler.state_dict() == pair.torch_scaler.state_dict()
