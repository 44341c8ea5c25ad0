"""What writing BatchNorm running statistics back on a skipped step costs (lossscale.training.running_statistics).

    python benchmarks/bench_running_statistics.py [--rounds 10 --steps 20 --builds 3]

SmallResNet (the repository's models/: stem conv + 2 residual blocks, 16 channels, 5 BatchNorm layers)
at batch 64 on 1x8x8, with Momentum and a dynamic loss scale, in O0 and O2 (BatchNorm kept float32).
Variants, interleaved in rotating order in one process (benchmarks/common.py):

- **guarded**: ``lossscale.build_train_network`` as released (saves the statistics before the forward
  pass, writes them back when the step is skipped);
- **unguarded**: the same cell with ``running_statistics = None`` set before its first call (the graph
  without the guard);
- **plain**: MindSpore's ``nn.TrainOneStepCell`` (no loss scaling), for scale.

Prints median step time, the paired ratio guarded/unguarded, and the median first call (compile and
first step) of ``--builds`` fresh builds per variant.
"""

import argparse

import numpy as np
from common import first_call_seconds, rotating_rounds, summarise

BATCH = 64


def _inputs():
    from mindspore import Tensor

    rng = np.random.RandomState(0)
    return (Tensor(rng.rand(BATCH, 1, 8, 8).astype(np.float32)), Tensor(rng.randint(0, 10, BATCH).astype(np.int32)))


def build(variant, level):
    import mindspore as ms
    from mindspore import nn

    from lossscale import DynamicLossScaleManager, build_train_network
    from lossscale_models.networks import SmallResNet

    network = SmallResNet()
    optimizer = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if variant == "plain":
        step = ms.amp.build_train_network(network, optimizer, loss_fn, level=level, loss_scale_manager=None)
    else:
        step = build_train_network(
            network, optimizer, loss_fn, level=level, loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**16)
        )
        assert step.running_statistics is not None
        if variant == "unguarded":
            step.running_statistics = None
    step.set_train()
    return step


def main():
    import mindspore as ms

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--builds", type=int, default=3)
    parser.add_argument("--levels", nargs="+", default=["O0", "O2"])
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    inputs = _inputs()
    names = ("guarded", "unguarded", "plain")
    print("| level | guarded ms | unguarded ms | plain ms | guarded/unguarded | first call: guarded / unguarded s |")
    print("|---|---|---|---|---|---|")
    for level in args.levels:
        first = {name: [] for name in names}
        for b in range(args.builds):
            for name in names[b % 3 :] + names[: b % 3]:
                first[name].append(first_call_seconds(build(name, level), inputs))
        variants = {name: build(name, level) for name in names}
        times = rotating_rounds(variants, inputs, args.rounds, args.steps, warmup=10)
        summary, ratios = summarise(times, [("guarded", "unguarded")])
        print(
            f"| {level} | {summary['guarded']['median_ms']:.2f} | {summary['unguarded']['median_ms']:.2f} | "
            f"{summary['plain']['median_ms']:.2f} | {ratios['guarded/unguarded']:.3f} | "
            f"{np.median(first['guarded']):.2f} / {np.median(first['unguarded']):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
