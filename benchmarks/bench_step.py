"""One benchmark configuration (model x amp level) in this process: four train-step variants.

    python benchmarks/bench_step.py --model mlp --level O2 [--rounds 10 --steps 20 --warmup 10]

Variants:
  plain       (1)  mindspore nn.TrainOneStepCell, no loss scaling
  plain_if    (1c) the same step with the optimizer under an `if` on a tensor condition
  plain_wait  (1d) as (1c), but the condition also waits for every gradient (no computation):
                   the structure any exact skip has, since the decision needs all gradients
  cheapest    (1e) the floor of an exact loss-scaling step: value_and_grad of loss * S (a constant), lossscale's
                   exact check (one read of every gradient), unscale, the optimizer under an `if`; no rule, no
                   counters, no misuse checks
  lossscale   (2)  lossscale.TrainOneStepWithLossScaleCell + DynamicLossScaleManager
  ms_jit      (3)  MindSpore's functional path: amp.DynamicLossScaler + amp.all_finite in mindspore.jit
  gradscaler  (4)  lossscale.torch.GradScaler in a mindspore.jit step: scale, value_and_grad, step, update
  gradscaler_paddle (4p) the same with Paddle's spelling (lossscale.paddle.GradScaler)
  keras       (5)  lossscale.keras.LossScaleOptimizer in a mindspore.jit step: get_scaled_loss, value_and_grad,
                   get_unscaled_gradients, apply_gradients
  automatic   (6)  as (2) with automatic loss scaling (get_preset("graphcore")): the rule that also counts the
                   gradients in the upper bin, against the dynamic rule's (2)
  with --release (needs this repository's git history):
  release     (2r) as (2), with lossscale 0.1.0 (benchmarks/release.py): what the redesign costs
  gradscaler_release (4r) as (4), with lossscale 0.1.0's GradScaler
"""

import argparse

import numpy as np
from common import LEVELS, MODELS, emit, first_call_seconds, make_inputs, make_network, rotating_rounds, summarise

# Every loss-scaling front-end, and MindSpore's own amp path, against the floor of an exact step; the front-ends
# against MindSpore's amp path too.
FRONT_ENDS = ("lossscale", "gradscaler", "gradscaler_paddle", "keras")
SCALING = (*FRONT_ENDS, "ms_jit")
BASELINES = [
    ("lossscale", "plain"),
    ("lossscale", "plain_if"),
    ("plain_if", "plain"),
    ("lossscale", "plain_wait"),
    ("plain_wait", "plain_if"),
    *((variant, "cheapest") for variant in SCALING),
    *((variant, "ms_jit") for variant in FRONT_ENDS),
    ("automatic", "lossscale"),
]


def _loss_fn():
    from mindspore import nn

    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _optimizer(network):
    from mindspore import nn

    return nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)


def build_plain(model, level):
    import mindspore as ms

    network = make_network(model)
    return ms.amp.build_train_network(network, _optimizer(network), _loss_fn(), level=level, loss_scale_manager=None)


def _under_if(model, level, wait_for_gradients):
    from mindspore import nn, ops

    class TrainOneStepUnderIf(nn.TrainOneStepCell):
        """nn.TrainOneStepCell with the optimizer under an `if` on a tensor (no scaling)."""

        def __init__(self, network, optimizer, wait):
            super().__init__(network, optimizer)
            self.wait = wait

        def construct(self, *inputs):
            loss = self.network(*inputs)
            sens = ops.fill(loss.dtype, loss.shape, self.sens)
            grads = self.grad(self.network, self.weights)(*inputs, sens)
            grads = self.grad_reducer(grads)
            condition = ops.isfinite(loss)
            if self.wait:
                condition = ops.depend(condition, grads)
            if condition:
                loss = ops.depend(loss, self.optimizer(grads))
            return loss

    plain = build_plain(model, level)
    return TrainOneStepUnderIf(plain.network, plain.optimizer, wait_for_gradients)


def build_plain_if(model, level):
    return _under_if(model, level, wait_for_gradients=False)


def build_plain_wait(model, level):
    return _under_if(model, level, wait_for_gradients=True)


def build_cheapest(model, level):
    """The floor of an exact loss-scaling step (variant 1e): nothing but what exactness needs."""
    import mindspore as ms
    from mindspore import Tensor, ops

    from lossscale.core.gradients import multiply_gradients, nonfinite_indicator

    plain = build_plain(model, level)
    optimizer = plain.optimizer
    scale, inverse, hyper_map = Tensor(2.0**16, ms.float32), Tensor(2.0**-16, ms.float32), ops.HyperMap()

    def scaled(loss):
        return loss * ops.cast(scale, loss.dtype)

    grad_fn = _scaled_grad_fn(scaled, plain)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        if ops.isfinite(nonfinite_indicator(hyper_map, grads)):
            loss = ops.depend(loss, optimizer(multiply_gradients(hyper_map, inverse, grads)))
        return loss

    return train_step


def build_lossscale(model, level):
    from lossscale import DynamicLossScaleManager, build_train_network

    network = make_network(model)
    return build_train_network(
        network,
        _optimizer(network),
        _loss_fn(),
        level=level,
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**16),
    )


def build_automatic(model, level):
    from lossscale import DynamicLossScaleManager, build_train_network, get_preset

    network = make_network(model)
    manager = DynamicLossScaleManager.from_policy(get_preset("graphcore", init_scale=2.0**16))
    return build_train_network(network, _optimizer(network), _loss_fn(), level=level, loss_scale_manager=manager)


