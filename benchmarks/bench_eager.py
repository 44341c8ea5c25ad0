"""The functional front-ends called from Python in PyNative mode (MindSpore's default), MLP, one process.

    python benchmarks/bench_eager.py [--level O0 --rounds 8 --steps 10 --warmup 3 --builds 3]
    python benchmarks/bench_eager.py --release [--ref ed60d3f]    # also an earlier lossscale, side by side

Variants (each step: value_and_grad of the scaled loss, then the front-end's calls, no mindspore.jit):
  plain               value_and_grad and the optimizer, no loss scaling
  ms_eager            MindSpore's functional recipe: amp.DynamicLossScaler + amp.all_finite
  gradscaler          lossscale.GradScaler: step, update
  gradscaler_unscale  lossscale.GradScaler: unscale_, step, update (PyTorch's clipping recipe without the clip)
  keras               lossscale.LossScaleOptimizer: get_scaled_loss, get_unscaled_gradients, apply_gradients
  with --release: the three lossscale variants again with lossscale at --ref (suffix _release)

Prints a table (median step time and interquartile range, paired ratio to plain, first call: compile and
first step, median of fresh builds) and a RESULT line.
"""

import argparse
import sys

import numpy as np
from bench_step import build_plain
from common import emit, first_call_seconds, make_inputs, rotating_rounds, summarise


def _network_and_optimizer(level):
    plain = build_plain("mlp", level)
    return plain.network, plain.optimizer


def build_plain_eager(level, package=None):
    import mindspore as ms

    network, optimizer = _network_and_optimizer(level)

    def forward(x, y):
        return network(x, y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    return step


def build_ms_eager(level, package=None):
    import mindspore as ms

    network, optimizer = _network_and_optimizer(level)
    scaler = ms.amp.DynamicLossScaler(scale_value=2**16, scale_factor=2, scale_window=2000)

    def forward(x, y):
        return scaler.scale(network(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        loss = scaler.unscale(loss)
        finite = ms.amp.all_finite(grads)
        if finite:
            optimizer(scaler.unscale(grads))
        scaler.adjust(finite)
        return loss

    return step


def _gradscaler(level, package, unscale):
    import mindspore as ms

    network, optimizer = _network_and_optimizer(level)
    scaler = package.GradScaler(init_scale=2.0**16)

    def forward(x, y):
        return scaler.scale(network(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        if unscale:
            grads = scaler.unscale_(grads)
        scaler.step(optimizer, grads)
        scaler.update()
        return loss

    return step


def build_gradscaler(level, package):
    return _gradscaler(level, package, unscale=False)


def build_gradscaler_unscale(level, package):
    return _gradscaler(level, package, unscale=True)


def build_keras(level, package):
    import mindspore as ms

    network, optimizer = _network_and_optimizer(level)
    wrapper = package.LossScaleOptimizer(optimizer)

    def forward(x, y):
        return wrapper.get_scaled_loss(network(x, y))

    grad_fn = ms.value_and_grad(forward, None, wrapper.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        wrapper.apply_gradients(wrapper.get_unscaled_gradients(grads))
        return loss

    return step


BUILDERS = {
    "plain": build_plain_eager,
    "ms_eager": build_ms_eager,
    "gradscaler": build_gradscaler,
    "gradscaler_unscale": build_gradscaler_unscale,
    "keras": build_keras,
}
OURS = ("gradscaler", "gradscaler_unscale", "keras")


def table(result):
    summary, ratios, first = result["summary"], result["ratios"], result["first_call_s"]
    lines = [f"{'variant':<28}{'step ms':>10}{'IQR':>8}{'/plain':>8}{'first call s':>14}", "-" * 68]
    for name in summary:
        ratio = ratios.get(f"{name}/plain", 1.0)
        lines.append(
            f"{name:<28}{summary[name]['median_ms']:>10.2f}{summary[name]['iqr_ms']:>8.2f}{ratio:>8.3f}"
            f"{first[name]:>14.2f}"
        )
    for name, value in ratios.items():
        if name.endswith("_release"):
            lines.append(f"{name}: {value:.3f} (paired step ratio)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="O0", choices=("O0", "O2", "O3"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--builds", type=int, default=3, help="fresh builds per variant for the first-call time")
    parser.add_argument("--release", action="store_true", help="also time lossscale at --ref (needs git history)")
    parser.add_argument("--ref", default=None, help="the earlier revision for --release (default: 0.1.0)")
    args = parser.parse_args()

    import mindspore as ms

    import lossscale

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    builders = {name: (build, lossscale) for name, build in BUILDERS.items()}
    if args.release:
        from release import RELEASE_0_1_0, materialise

        earlier = materialise(args.ref or RELEASE_0_1_0)
        builders.update({f"{name}_release": (BUILDERS[name], earlier) for name in OURS})
    inputs = make_inputs("mlp")
    first_calls, steps = {name: [] for name in builders}, {}
    names = list(builders)
    for build in range(args.builds):
        for name in names[build % len(names) :] + names[: build % len(names)]:
            ms.set_seed(0)
            function, package = builders[name]
            steps[name] = function(args.level, package)
            first_calls[name].append(first_call_seconds(steps[name], inputs))
    times = rotating_rounds(steps, inputs, args.rounds, args.steps, args.warmup)
    baselines = [(name, "plain") for name in names if name != "plain"]
    baselines += [(name, f"{name}_release") for name in OURS if f"{name}_release" in builders]
    summary, ratios = summarise(times, baselines)
    result = {
        "level": args.level,
        "summary": summary,
        "ratios": ratios,
        "first_call_s": {name: float(np.median(seconds)) for name, seconds in first_calls.items()},
    }
    print(table(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
