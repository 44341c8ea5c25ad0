"""What loss scaling costs in PyTorch itself: torch.amp.GradScaler against a plain step, on the benchmark MLP.

    python benchmarks/bench_torch.py            # needs torch (CPU); prints a table and a RESULT line

The same MLP as the other benchmarks (784-1024-1024-10, batch 128, SGD with momentum), float32 on the CPU
(PyTorch's CPU autocast is bfloat16, which needs no scaling). Variants, timed in rotating rounds by
``common.rotating_rounds``, each step waiting for its loss:

- ``torch_plain``: ``loss.backward(); optimizer.step()``;
- ``torch_gradscaler``: ``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`` with
  ``torch.amp.GradScaler("cpu")``.

Their paired ratio is PyTorch's cost of loss scaling, to set beside lossscale's (``ls/plain`` in run.py's
table). Steps of the two frameworks are not compared with each other: the kernels differ.
"""

import argparse
import json

import numpy as np
from common import rotating_rounds, summarise


def _step(torch, scaled):
    """A training step of the benchmark MLP; with ``scaled``, through ``torch.amp.GradScaler("cpu")``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu") if scaled else None
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.item()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    rng = np.random.RandomState(0)
    inputs = (torch.tensor(rng.rand(128, 784).astype(np.float32)), torch.tensor(rng.randint(0, 10, 128)))
    variants = {"torch_plain": _step(torch, False), "torch_gradscaler": _step(torch, True)}
    times = rotating_rounds(variants, inputs, args.rounds, args.steps, args.warmup)
    summary, ratios = summarise(times, [("torch_gradscaler", "torch_plain")])
    medians = {name: variant["median_ms"] for name, variant in summary.items()}
    paired = ratios["torch_gradscaler/torch_plain"]
    print(
        f"torch {torch.__version__}: plain {medians['torch_plain']:.2f} ms, GradScaler "
        f"{medians['torch_gradscaler']:.2f} ms, paired ratio {paired:.3f}"
    )
    print("RESULT " + json.dumps({"torch": torch.__version__, "median_ms": medians, "gradscaler/plain": paired}))


if __name__ == "__main__":
    main()
