"""What a compiled step's first call is made of: a knock-out ladder (MLP, one process).

    python benchmarks/bench_first_call_ladder.py [--step gradscaler|train_cell] [--level O0 --rounds 7] [--no-release]

Each variant is one of the benchmark's steps with features of the current code knocked out by replacing
functions in this process only, so the variants measure what a feature costs to compile. They are
measurements, not configurations: a knocked-out step trains wrongly in the cases its feature exists for.

``--step gradscaler`` (the default): the benchmark's ``gradscaler`` step in ``mindspore.jit`` (``scale``,
``value_and_grad``, ``step``, ``update``; no ``unscale_``):

  0.1.0                        lossscale 0.1.0's GradScaler (benchmarks/release.py; needs git history)
  current                      the current GradScaler
  - runtime raises             no graph ``raise`` for a misused step() or an update() without checks
  - after-unscale_ branch      step() compiles only its "no unscale_ this iteration" branch (inside a compiled
                               function the stage is read at run time, so both branches are compiled)
  - rule in Parameters         the rule as graph constants (setters then cannot reach a compiled step)
  - non-finite loss term       scale() multiplies by S alone (a non-finite loss with finite gradients applies)
  - all four                   every knock-out above at once

``--step train_cell``: the benchmark's ``lossscale`` step (``build_train_network`` with a
``DynamicLossScaleManager``):

  0.1.0                        lossscale 0.1.0's train cell
  current                      the current train cell
  - non-finite loss flag       a non-finite loss with finite gradients no longer counts as an overflow
  - overflow counters          no step / skipped / consecutive-overflow counters
  - MindSpore's update cell    ``nn.DynamicLossScaleUpdateCell`` instead of ours (no hysteresis, no
                               min/max scale, growth to inf)
  - all three                  every knock-out above at once

Each round builds every variant afresh, in rotating order, and times its first call (compile and first step);
the table gives the median over rounds and the ratio to 0.1.0 (or to the current code with --no-release).
"""

import argparse
import statistics
import sys

import mindspore as ms
from bench_step import _gradscaler_step, build_lossscale, build_release, warm_runtime
from common import first_call_seconds, make_inputs


def _replacing(originals, ladder):
    """``(ladder, restore)``, ``restore`` a callable putting ``originals`` (``{(owner, name): value}``) back."""

    def restore():
        for (owner, name), value in originals.items():
            setattr(owner, name, value)

    return ladder, restore


def _train_cell_knock_outs():
    """The train cell's ladder (see the module docstring), as :func:`_gradscaler_knock_outs`."""
    import mindspore as ms

    from lossscale.training import bookkeeping, managers, train_cell

    originals = {
        (train_cell, "_with_loss_flag"): train_cell._with_loss_flag,
        (bookkeeping.OverflowCounters, "count"): bookkeeping.OverflowCounters.__dict__["count"],
        (managers.DynamicLossScaleManager, "get_update_cell"): managers.DynamicLossScaleManager.__dict__[
            "get_update_cell"
        ],
    }

    def flag_without_loss(loss_scaler, drop_overflow_update, flag, loss):
        return flag

    def no_counting(self, overflow, drops_overflow):
        return overflow

    def mindspore_update_cell(self):
        return ms.nn.DynamicLossScaleUpdateCell(self.get_loss_scale(), self.scale_factor, self.scale_window)

    loss_flag = {(train_cell, "_with_loss_flag"): flag_without_loss}
    counters = {(bookkeeping.OverflowCounters, "count"): no_counting}
    update_cell = {(managers.DynamicLossScaleManager, "get_update_cell"): mindspore_update_cell}
    ladder = {
        "current": {},
        "- non-finite loss flag": loss_flag,
        "- overflow counters": counters,
        "- MindSpore's update cell": update_cell,
        "- all three": {**loss_flag, **counters, **update_cell},
    }
    return _replacing(originals, ladder)