def _scaled_grad_fn(scale_loss, plain):
    """value_and_grad of ``scale_loss(loss)`` with respect to the optimizer's parameters, on ``plain``'s network
    (a :func:`build_plain` step)."""
    import mindspore as ms

    network_with_loss = plain.network

    def forward(x, y):
        return scale_loss(network_with_loss(x, y))

    return ms.value_and_grad(forward, None, plain.optimizer.parameters)


def build_ms_jit(model, level):
    import mindspore as ms

    scaler = ms.amp.DynamicLossScaler(scale_value=2**16, scale_factor=2, scale_window=2000)
    plain = build_plain(model, level)
    grad_fn, optimizer = _scaled_grad_fn(scaler.scale, plain), plain.optimizer

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        loss = scaler.unscale(loss)
        finite = ms.amp.all_finite(grads)
        if finite:
            grads = scaler.unscale(grads)
            optimizer(grads)
        scaler.adjust(finite)
        return loss

    return train_step


def build_release(model, level):
    from release import materialise

    release = materialise()
    network = make_network(model)
    return release.build_train_network(
        network,
        _optimizer(network),
        _loss_fn(),
        level=level,
        loss_scale_manager=release.DynamicLossScaleManager(init_loss_scale=2**16),
    )


def _gradscaler_step(scaler, model, level):
    """A PyTorch-style compiled step with ``scaler`` (no unscale_ call)."""
    import mindspore as ms

    plain = build_plain(model, level)
    grad_fn, optimizer = _scaled_grad_fn(scaler.scale, plain), plain.optimizer

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        scaler.step(optimizer, grads)
        scaler.update()
        return loss

    return train_step


def build_gradscaler(model, level):
    from lossscale.torch import GradScaler

    return _gradscaler_step(GradScaler(init_scale=2.0**16), model, level)


def build_gradscaler_paddle(model, level):
    from lossscale.paddle import GradScaler

    return _gradscaler_step(GradScaler(init_loss_scaling=2.0**16), model, level)


def build_keras(model, level):
    import mindspore as ms

    from lossscale.keras import LossScaleOptimizer

    plain = build_plain(model, level)
    optimizer = LossScaleOptimizer(plain.optimizer, initial_scale=2.0**16)
    grad_fn = _scaled_grad_fn(optimizer.get_scaled_loss, plain)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer.apply_gradients(optimizer.get_unscaled_gradients(grads))
        return loss

    return train_step


def build_gradscaler_release(model, level):
    from release import materialise

    return _gradscaler_step(materialise().GradScaler(init_scale=2.0**16), model, level)


BUILDERS = {
    "plain": build_plain,
    "plain_if": build_plain_if,
    "plain_wait": build_plain_wait,
    "cheapest": build_cheapest,
    "lossscale": build_lossscale,
    "ms_jit": build_ms_jit,
    "gradscaler": build_gradscaler,
    "gradscaler_paddle": build_gradscaler_paddle,
    "keras": build_keras,
    "automatic": build_automatic,
}
# Against lossscale 0.1.0 (--release): needs this repository's git history (benchmarks/release.py).
RELEASE_BUILDERS = {"release": build_release, "gradscaler_release": build_gradscaler_release}
RELEASE_BASELINES = [("lossscale", "release"), ("gradscaler", "gradscaler_release")]


def warm_runtime():
    """Compile and run a tiny unrelated graph so one-time runtime start-up is not charged to a variant."""
    import numpy as np
    from mindspore import Tensor, nn

    nn.Dense(4, 2)(Tensor(np.ones((1, 4), np.float32))).asnumpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--level", choices=LEVELS, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--builds", type=int, default=3, help="fresh builds per variant for the first-call time")
    parser.add_argument("--release", action="store_true", help="also time lossscale 0.1.0 (needs git history)")
    args = parser.parse_args()
    builders = dict(BUILDERS, **RELEASE_BUILDERS) if args.release else BUILDERS
    baselines = BASELINES + RELEASE_BASELINES if args.release else BASELINES

    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    warm_runtime()
    inputs = make_inputs(args.model)
    variants, first_calls = {}, {name: [] for name in builders}
    names = list(builders)
    for build in range(args.builds):  # rotating order, like the step rounds; the last build is timed below
        for name in names[build % len(names) :] + names[: build % len(names)]:
            ms.set_seed(0)
            variants[name] = builders[name](args.model, args.level)
            first_calls[name].append(first_call_seconds(variants[name], inputs))
    first_call = {name: float(np.median(seconds)) for name, seconds in first_calls.items()}
    times = rotating_rounds(variants, inputs, args.rounds, args.steps, args.warmup)
    summary, ratios = summarise(times, baselines)
    payload = {
        "model": args.model,
        "level": args.level,
        "batch": MODELS[args.model],
        "summary": summary,
        "ratios": ratios,
        "first_call_s": first_call,
        "first_call_ratio": first_call["lossscale"] / first_call["plain"],
    }
    if args.release:
        payload["first_call_vs_release"] = first_call["lossscale"] / first_call["release"]
        payload["gradscaler_first_call_vs_release"] = first_call["gradscaler"] / first_call["gradscaler_release"]
    emit(payload)


if __name__ == "__main__":
    main()
