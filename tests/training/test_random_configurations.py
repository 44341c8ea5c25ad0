"""Whole training steps of random train-cell configurations against a NumPy reference.

Each case draws a configuration (SGD or Momentum; dynamic rule with random factor, window,
hysteresis mode and bounds, or a fixed scale with or without dropping overflowing steps; 1-3
micro-batches per step; clipping or not; extra outputs or not) and a run of batches, some with an
inf or nan in the inputs or the targets, or a target so large that the loss is inf while the
gradients are finite. The reference computes the same steps in float32 NumPy: gradients of a
linear layer with mean squared error, accumulation and its mean, clipping, the skip, the
optimizer, the counters, and the scale from :func:`lossscale.core.policy.update`. Every call must agree
on the loss, the overflow decision, the scale, the weights, the reported global norm and the
counters. The parts are tested one by one elsewhere; this checks that they compose.
"""

import random

import numpy as np
import pytest
from mindspore import Tensor, nn
from nets import tiered

from lossscale import DynamicLossScaleManager, FixedLossScaleManager, TrainOneStepWithLossScaleCell
from lossscale.core.policy import initial_state, update

F32 = np.float32
LR, MOMENTUM = 0.05, 0.9
IN, OUT, BATCH, CALLS = 4, 2, 3, 14
SEEDS = 12


def random_configuration(rng):
    """A random train-cell configuration: ``(keyword options of the cell, a manager, "sgd" or "momentum")``."""
    options = dict(
        accumulation_steps=rng.choice([1, 1, 2, 3]),
        clip_global_norm=rng.choice([None, None, 0.05, 100.0]),
        extra_outputs=rng.random() < 0.5,
    )
    if rng.random() < 0.75:
        rule = dict(
            init_loss_scale=2.0 ** rng.randint(0, 20),
            scale_factor=rng.choice([2, 4]),
            scale_window=rng.randint(1, 3),
            hysteresis=rng.randint(1, 3),
            consecutive_hysteresis=rng.random() < 0.5,
            refill_hysteresis_on_backoff=rng.random() < 0.5,
            min_loss_scale=rng.choice([1.0, 0.25, 0.0]),
            max_loss_scale=rng.choice([None, 2.0**12]),
        )
        if rule["max_loss_scale"] is not None:
            rule["init_loss_scale"] = min(rule["init_loss_scale"], rule["max_loss_scale"])
        manager = DynamicLossScaleManager(**rule)
    else:
        # Applying overflowing steps with clipping would test how a nan norm clips (garbage either way).
        drop = options["clip_global_norm"] is not None or rng.random() < 0.6
        manager = FixedLossScaleManager(2.0 ** rng.randint(0, 16), drop_overflow_update=drop)
    return options, manager, rng.choice(["sgd", "momentum"])


def random_batches(rng, nrng, huge_targets):
    """``CALLS`` batches; about a third carry an inf or nan in the inputs or a -inf in the targets. With
    ``huge_targets``, some carry a target of 1e20: the loss is inf, the gradients are finite (about 1e20)."""
    batches = []
    for _ in range(CALLS):
        x, y = nrng.randn(BATCH, IN).astype(F32), nrng.randn(BATCH, OUT).astype(F32)
        poison = rng.random()
        if poison < 0.15:
            x[rng.randrange(BATCH), rng.randrange(IN)] = np.inf
        elif poison < 0.25:
            x[rng.randrange(BATCH), rng.randrange(IN)] = np.nan
        elif poison < 0.32:
            y[rng.randrange(BATCH), rng.randrange(OUT)] = -np.inf
        elif poison < 0.42 and huge_targets:
            y[rng.randrange(BATCH), rng.randrange(OUT)] = 1e20
        batches.append((x, y))
    return batches


def finite(*arrays):
    return all(np.isfinite(a).all() for a in arrays)