def _gradscaler_knock_outs():
    """``{name: {function slot: replacement}}`` and a ``restore`` callable putting the originals back."""
    from lossscale.core import scaler
    from lossscale.frontends import grad_scaler, iteration
    from lossscale.frontends.optimizer_states import OptimizerStates

    originals = {
        (grad_scaler, "raise_step_misuse"): grad_scaler.raise_step_misuse,
        (OptimizerStates, "refuse_update_without_checks"): OptimizerStates.refuse_update_without_checks,
        (iteration.IterationGraph, "step_decision"): iteration.IterationGraph.step_decision,
        (grad_scaler, "LossScaler"): grad_scaler.LossScaler,
        (scaler.LossScaler, "set_rule"): scaler.LossScaler.set_rule,
        (scaler, "_scale_tree"): scaler._scale_tree,
    }
    step_decision = originals[(iteration.IterationGraph, "step_decision")]

    # Named functions, not lambdas: MindSpore's parser needs a lambda on a line of its own.
    def scale_tree_times_s(scale, tree, before_backward):
        if isinstance(tree, (tuple, list)):
            return type(tree)(scale_tree_times_s(scale, item, before_backward) for item in tree)
        loss = before_backward(tree)
        if loss.dtype in (ms.float16, ms.bfloat16):
            loss = ms.ops.cast(loss, ms.float32)
        return loss * ms.ops.cast(scale, loss.dtype)

    def no_step_raise(code):
        return code

    def no_update_raise(self):
        return self.table

    def only_the_usual_branch(self, grads, slot, structure, after_unscale=None):
        return step_decision(self, grads, slot, structure, False if after_unscale is None else after_unscale)

    def constant_rule_core(*args, mutable_rule=False, **kwargs):
        return originals[(grad_scaler, "LossScaler")](*args, mutable_rule=False, **kwargs)

    def no_rule_change(self, *args, **kwargs):
        return None

    raises = {
        (grad_scaler, "raise_step_misuse"): no_step_raise,
        (OptimizerStates, "refuse_update_without_checks"): no_update_raise,
    }
    branch = {(iteration.IterationGraph, "step_decision"): only_the_usual_branch}
    constants = {(grad_scaler, "LossScaler"): constant_rule_core, (scaler.LossScaler, "set_rule"): no_rule_change}
    loss_term = {(scaler, "_scale_tree"): scale_tree_times_s}
    ladder = {
        "current": {},
        "- runtime raises": raises,
        "- after-unscale_ branch": branch,
        "- rule in Parameters": constants,
        "- non-finite loss term": loss_term,
        "- all four": {**raises, **branch, **constants, **loss_term},
    }
    return _replacing(originals, ladder)


def _apply(replacements):
    for (owner, name), value in replacements.items():
        setattr(owner, name, value)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--step", choices=("gradscaler", "train_cell"), default="gradscaler")
    parser.add_argument("--level", choices=("O0", "O2", "O3"), default="O0")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-release", action="store_true", help="without lossscale 0.1.0 (no git needed)")
    args = parser.parse_args()

    import mindspore as ms

    from lossscale import GradScaler

    ms.set_context(mode=ms.GRAPH_MODE)
    warm_runtime()
    if args.step == "gradscaler":
        ladder, restore = _gradscaler_knock_outs()

        def build():
            return _gradscaler_step(GradScaler(init_scale=2.0**16), "mlp", args.level)

        def build_release_step():
            from release import materialise

            return _gradscaler_step(materialise().GradScaler(init_scale=2.0**16), "mlp", args.level)
    else:
        ladder, restore = _train_cell_knock_outs()

        def build():
            return build_lossscale("mlp", args.level)

        def build_release_step():
            return build_release("mlp", args.level)

    builders = {} if args.no_release else {"0.1.0": build_release_step}
    for name, replacements in ladder.items():
        builders[name] = lambda replacements=replacements: (_apply(replacements), build())[1]
    inputs = make_inputs("mlp")
    seconds = {name: [] for name in builders}
    names = list(builders)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            step = builders[name]()
            seconds[name].append(first_call_seconds(step, inputs))
            restore()  # a knock-out lives only while its own step compiles
    base_name = "current" if args.no_release else "0.1.0"
    base = statistics.median(seconds[base_name])
    print(f"| {args.step} variant (mlp {args.level}, {args.rounds} builds each) | first call s | / {base_name} |")
    print("|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {statistics.median(values):.3f} | {statistics.median(values) / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
