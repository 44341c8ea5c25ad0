"""What the GradScaler's first call inside ``mindspore.jit`` is made of: a knock-out ladder (MLP, one process).

    python benchmarks/bench_first_call_ladder.py [--level O0 --rounds 7] [--no-release]

Each variant is the benchmark's ``gradscaler`` step (``scale``, ``value_and_grad``, ``step``, ``update``; no
``unscale_``) with features of the current code knocked out by replacing functions in this process only, so
the variants measure what a feature costs to compile. They are measurements, not configurations: a knocked-out
scaler trains wrongly in the cases its feature exists for.

  0.1.0                        lossscale 0.1.0's GradScaler (benchmarks/release.py; needs git history)
  current                      the current GradScaler
  - runtime raises             no graph ``raise`` for a misused step() or an update() without checks
  - after-unscale_ branch      step() compiles only its "no unscale_ this iteration" branch (inside a compiled
                               function the stage is read at run time, so both branches are compiled)
  - rule in Parameters         the rule as graph constants (setters then cannot reach a compiled step)
  - non-finite loss term       scale() multiplies by S alone (a non-finite loss with finite gradients applies)
  - all four                   every knock-out above at once

Each round builds every variant afresh, in rotating order, and times its first call (compile and first step);
the table gives the median over rounds and the ratio to 0.1.0 (or to the current code with --no-release).
"""
import argparse
import statistics
import sys

from bench_step import _gradscaler_step, warm_runtime
from common import first_call_seconds, make_inputs


def _knock_outs():
    """``{name: {function slot: replacement}}`` and a ``restore`` callable putting the originals back."""
    from lossscale import grad_scaler, scaler
    from lossscale.optimizer_states import OptimizerStates

    originals = {(OptimizerStates, "raise_step_misuse"): OptimizerStates.__dict__["raise_step_misuse"],
                 (OptimizerStates, "refuse_update_without_checks"): OptimizerStates.refuse_update_without_checks,
                 (grad_scaler._IterationGraph, "step_decision"): grad_scaler._IterationGraph.step_decision,
                 (grad_scaler, "LossScaler"): grad_scaler.LossScaler,
                 (scaler.LossScaler, "set_rule"): scaler.LossScaler.set_rule,
                 (scaler, "_scale_tree"): scaler._scale_tree}
    step_decision = originals[(grad_scaler._IterationGraph, "step_decision")]

    # Named functions, not lambdas: MindSpore's parser needs a lambda on a line of its own.
    def scale_tree_times_s(scale, tree, before_backward):
        if isinstance(tree, (tuple, list)):
            return type(tree)(scale_tree_times_s(scale, item, before_backward) for item in tree)
        return scaler._promote(scale, before_backward(tree))

    def no_step_raise(code):
        return code

    def no_update_raise(self):
        return self.table

    def only_the_usual_branch(self, grads, slot, structure, after_unscale=None):
        return step_decision(self, grads, slot, structure, False if after_unscale is None else after_unscale)

    def constant_rule_core(*args, mutable_rule=False, **kwargs):  # pylint: disable=unused-argument
        return originals[(grad_scaler, "LossScaler")](*args, mutable_rule=False, **kwargs)

    def no_rule_change(self, *args, **kwargs):  # pylint: disable=unused-argument
        return None

    raises = {(OptimizerStates, "raise_step_misuse"): staticmethod(no_step_raise),
              (OptimizerStates, "refuse_update_without_checks"): no_update_raise}
    branch = {(grad_scaler._IterationGraph, "step_decision"): only_the_usual_branch}
    constants = {(grad_scaler, "LossScaler"): constant_rule_core, (scaler.LossScaler, "set_rule"): no_rule_change}
    loss_term = {(scaler, "_scale_tree"): scale_tree_times_s}
    ladder = {"current": {}, "- runtime raises": raises, "- after-unscale_ branch": branch,
              "- rule in Parameters": constants, "- non-finite loss term": loss_term,
              "- all four": {**raises, **branch, **constants, **loss_term}}

    def restore():
        for (owner, name), value in originals.items():
            setattr(owner, name, value)

    return ladder, restore


def _apply(replacements):
    for (owner, name), value in replacements.items():
        setattr(owner, name, value)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--level", choices=("O0", "O2", "O3"), default="O0")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-release", action="store_true", help="without lossscale 0.1.0 (no git needed)")
    args = parser.parse_args()

    import mindspore as ms
    from lossscale import GradScaler

    ms.set_context(mode=ms.GRAPH_MODE)
    warm_runtime()
    ladder, restore = _knock_outs()
    builders = {}
    if not args.no_release:
        from release import materialise

        release_class = materialise().GradScaler
        builders["0.1.0"] = lambda: _gradscaler_step(release_class, "mlp", args.level)
    for name, replacements in ladder.items():
        builders[name] = lambda replacements=replacements: (
            _apply(replacements), _gradscaler_step(GradScaler, "mlp", args.level))[1]
    inputs = make_inputs("mlp")
    seconds = {name: [] for name in builders}
    names = list(builders)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            step = builders[name]()
            seconds[name].append(first_call_seconds(step, inputs))
            restore()  # a knock-out lives only while its own step compiles
    base_name = "current" if args.no_release else "0.1.0"
    base = statistics.median(seconds[base_name])
    print(f"| variant (mlp {args.level}, {args.rounds} builds each) | first call s | / {base_name} |")
    print("|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {statistics.median(values):.3f} | {statistics.median(values) / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