class ReferenceStep:
    """The train cell's step in float32 NumPy for ``Dense(IN, OUT)`` + ``MSELoss`` (see the module docstring)."""

    def __init__(self, weight, bias, options, manager, optimizer):
        self.params = [weight.copy(), bias.copy()]
        self.velocity = [np.zeros_like(p) for p in self.params]
        self.accumulated = [np.zeros_like(p) for p in self.params]
        self.window_overflow, self.micro = False, 0
        self.steps = options["accumulation_steps"]
        self.clip = options["clip_global_norm"]
        self.optimizer = optimizer
        self.drop = manager.get_drop_overflow_update()
        self.policy = getattr(manager, "policy", None)
        self.state = initial_state(self.policy) if self.policy is not None else None
        self.scale = F32(manager.get_loss_scale())
        self.counters = dict(steps=0, skipped_steps=0, consecutive_overflows=0, last_overflow_step=0)

    def gradients(self, x, y):
        weight, bias = self.params
        diff = x @ weight.T + bias - y
        loss = F32(np.mean(diff * diff, dtype=F32))
        d_out = (F32(2.0) * diff / F32(diff.size)).astype(F32)
        return loss, [(d_out.T @ x).astype(F32), d_out.sum(0).astype(F32)]

    @staticmethod
    def norm(grads):
        return F32(np.sqrt(F32(sum(np.sum(g * g, dtype=F32) for g in grads))))

    def __call__(self, x, y):
        """One call: ``(loss, overflow, scale, global norm)`` as the cell returns them."""
        with np.errstate(all="ignore"):
            loss, grads = self.gradients(x, y)
            overflow = not finite(*grads) or (self.drop and not np.isfinite(loss))
            if self.steps == 1:
                return (loss,) + self.finish(overflow, grads)
            self.accumulated = [a + g for a, g in zip(self.accumulated, grads)]
            self.window_overflow, self.micro = self.window_overflow or overflow, self.micro + 1
            if self.micro < self.steps:
                return loss, False, self.scale, self.norm(grads)
            mean = [(a * F32(1.0 / self.steps)).astype(F32) for a in self.accumulated]
            overflow = self.window_overflow or not finite(*mean)
            self.accumulated = [np.zeros_like(a) for a in self.accumulated]
            self.window_overflow, self.micro = False, 0
            return (loss,) + self.finish(overflow, mean)

    def finish(self, overflow, grads):
        norm = self.norm(grads)
        if self.clip is not None:
            overflow = overflow or not np.isfinite(norm)
            factor = F32(self.clip) / max(norm, F32(self.clip))
            grads = [(g * factor).astype(F32) for g in grads]
        if self.policy is not None:
            self.state = update(self.policy, self.state, overflow)
            self.scale = F32(self.state.scale)
        self.count(overflow)
        if not (overflow and self.drop):
            self.apply(grads)
        return overflow, self.scale, norm

    def count(self, overflow):
        counters = self.counters
        counters["steps"] += 1
        counters["consecutive_overflows"] = counters["consecutive_overflows"] + 1 if overflow else 0
        if overflow:
            counters["skipped_steps"] += int(self.drop)
            counters["last_overflow_step"] = counters["steps"]

    def apply(self, grads):
        if self.optimizer == "momentum":
            self.velocity = [(F32(MOMENTUM) * v + g).astype(F32) for v, g in zip(self.velocity, grads)]
            grads = self.velocity
        self.params = [(p - F32(LR) * g).astype(F32) for p, g in zip(self.params, grads)]


def build(options, manager, optimizer, weight, bias):
    net = nn.Dense(IN, OUT)
    net.weight.set_data(Tensor(weight))
    net.bias.set_data(Tensor(bias))
    params = net.trainable_params()
    opt = nn.SGD(params, LR) if optimizer == "sgd" else nn.Momentum(params, LR, MOMENTUM)
    sense = manager.get_update_cell()
    if sense is None:  # FixedLossScaleManager(S, drop_overflow_update=False): MindSpore's convention, a Tensor
        sense = Tensor(F32(manager.get_loss_scale()))
    cell = TrainOneStepWithLossScaleCell(
        nn.WithLossCell(net, nn.MSELoss()),
        opt,
        sense,
        drop_overflow_update=manager.get_drop_overflow_update(),
        **options,
    )
    return cell, net


