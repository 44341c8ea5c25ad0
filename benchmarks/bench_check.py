"""Check-only micro-benchmark: lossscale's overflow check vs mindspore.amp.all_finite.

    python benchmarks/bench_check.py [--rounds 10 --steps 20]

On the gradient shapes of the MLP 784-1024-1024-10 and LeNet5, in float32 and float16. Each
call is synchronised on its output; the variants are interleaved in rotating order.

The gradients are passed as ``mindspore.mutable`` tuples. A plain tuple of Tensors is a
compile-time constant in graph mode: MindSpore folds the whole check away and the call only
measures dispatch (an earlier version of this file did that and reported 0.11 ms).
"""

import argparse

import numpy as np
from common import emit, make_network, rotating_rounds, summarise


def gradients(model, dtype, seed=0):
    from mindspore import Tensor

    rng = np.random.RandomState(seed)
    shapes = [p.shape for p in make_network(model).trainable_params()]
    return tuple(Tensor((rng.randn(*shape) * 1e-3).astype(dtype)) for shape in shapes)


def checks():
    import mindspore as ms
    from mindspore import nn, ops

    from lossscale.core.gradients import nonfinite_indicator

    class Ours(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hyper_map = ops.HyperMap()

        def construct(self, grads):
            return ops.isfinite(nonfinite_indicator(self.hyper_map, grads))

    class MindSporeAllFinite(nn.Cell):
        def construct(self, grads):
            return ms.amp.all_finite(grads)

    return {"lossscale": Ours(), "all_finite": MindSporeAllFinite()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    results = []
    for model in ("mlp", "lenet5"):
        for dtype in (np.float32, np.float16):
            grads = gradients(model, dtype)
            variants = checks()

            class Call:
                """Adapts a check cell to the (inputs) calling convention of the timing helpers."""

                def __init__(self, cell):
                    self.cell = cell

                def __call__(self, *inputs):
                    return self.cell(ms.mutable(inputs))

            wrapped = {name: Call(cell) for name, cell in variants.items()}
            bad = tuple(g if i else ms.Tensor(np.full(g.shape, np.nan, dtype)) for i, g in enumerate(grads))
            agree = {
                name: (bool(cell(ms.mutable(grads)).asnumpy()), bool(cell(ms.mutable(bad)).asnumpy()))
                for name, cell in variants.items()
            }
            times = rotating_rounds(wrapped, grads, args.rounds, args.steps, args.warmup)
            summary, ratios = summarise(times, [("all_finite", "lossscale")])
            results.append(
                {
                    "model": model,
                    "dtype": np.dtype(dtype).name,
                    "summary": summary,
                    "speedup": ratios["all_finite/lossscale"],
                    "finite_then_nan": agree,
                }
            )
    emit({"checks": results})


if __name__ == "__main__":
    main()