def close(got, expected):
    return np.allclose(got, expected, rtol=2e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize(
    "seed", tiered({str(seed): seed for seed in range(SEEDS)}, {str(s) for s in range(SEEDS // 4)})
)
def test_random_configuration_trains_like_the_numpy_reference(seed):
    rng, nrng = random.Random(seed), np.random.RandomState(seed)
    options, manager, optimizer = random_configuration(rng)
    weight, bias = nrng.randn(OUT, IN).astype(F32), nrng.randn(OUT).astype(F32)
    cell, net = build(options, manager, optimizer, weight, bias)
    reference = ReferenceStep(weight, bias, options, manager, optimizer)
    described = f"{optimizer}, {options}, {describe(manager)}"
    for call, (x, y) in enumerate(random_batches(rng, nrng, manager.get_drop_overflow_update())):
        outputs = cell(Tensor(x), Tensor(y))
        loss, overflow, scale, norm = reference(x, y)
        where = f"call {call} of {described}"
        assert close(outputs[0].asnumpy(), loss), where
        assert bool(outputs[1].asnumpy()) == overflow, where
        assert float(outputs[2].asnumpy()) == float(scale), where
        if options["extra_outputs"]:
            assert close(outputs[4].asnumpy(), norm), where
        assert close(net.weight.asnumpy(), reference.params[0]), where
        assert close(net.bias.asnumpy(), reference.params[1]), where
        assert cell.overflow_counters() == reference.counters, where


def describe(manager):
    if isinstance(manager, DynamicLossScaleManager):
        return repr(manager.policy)
    return f"fixed {manager.get_loss_scale()}, drop_overflow_update={manager.get_drop_overflow_update()}"


def test_the_random_cases_cover_every_feature_with_overflows_and_clean_steps():
    """The seeds above are not vacuous: each feature meets skipped and applied steps (reference only)."""
    seen = set()
    for seed in range(SEEDS):
        rng, nrng = random.Random(seed), np.random.RandomState(seed)
        options, manager, optimizer = random_configuration(rng)
        weight, bias = nrng.randn(OUT, IN).astype(F32), nrng.randn(OUT).astype(F32)
        reference = ReferenceStep(weight, bias, options, manager, optimizer)
        features = {
            optimizer,
            f"accumulation {options['accumulation_steps']}",
            "clipping" if options["clip_global_norm"] else "no clipping",
            "dynamic" if reference.policy else f"fixed, drop={reference.drop}",
        }
        for x, y in random_batches(rng, nrng, manager.get_drop_overflow_update()):
            with np.errstate(all="ignore"):
                loss, grads = reference.gradients(x, y)
            if (
                not np.isfinite(loss)
                and finite(*grads)
                and reference.micro + 1 < reference.steps
                and reference.clip is None
            ):  # only the window's flag can carry it (clipping sees an inf norm)
                seen.add(("inf loss, finite gradients, mid-window, no clipping", True))
            _, overflow, _, _ = reference(x, y)
            seen |= {(feature, overflow) for feature in features}
    assert ("inf loss, finite gradients, mid-window, no clipping", True) in seen
    features = {feature for feature, _ in seen if not feature.startswith("inf loss")}
    assert {
        "sgd",
        "momentum",
        "accumulation 1",
        "accumulation 2",
        "accumulation 3",
        "clipping",
        "no clipping",
        "dynamic",
        "fixed, drop=True",
        "fixed, drop=False",
    } <= features
    assert all((feature, overflow) in seen for feature in features for overflow in (False, True))
