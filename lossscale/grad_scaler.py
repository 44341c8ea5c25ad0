"""``GradScaler``: Paddle's and PyTorch's loss-scaling front-ends for functional MindSpore training.

Both translate their framework's API onto the :class:`lossscale.scaler.LossScaler` core and
PyTorch's per-optimizer state machine (:mod:`lossscale.optimizer_states`); every number they
keep (the scale, the rule, the counters, each optimizer's stage and overflow flag) is a
Parameter, so a step compiled with ``mindspore.jit`` and eager calls share one state, and
setters or ``load_state_dict()`` reach steps compiled before them.

- ``GradScaler(...)`` with Paddle's arguments, or none: Paddle's ``paddle.amp.GradScaler``
  (defaults 2**15, x2, x0.5, 1000 clean steps, back off after 2 consecutive bad steps).
- ``GradScaler(...)`` with PyTorch's arguments (``device`` as a str first argument,
  ``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``enabled``)
  returns a :class:`TorchGradScaler`: ``torch.amp.GradScaler``'s defaults (2**16, x2, x0.5,
  2000) and rule (back off on every overflow, no floor).

Typical iteration (MindSpore has no ``.grad``: gradients are passed and returned)::

    scaler = GradScaler("cuda")                     # or GradScaler(init_loss_scaling=1024)
    def forward(x, y):
        return scaler.scale(loss_fn(net(x), y))
    grad_fn = mindspore.value_and_grad(forward, None, optimizer.parameters)

    @mindspore.jit                                 # optional: compile the whole step
    def train_step(x, y):
        scaled_loss, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads)              # optional: only to clip or inspect
        grads = ops.clip_by_global_norm(grads, 1.0)
        scaler.step(optimizer, grads)               # skipped if unscale_ found inf/nan
        scaler.update()                             # once per iteration
        return scaled_loss

Misuse is refused before anything is applied: eagerly with a normal exception; inside
``mindspore.jit`` with a runtime ``raise`` that MindSpore, which runs compiled graphs
asynchronously, reports at the next host read of a tensor (the returned gradients or skip
flag, the loss, ``get_scale()``); nothing after the refusal in that call runs.

Per-method host syncs: none for ``scale``, ``unscale_``, ``step``, ``update`` and
``minimize`` inside ``mindspore.jit``. Called from Python, ``unscale_``, ``step`` and
``update`` each run their graph part as one compiled graph (compiled at the first call per
gradient structure, 0.1-0.4 s each; :mod:`lossscale._eager_calls`) and read scalars to raise
a refusal or branch: ``unscale_`` the optimizer's stage, ``step`` that stage (so only the branch
it takes is compiled) and its skip decision (like PyTorch's ``step``), PyTorch's ``update``
whether anything was checked. ``get_scale`` and
``get_loss_scaling`` read the device when called eagerly (inside ``mindspore.jit`` they are graph
reads, no sync); ``get_state`` and ``state_dict`` read the device; setters and
``load_state_dict`` write it. In a parallel mode (data parallel under ``msrun``) ``unscale_``,
``step`` and ``update`` each all-reduce one float32 scalar, so every rank takes the same
decision, also when a loss is non-finite on one rank only; the gradients themselves are
reduced by the user (e.g. ``nn.DistributedGradReducer``), before ``unscale_`` or ``step``.

"Skip" means the optimizer is not called: no weight, moment or ``global_step`` changes, so a
learning-rate schedule indexed by the optimizer's step (a MindSpore ``nn`` optimizer's) does not
advance; a scheduler stepped from Python every iteration advances anyway, as in PyTorch.
"""
import inspect
from collections.abc import Mapping

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale import overflow as _overflow
from lossscale._eager_calls import CompiledCalls
from lossscale._naming import claim_name, free_name
from lossscale._parameters import outside_graph
from lossscale._validation import AssertionValueError, check_bool, check_finite_in_range, check_int_in_range
from lossscale.clipping import global_norm
from lossscale.optimizer_states import STAGE, OptimizerStates
from lossscale.policy import LossScalePolicy, LossScaleState, build_policy, check_state
from lossscale.presets import PRESET_NAMES, get_preset
from lossscale.scaler import LossScaler, positive_scale, refuse_bfloat16_on_cpu, refuse_non_gradients

PADDLE_DEFAULTS = {"enable": True, "init_loss_scaling": 32768.0, "incr_ratio": 2.0, "decr_ratio": 0.5,
                   "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2, "use_dynamic_loss_scaling": True}
TORCH_DEFAULTS = {"device": "cuda", "init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 2000, "enabled": True}
_PADDLE_FIELDS = {"init_scale": "init_loss_scaling", "growth_factor": "incr_ratio", "backoff_factor": "decr_ratio",
                  "growth_interval": "incr_every_n_steps", "hysteresis": "decr_every_n_nan_or_inf"}
_TORCH_FIELDS = {"init_scale": "init_scale", "growth_factor": "growth_factor", "backoff_factor": "backoff_factor",
                 "growth_interval": "growth_interval", "hysteresis": "hysteresis"}
_PADDLE_STATE_KEYS = ("scale", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
                      "incr_count", "decr_count", "use_dynamic_loss_scaling")
_TORCH_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_HYSTERESIS_FLAGS = ("consecutive_hysteresis", "refill_hysteresis_on_backoff")
# Ours, only for a rule with hysteresis (PyTorch's has none; PyTorch's load_state_dict ignores other keys).
_TORCH_HYSTERESIS_KEYS = ("hysteresis", "_hysteresis_tracker") + _HYSTERESIS_FLAGS


def _hysteresis_flags(policy):
    """How ``policy``'s hysteresis works, as state-dict keys."""
    return {flag: getattr(policy, flag) for flag in _HYSTERESIS_FLAGS}


_PADDLE_HYSTERESIS = _hysteresis_flags(get_preset("paddle"))


def _framework_rule(fields, names, base):
    """``base`` (a LossScalePolicy) with ``fields`` replaced; range errors raised as AssertionValueError,
    since PyTorch and Paddle assert on their factors; errors name the caller's spelling."""
    for field, value in fields.items():
        if value is None:  # the frameworks have no "derive it" value: None is a type error there
            raise TypeError(f"'{names.get(field, field)}' must be a number, but got None.")
    values = dict(vars(base), **fields)
    try:
        return build_policy(names, **values)
    except ValueError as error:
        raise AssertionValueError(str(error)) from None


def _as_policy(policy):
    """A LossScalePolicy from ``policy`` (a policy or a preset name)."""
    if isinstance(policy, str):
        return get_preset(policy)
    if not isinstance(policy, LossScalePolicy):
        raise TypeError(f"'policy' must be a LossScalePolicy or a preset name in {PRESET_NAMES}, but got "
                        f"{type(policy).__name__}.")
    return policy


def _spelling(args, kwargs):
    """``"torch"`` or ``"paddle"`` for GradScaler(*args, **kwargs); ValueError when both are mixed."""
    torch = [name for name in kwargs if name in TORCH_DEFAULTS]
    paddle = [name for name in kwargs if name in PADDLE_DEFAULTS]
    if args:
        (torch if isinstance(args[0], str) else paddle).append("a first positional argument of type "
                                                                f"{type(args[0]).__name__}")
    if torch and paddle:
        raise ValueError(f"GradScaler got PyTorch's spelling ({', '.join(torch)}) and Paddle's ({', '.join(paddle)}) "
                         f"together: give one framework's arguments, e.g. enabled= (PyTorch) or enable= (Paddle).")
    return "torch" if torch else "paddle"


@constexpr
def _refuse_loss_scale_optimizer():
    raise TypeError("'optimizer' is a LossScaleOptimizer, which scales the loss and unscales the gradients itself: "
                    "give the GradScaler its inner_optimizer, or train with the LossScaleOptimizer alone.")


@constexpr
def _refuse_optimizer_loss_scale(loss_scale):
    if float(loss_scale) != 1.0:
        raise ValueError(f"'optimizer.loss_scale' is {float(loss_scale)!r}: the optimizer would divide the gradients "
                         f"the scaler already unscaled a second time. Build it without 'loss_scale'.")
    return True


@constexpr
def _refuse_optimizer_without_parameters():
    raise TypeError("'optimizer' must hold its Parameters in 'parameters', as mindspore.nn.Optimizer and the "
                    "mindspore.experimental.optim / mint.optim optimizers do (and MindSpore's train cells need): step() "
                    "checks the gradients against them. Give your optimizer Cell a 'parameters' tuple.")


@constexpr
def _checked_new_scale(value, low, high):
    """update(new_scale) with a number (or, called from Python, a Tensor): finite, > 0 with a finite reciprocal,
    and within the rule's bounds ``[low, high]`` (``(0, high]`` when ``low`` is 0); a float32 Tensor."""
    scale = float(positive_scale("new_scale", value))
    check_finite_in_range("new_scale", scale, low=low, high=high, low_inclusive=low > 0)
    return Tensor(scale, mstype.float32)


@constexpr
def _refuse_host_call_in_graph(method, from_python):
    """RuntimeError while tracing a compiled function that calls a host method (``from_python`` False)."""
    if not from_python:
        raise RuntimeError(f"GradScaler.{method} reads or writes the scaler's state from Python (a host call): call it "
                           f"outside mindspore.jit, between iterations. Steps compiled before it see what it "
                           f"changes; inside a compiled function read the scale with get_scale().")
    return True


@constexpr
def _refuse_new_scale_shape(shape):
    if int(np.prod(shape)) != 1:
        raise TypeError(f"'new_scale' must be one float value, but got a Tensor of shape {tuple(shape)}.")
    return True


def _new_scale_in_graph(value, low, high):
    """update(new_scale) with a Tensor inside a compiled function: its value is known only when the graph runs,
    so the checks of :func:`_checked_new_scale` are graph ops (a refusal is a runtime ``raise``)."""
    _refuse_new_scale_shape(ops.shape(value))
    value = ops.cast(value, mstype.float32).reshape(())
    valid = ops.logical_and(ops.isfinite(value), ops.isfinite(ops.reciprocal(value)))
    valid = ops.logical_and(valid, ops.logical_and(value > 0.0, value <= high))
    valid = ops.logical_and(valid, value >= low)
    if ops.logical_not(valid):
        raise ValueError(f"'new_scale' must be a finite float32 number in [{low}, {high}] (and > 0) whose "
                         f"reciprocal is finite.")
    return value


@ms.jit_class
class _IterationGraph:
    """The graph part of the GradScaler's calls: unscale and record, decide a step, update from the checks.

    Kept apart from the scaler so that the compiled versions of these methods, which the scaler
    keeps (:mod:`lossscale._eager_calls`), hold this object and not the scaler: MindSpore keeps
    what a compiled Cell uses alive while the Cell lives, so through the scaler that would be a
    cycle that no garbage collection breaks (measured: the scaler and its name were never freed).

    Args:
        core (LossScaler), states (OptimizerStates): the scaler's.
    """

    def __init__(self, core, states):
        self._core = core
        self._states = states
        self._hyper_map = ops.HyperMap()

    def unscale_and_record(self, grads, slot, structure):
        """``(grads / S, the slot's stage before)``; records the unscale only if that stage was READY (else
        the caller refuses it and nothing has changed)."""
        column = self._states.column(slot)
        seen = _overflow.fingerprint(self._hyper_map, grads)
        unscaled = self._core.unscale(grads)
        recorded = self._states.record_unscale(slot, column, self.decide(unscaled), seen, structure,
                                               global_norm(self._hyper_map, unscaled))
        return ops.depend(unscaled, recorded), ops.depend(column[STAGE], recorded)

    def decide(self, unscaled):
        """float32 0/1: these unscaled gradients overflowed on some rank (the core all-reduces the flag in
        parallel modes, so a loss that is non-finite on one rank only skips the step on every rank)."""
        return ops.cast(self._core.is_overflow(self._core.flag(None, unscaled)), mstype.float32)

    def step_decision(self, grads, slot, structure, after_unscale=None):
        """``(the gradients to apply, skipped, refusal code)`` for step(), with the step recorded unless
        refused (code != 0). ``after_unscale``: whether the slot is UNSCALED, when the caller read it on the
        host (a constant: only that branch is compiled); None reads it in the graph."""
        column = self._states.column(slot)
        if after_unscale is None:
            after_unscale = self._states.unscaled(column)
        if after_unscale:
            seen = _overflow.fingerprint(self._hyper_map, grads)
            nonfinite = ops.cast(ops.logical_not(ops.isfinite(seen)), mstype.float32)
            found = self._states.found_after_unscale(column, self._core.is_overflow(nonfinite))
            code = self._states.scaled_gradients_code(column, seen, global_norm(self._hyper_map, grads),
                                                      self._core.scale_value)
            to_apply = grads
        else:
            to_apply = self._core.unscale(grads)
            found = self.decide(to_apply)
            code = self._states.ready_code(slot, column, structure)
        skipped = self._states.record_step(slot, found, code)
        return to_apply, skipped, code

    def update_from_checks(self):
        """Adjust the scale from this iteration's overflows and start the next iteration.

        Not merged with the refusal under an ``if``: MindSpore 2.10 dropped the writes of such a branch from a
        compiled ``update()`` (measured)."""
        overflow = self._core.is_overflow(self._states.any_found())
        self._core._apply_rule(overflow)  # pylint: disable=protected-access
        return self._states.reset()


@ms.jit_class
class GradScaler:
    """Dynamic (or fixed) loss scaling for ``mindspore.value_and_grad`` loops: Paddle's ``GradScaler``.

    Called with PyTorch's spelling (a device string first, or any of ``init_scale``,
    ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``enabled``) it returns a
    :class:`TorchGradScaler` instead; mixing both spellings is a ``ValueError``.

    The rule is Paddle's dygraph one: the scale is multiplied by ``incr_ratio`` after
    ``incr_every_n_steps`` consecutive clean steps, and by ``decr_ratio`` after
    ``decr_every_n_nan_or_inf`` consecutive bad steps (a clean step or a backoff restarts
    that count), with no floor. Unlike Paddle's, it never grows to inf.

    Args:
        enable (bool): False makes every method a no-op (``step`` just applies). Default True.
        init_loss_scaling (float): initial scale. Default 32768.0.
        incr_ratio (float): growth multiplier, > 1. Default 2.0.
        decr_ratio (float): backoff multiplier, in (0, 1). Default 0.5.
        incr_every_n_steps (int): clean steps per growth, >= 1. Default 1000.
        decr_every_n_nan_or_inf (int): consecutive bad steps per backoff, >= 1. Default 2.
        use_dynamic_loss_scaling (bool): False keeps the scale fixed (steps with inf/nan are
            still skipped, as in Paddle; ``update()`` or ``minimize`` still ends each iteration,
            where Paddle's ``step()`` ends it for every optimizer). Default True.

    Keyword Args:
        policy (LossScalePolicy or str): use this rule (or preset) instead; then leave the
            rule arguments at their defaults.
        overflow_check (str or check Cell): the backend check; default the device target's.
        name (str): prefix of this scaler's Parameter names; default a unique one.

    Raises:
        TypeError, ValueError: a bad argument, named with its value and range. Range errors
        of the rule are also ``AssertionError`` (Paddle asserts on its ratios).

    Example:
        >>> scaler = GradScaler(init_loss_scaling=1024)
        >>> scaler.get_init_loss_scaling(), scaler.get_decr_every_n_nan_or_inf(), type(scaler).__name__
        (1024.0, 2, 'GradScaler')
        >>> type(GradScaler("cuda")).__name__, GradScaler("cpu").get_scale()
        ('TorchGradScaler', 65536.0)
    """

    _FIELDS = _PADDLE_FIELDS

    def __new__(cls, *args, **kwargs):
        if cls is GradScaler and _spelling(args, kwargs) == "torch":
            cls = TorchGradScaler
        return super().__new__(cls)

    def __init__(self, enable=True, init_loss_scaling=32768.0, incr_ratio=2.0, decr_ratio=0.5, incr_every_n_steps=1000,
                 decr_every_n_nan_or_inf=2, use_dynamic_loss_scaling=True, *, policy=None, overflow_check=None,
                 name=None):
        rule = {"init_scale": init_loss_scaling, "growth_factor": incr_ratio, "backoff_factor": decr_ratio,
                "growth_interval": incr_every_n_steps, "hysteresis": decr_every_n_nan_or_inf}
        config = dict(zip(PADDLE_DEFAULTS, (enable, init_loss_scaling, incr_ratio, decr_ratio, incr_every_n_steps,
                                            decr_every_n_nan_or_inf, use_dynamic_loss_scaling)))
        self._setup(config, policy, rule, check_bool("enable", enable),
                    check_bool("use_dynamic_loss_scaling", use_dynamic_loss_scaling), overflow_check, name)

    def _setup(self, config, policy, rule, enabled, dynamic, overflow_check, name):
        if policy is not None:
            changed = [self._FIELDS[f] for f, value in rule.items() if value != self._default_rule()[f]]
            if changed:
                raise ValueError(f"give either 'policy' or the rule arguments ({', '.join(changed)}), not both.")
            self._policy = _as_policy(policy)
        else:
            self._policy = _framework_rule(rule, self._FIELDS, self._base_rule())
        self._config = dict(config, policy=policy, overflow_check=overflow_check, name=name)
        # What update(new_scale) accepts: the rule's bounds, which no setter or loaded state changes.
        self._scale_bounds = (self._policy.floor, self._policy.ceiling)
        self._enabled = enabled
        self._core = None
        self._states = None
        self._iteration = None
        self._calls = CompiledCalls()
        self._dynamic = dynamic
        if enabled:
            prefix = claim_name(name, self, "grad_scaler")
            self._core = LossScaler(self._policy, name=prefix, overflow_check=overflow_check, mutable_rule=True)
            self._core.set_rule(dynamic=dynamic)
            self._states = OptimizerStates(prefix)
            self._iteration = _IterationGraph(self._core, self._states)

    @staticmethod
    def _base_rule():
        return get_preset("paddle")

    @staticmethod
    def _default_rule():
        return {"init_scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1000,
                "hysteresis": 2}

    @classmethod
    def from_preset(cls, name, enable=True, **overrides):
        """A scaler with preset ``name`` of :mod:`lossscale.presets`; ``"pytorch"`` gives a TorchGradScaler.

        Example:
            >>> type(GradScaler.from_preset("pytorch")).__name__, GradScaler.from_preset("megatron").get_scale()
            ('TorchGradScaler', 4294967296.0)
        """
        if name == "pytorch" and cls is GradScaler:
            return TorchGradScaler(enabled=enable, policy=get_preset(name, **overrides))
        return cls(enable, policy=get_preset(name, **overrides))

    # ---- the training-loop API (graph ops; eager or inside mindspore.jit) --------------------------
    def scale(self, outputs):
        """``outputs`` (a loss, or a nested tuple/list of losses) times the scale; unchanged when disabled.

        Each loss is promoted to at least float32 first. A non-finite loss is multiplied by nan
        instead, so every gradient computed from it is nan: the ``step`` those gradients feed is
        skipped and ``update`` backs off. Nothing is recorded: a batch dropped by hand after a
        non-finite loss (no ``step``, no ``update``) does not affect the next iteration.
        """
        if not self._enabled:
            return outputs
        return self._core.scale(outputs)

    def unscale_(self, grads, key=None):
        """Return ``grads`` divided by the scale (in float32) and record whether any is inf/nan.

        Call at most once per optimizer per iteration, before anything that needs the true
        gradients (clipping), and pass what it returns to ``step``: MindSpore gradients are
        values, so unlike PyTorch's ``unscale_(optimizer)`` it cannot change them in place.
        ``key``: an int or str naming the optimizer, for several optimizers whose parameters
        have the same shapes; by default the gradients' shapes identify it. ``None`` entries pass
        through (PyTorch skips parameters without a gradient).
        """
        refuse_non_gradients(grads, "grads")
        if not self._enabled:
            return grads
        grads = self._graph_values(grads)
        structure = self._states.structure_of(grads)
        slot = self._states.slot(key, structure)
        unscaled, stage = self._run(self._iteration.unscale_and_record, grads, slot, structure)
        # Reading the result reports a refusal (graphs run asynchronously) and waits for the record.
        return ops.depend(unscaled, self._states.refuse_unscale(stage))

    def _graph_values(self, grads):
        """``grads`` as values computed by the graph when they are constants: a plain tuple of Tensors given to a
        compiled function (:func:`lossscale.overflow.is_constant`) is multiplied by ``S / S``, exactly 1 but
        known only when the graph runs. With constant gradients and the optimizer given by keyword, MindSpore
        2.10 folded their unscaling inside step()'s branch into ``(0, 0)`` (measured: "Cannot join the return
        values of different branches"). Other gradients, and every call from Python (compiled with
        ``mindspore.mutable`` gradients), are returned as they are."""
        if outside_graph(self._states.table) or not _overflow.is_constant(grads):
            return grads
        scale = self._core.scale_value.reshape(())
        return _overflow.multiply_gradients(self._states.hyper_map, scale / scale, grads)

    def _run(self, method, *args):
        """``method(*args)``: inline inside a compiled function; called from Python, compiled once per method
        and gradient structure (:mod:`lossscale._eager_calls`), so an eager iteration launches a few graphs
        instead of a few hundred small kernels."""
        if outside_graph(self._states.table):
            return self._calls.run(method, *args)
        return method(*args)

    def step(self, optimizer, grads, key=None):
        """``optimizer(grads)`` unless this optimizer's gradients overflowed; return True if skipped.

        If ``unscale_`` was called for this optimizer in this iteration, ``grads`` are taken as
        unscaled and the decision is the one ``unscale_`` recorded (whatever happened to the
        gradients since, e.g. clamping), also skipping if ``grads`` now hold inf/nan;
        otherwise ``grads`` are unscaled and checked here. Refused before anything is applied:
        a second ``step`` for the optimizer, the still-scaled gradients ``unscale_`` was given,
        an optimizer built with its own ``loss_scale`` or a ``LossScaleOptimizer``, and gradients
        whose shapes are not those of ``optimizer.parameters``, one for one (eagerly ``ValueError``;
        inside a compiled function MindSpore refuses them while compiling). A list is applied as a
        tuple (MindSpore's optimizers take tuples). Called from Python, an optimizer that raises leaves
        the iteration as it was before this call, so ``step`` can be called again (as in PyTorch).
        """
        refuse_non_gradients(grads, "grads")
        if not self._enabled:
            return ops.depend(Tensor(False), optimizer(tuple(grads)))
        if hasattr(optimizer, "get_unscaled_gradients"):
            _refuse_loss_scale_optimizer()
        _refuse_optimizer_loss_scale(getattr(optimizer, "loss_scale", 1.0))
        parameters = getattr(optimizer, "parameters", None)
        if parameters is None:
            _refuse_optimizer_without_parameters()
        refuse_bfloat16_on_cpu(tuple(parameter.dtype for parameter in parameters))
        self._states.refuse_misfit(grads, parameters)
        grads = self._graph_values(grads)
        structure = self._states.structure_of(grads)
        slot = self._states.slot(key, structure)
        # Called from Python the stage is read on the host, so only the branch this call takes is compiled.
        before = self._states.host_table()
        self._states.refuse_related_unscaled(before, slot, structure)
        to_apply, skipped, code = self._run(self._iteration.step_decision, grads, slot, structure,
                                            self._states.unscaled_in(before, slot))
        # A refusal shares the optimizer's branch: no extra control flow on a correct step.
        if not skipped:
            if before is None:
                skipped = ops.depend(skipped, optimizer(tuple(to_apply)))
            else:
                skipped = ops.depend(skipped, self._states.apply_or_restore(optimizer, tuple(to_apply), before))
        else:
            skipped = ops.depend(skipped, self._states.raise_step_misuse(code))
        return skipped

    def update(self, new_scale=None):
        """Update the scale from this iteration's overflows (once per iteration, after every ``step``).

        Backs off if any optimizer's gradients (or a scaled loss) overflowed, grows after
        the window of clean iterations; with ``new_scale`` (PyTorch: a number or a one-value
        Tensor) sets the scale instead, refused unless finite, > 0 and within the rule's
        ``min_scale``/``max_scale`` (a state outside them could not be loaded again).
        Starts the next iteration. Returns the scaler, so under ``mindspore.jit`` (which
        rebinds the receiver of a method named ``update``) the scaler stays usable.
        """
        if not self._enabled:
            return self
        if new_scale is None:
            self._refuse_update()  # as PyTorch: only an update from this iteration's checks needs them
            self._run(self._iteration.update_from_checks)
        else:
            low, high = self._scale_bounds
            # The check on a graph Tensor lives in a function that returns the value the write uses: inline here,
            # an `if` on a Tensor in a method returning `self` made MindSpore 2.10 drop the writes after it
            # (measured: update(new_scale) under jit changed nothing).
            if isinstance(new_scale, Tensor) and not outside_graph(self._states.table):
                value = _new_scale_in_graph(new_scale, low, high)
            else:
                value = _checked_new_scale(new_scale, low, high)
            self._core.assign_scale(value)
            self._states.reset()
        return self

    def _refuse_update(self):
        """Paddle's update() needs no step(); PyTorch's does (TorchGradScaler)."""
        return None

    def _host_only(self, method):
        """A clear error when a host method is traced into a compiled function (MindSpore's own message would be
        about ``asnumpy`` or an unsupported ``try``). A disabled scaler has no device state: nothing to refuse."""
        if self._enabled:
            _refuse_host_call_in_graph(method, outside_graph(self._states.table))

    def minimize(self, optimizer, grads, key=None):
        """``step(optimizer, grads, key)`` then ``update()`` (Paddle); return True if the step was skipped."""
        skipped = self.step(optimizer, grads, key)
        self.update()
        return skipped

    # ---- queries (host) ----------------------------------------------------------------------------
    def is_enable(self):
        """Whether loss scaling is on (Paddle)."""
        return self._enabled

    def is_enabled(self):
        """Whether loss scaling is on (PyTorch)."""
        return self._enabled

    def is_use_dynamic_loss_scaling(self):
        """Whether the scale is updated dynamically (False when disabled, as Paddle)."""
        self._host_only("is_use_dynamic_loss_scaling()")
        return self._enabled and self._core.dynamic

    def get_scale(self):
        """The current scale: eagerly a Python float (one host sync); inside a compiled function a float32
        scalar Tensor read when the graph runs, so PyTorch's ``inv_scale = 1. / scaler.get_scale()`` (its
        gradient-penalty recipe) follows the scale there too. 1.0 when disabled."""
        return self._core.get_scale() if self._enabled else 1.0

    def get_loss_scaling(self):
        """The current scale as a float32 Tensor (Paddle; eagerly one host sync, a graph read when compiled)."""
        return self._core.get_scale_tensor() if self._enabled else Tensor(1.0, mstype.float32)

    def get_state(self):
        """The rule's state (:class:`lossscale.policy.LossScaleState`), read from the device."""
        self._host_only("get_state()")
        if not self._enabled:
            return LossScaleState(scale=1.0)
        return self._core.update_cell.get_state()

    def get_init_loss_scaling(self):
        """The initial scale (1.0 when disabled, as Paddle)."""
        return self._policy.init_scale if self._enabled else 1.0

    def _rule_value(self, field):
        """The rule's ``field``: eagerly the policy's exact Python number; inside a compiled function a graph read
        of the update cell's Parameter (a setter called after compiling shows there too). A disabled scaler has
        no Parameters: its numbers are constants of each compilation."""
        if self._core is None:
            return getattr(self._policy, field)
        return self._core.update_cell.rule_value(field)

    def get_incr_ratio(self):
        """The growth multiplier (a graph read inside a compiled function, see :meth:`get_scale`)."""
        return self._rule_value("growth_factor")

    def get_decr_ratio(self):
        """The backoff multiplier (a graph read inside a compiled function)."""
        return self._rule_value("backoff_factor")

    def get_incr_every_n_steps(self):
        """Consecutive clean steps per growth (a graph read inside a compiled function)."""
        return self._rule_value("growth_interval")

    def get_decr_every_n_nan_or_inf(self):
        """Consecutive bad steps per backoff (a graph read inside a compiled function)."""
        return self._rule_value("hysteresis")

    get_growth_factor = get_incr_ratio
    get_backoff_factor = get_decr_ratio
    get_growth_interval = get_incr_every_n_steps

    # ---- settings (host; they reach steps compiled before them) ---------------------------------------
    def _set_rule(self, **fields):
        self._host_only("set_...() (a setter)")
        policy = _framework_rule(fields, self._FIELDS, self._policy)
        if self._enabled:
            state = None
            if "init_scale" in fields:  # as Paddle: the new initial scale is the current scale, counts kept
                current = self.get_state()
                state = LossScaleState(scale=policy.init_scale, good_steps=current.good_steps,
                                       hysteresis_left=current.hysteresis_left)
            self._core.set_rule(policy, state)
        self._policy = policy

    def set_init_loss_scaling(self, new_init_loss_scaling):
        """Set the initial scale; as in Paddle it also becomes the current scale."""
        self._set_rule(init_scale=new_init_loss_scaling)

    def set_incr_ratio(self, new_incr_ratio):
        """Set the growth multiplier (> 1.0)."""
        self._set_rule(growth_factor=new_incr_ratio)

    def set_decr_ratio(self, new_decr_ratio):
        """Set the backoff multiplier (in (0, 1))."""
        self._set_rule(backoff_factor=new_decr_ratio)

    def set_incr_every_n_steps(self, new_incr_every_n_steps):
        """Set the clean steps per growth (an int >= 1); a longer count is clipped to the new window."""
        self._set_rule(growth_interval=new_incr_every_n_steps)

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf):
        """Set the bad steps per backoff (an int >= 1)."""
        self._set_rule(hysteresis=new_decr_every_n_nan_or_inf)

    set_growth_factor = set_incr_ratio
    set_backoff_factor = set_decr_ratio
    set_growth_interval = set_incr_every_n_steps

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self):
        """Paddle's state (empty when disabled): ``scale`` (a float32 array of shape (1,)), the rule,
        ``incr_count``, ``decr_count``, ``use_dynamic_loss_scaling`` (one host sync).

        A rule whose hysteresis works unlike Paddle's (a ``policy`` such as Megatron's) adds
        ``consecutive_hysteresis`` and ``refill_hysteresis_on_backoff``, so that a round trip keeps
        them; Paddle's own ``load_state_dict`` ignores keys it does not know."""
        self._host_only("state_dict()")
        if not self._enabled:
            return {}
        state, policy = self.get_state(), self._policy
        saved = {"scale": np.array([state.scale], np.float32), "incr_ratio": policy.growth_factor,
                 "decr_ratio": policy.backoff_factor, "incr_every_n_steps": policy.growth_interval,
                 "decr_every_n_nan_or_inf": policy.hysteresis, "incr_count": state.good_steps,
                 "decr_count": policy.hysteresis - state.hysteresis_left,
                 "use_dynamic_loss_scaling": self._core.dynamic}
        if policy.hysteresis != 1 and _hysteresis_flags(policy) != _PADDLE_HYSTERESIS:
            saved.update(_hysteresis_flags(policy))  # another library's hysteresis (a policy such as Megatron's)
        return saved

    def load_state_dict(self, state_dict):
        """Restore a state: this scaler's, Paddle's or PyTorch's format (validated; nothing changes on error).

        Ignored when disabled (as Paddle and PyTorch). The saved scale also becomes the
        initial scale (as both do). A TorchGradScaler refuses a fixed Paddle state
        (``use_dynamic_loss_scaling`` False): PyTorch's scale is always dynamic.
        """
        self._host_only("load_state_dict()")
        if not self._enabled:
            return
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"'state_dict' must be a dict, but got {type(state_dict).__name__}.")
        if not state_dict:
            raise RuntimeError(self._EMPTY_STATE)
        policy, state, dynamic = _parse_state(state_dict, self._policy)
        self._refuse_fixed_state(dynamic)
        self._core.set_rule(policy, state, dynamic)
        self._policy = policy

    _EMPTY_STATE = ("The input state dict is empty, possibly because it was saved from a disabled instance of "
                    "GradScaler.")

    def _refuse_fixed_state(self, dynamic):
        """Paddle's scale may be fixed (``use_dynamic_loss_scaling=False``); PyTorch's may not (TorchGradScaler)."""

    def __getstate__(self):
        """Pickle between iterations only (as PyTorch): the configuration and the state. An explicit ``name``
        comes back as given if no living scaler holds it (e.g. in a new process), else as ``name_1``, ..."""
        if self._enabled and not self._states.between_iterations():
            raise RuntimeError("A GradScaler can only be pickled at the beginning of an iteration, or at the end "
                               "after update().")
        return {"config": self._config, "policy": self._policy, "state": self.state_dict()}

    def __setstate__(self, saved):
        config = dict(saved["config"])
        if config.get("name") is not None:
            config["name"] = free_name(config["name"])
        self.__init__(**config)
        if saved["state"]:
            self.load_state_dict(saved["state"])


@ms.jit_class
class TorchGradScaler(GradScaler):
    """PyTorch's ``torch.amp.GradScaler`` on MindSpore (what ``GradScaler`` returns for PyTorch's spelling).

    Defaults and rule are PyTorch's: the scale starts at 2**16, is multiplied by
    ``growth_factor`` after ``growth_interval`` consecutive iterations without inf/nan, by
    ``backoff_factor`` on every iteration with one, with no floor; growth never produces inf.
    ``update()`` without an ``unscale_``/``step`` since the last ``update`` raises
    ``AssertionError`` ("No inf checks were recorded prior to update"), as in PyTorch;
    ``update(new_scale)`` needs no checks.

    Args:
        device (str): accepted for PyTorch compatibility (``"cuda"``, ``"cpu"``, ``"npu"``, ...). The
            scale lives on MindSpore's context device; scaling is never disabled because of it
            (PyTorch disables itself for ``"cuda"`` without CUDA).
        init_scale (float): initial scale. Default 2**16.
        growth_factor (float): > 1. Default 2.0.
        backoff_factor (float): in (0, 1). Default 0.5.
        growth_interval (int): >= 1. Default 2000.
        enabled (bool): False makes every method a no-op (``step`` just applies). Default True.

    Keyword Args:
        policy, overflow_check, name: as for :class:`GradScaler`.

    Example:
        >>> scaler = TorchGradScaler(init_scale=1024.0, growth_interval=100)
        >>> scaler.get_scale(), scaler.get_growth_interval(), sorted(scaler.state_dict())
        (1024.0, 100, ['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale'])
    """

    _FIELDS = _TORCH_FIELDS

    def __init__(self, device="cuda", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, *, policy=None, overflow_check=None, name=None):
        if not isinstance(device, str):
            raise TypeError(f"'device' must be a str such as 'cuda' or 'cpu', but got {type(device).__name__}.")
        rule = {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                "growth_interval": growth_interval, "hysteresis": 1}
        config = dict(zip(TORCH_DEFAULTS, (device, init_scale, growth_factor, backoff_factor, growth_interval,
                                           enabled)))
        self._device = device
        self._setup(config, policy, rule, check_bool("enabled", enabled), True, overflow_check, name)

    @staticmethod
    def _base_rule():
        return get_preset("pytorch")

    @staticmethod
    def _default_rule():
        return {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                "hysteresis": 1}

    def _refuse_update(self):
        return self._states.refuse_update_without_checks()

    def _refuse_fixed_state(self, dynamic):
        """A fixed Paddle state is refused: PyTorch's scale is always dynamic, and PyTorch's state_dict() has no
        place for a fixed one, so a round trip would silently make it dynamic again."""
        if not dynamic:
            raise ValueError("'state_dict['use_dynamic_loss_scaling']' is False, but a PyTorch GradScaler's scale is "
                             "always dynamic: load a fixed Paddle state into a scaler of Paddle's spelling, "
                             "GradScaler(init_loss_scaling=..., use_dynamic_loss_scaling=False).")

    def state_dict(self):
        """PyTorch's state (empty when disabled): ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (one host sync).

        A rule with hysteresis (a ``policy`` such as Megatron's, or a loaded Paddle state) adds
        ``hysteresis`` (overflows per backoff), ``_hysteresis_tracker`` (overflows counted towards
        the next backoff), ``consecutive_hysteresis`` and ``refill_hysteresis_on_backoff``, so that
        a round trip keeps them; PyTorch's own ``load_state_dict`` ignores keys it does not know."""
        self._host_only("state_dict()")
        if not self._enabled:
            return {}
        state, policy = self.get_state(), self._policy
        saved = {"scale": state.scale, "growth_factor": policy.growth_factor, "backoff_factor": policy.backoff_factor,
                 "growth_interval": policy.growth_interval, "_growth_tracker": state.good_steps}
        if policy.hysteresis != 1:
            saved.update(hysteresis=policy.hysteresis, _hysteresis_tracker=policy.hysteresis - state.hysteresis_left,
                         **_hysteresis_flags(policy))
        return saved

    _EMPTY_STATE = ("The source state dict is empty, possibly because it was saved from a disabled instance of "
                    "GradScaler.")


def _number(state_dict, key):
    """``state_dict[key]`` as a Python number (a one-element array or Tensor is unwrapped)."""
    value = state_dict[key]
    if isinstance(value, Tensor):
        value = value.asnumpy()
    if isinstance(value, (np.ndarray, list, tuple)):
        array = np.asarray(value)
        if array.size != 1:
            raise ValueError(f"'state_dict[{key!r}]' must hold one number, but got {array.size} values.")
        value = array.reshape(-1)[0].item()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _parse_state(state_dict, current):
    """``(policy, state, dynamic)`` from a Paddle-format or PyTorch-format state dict, fully validated."""
    if "incr_ratio" in state_dict:
        keys, names = _PADDLE_STATE_KEYS, _PADDLE_FIELDS
    elif "growth_factor" in state_dict:
        keys, names = _TORCH_STATE_KEYS, _TORCH_FIELDS
    else:
        raise ValueError(f"'state_dict' is neither a Paddle GradScaler state (keys {list(_PADDLE_STATE_KEYS)}) nor a "
                         f"PyTorch one (keys {list(_TORCH_STATE_KEYS)}); got keys {sorted(state_dict)}.")
    if names is _TORCH_FIELDS and any(key in state_dict for key in _TORCH_HYSTERESIS_KEYS):
        keys += _TORCH_HYSTERESIS_KEYS  # written by a TorchGradScaler whose rule has hysteresis
    elif names is _PADDLE_FIELDS and any(key in state_dict for key in _HYSTERESIS_FLAGS):
        keys += _HYSTERESIS_FLAGS
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(f"'state_dict' is missing {missing}; a {'Paddle' if names is _PADDLE_FIELDS else 'PyTorch'} "
                         f"GradScaler state has the keys {list(keys)}.")
    values = {key: _number(state_dict, key) for key in keys}
    scale = values["scale"]
    rule = {"init_scale": scale, "growth_factor": values[names["growth_factor"]],
            "backoff_factor": values[names["backoff_factor"]], "growth_interval": values[names["growth_interval"]]}
    if names["hysteresis"] in values:
        rule["hysteresis"] = values[names["hysteresis"]]
        rule.update(_loaded_hysteresis_flags(values, rule["hysteresis"], current))
    policy = _framework_rule(rule, {**names, "init_scale": "state_dict['scale']"}, current)
    if names is _PADDLE_FIELDS:
        good = check_int_in_range("state_dict['incr_count']", values["incr_count"], low=0,
                                  high=policy.growth_interval - 1)
        bad = check_int_in_range("state_dict['decr_count']", values["decr_count"], low=0, high=policy.hysteresis - 1)
        dynamic = check_bool("state_dict['use_dynamic_loss_scaling']", values["use_dynamic_loss_scaling"])
        state = LossScaleState(scale=policy.init_scale, good_steps=good, hysteresis_left=policy.hysteresis - bad)
    else:
        good = check_int_in_range("state_dict['_growth_tracker']", values["_growth_tracker"], low=0,
                                  high=policy.growth_interval - 1)
        bad = check_int_in_range("state_dict['_hysteresis_tracker']", values["_hysteresis_tracker"], low=0,
                                 high=policy.hysteresis - 1) if "hysteresis" in values else 0
        state, dynamic = LossScaleState(scale=policy.init_scale, good_steps=good,
                                        hysteresis_left=policy.hysteresis - bad), True
    return policy, check_state(policy, state), dynamic


def _loaded_hysteresis_flags(values, hysteresis, current):
    """How a loaded state's hysteresis works: as its dict says; else (a Paddle state) as the ``current`` rule
    does, unless that rule has no hysteresis, whose flags mean nothing: then as Paddle's. ValueError if that
    is not how ``current``'s works: the update graphs are built for one way (and a hybrid would be no
    library's rule)."""
    if _HYSTERESIS_FLAGS[0] in values:
        flags = {flag: check_bool(f"state_dict[{flag!r}]", values[flag]) for flag in _HYSTERESIS_FLAGS}
    elif hysteresis != 1 and current.hysteresis == 1:
        flags = _PADDLE_HYSTERESIS
    else:
        flags = _hysteresis_flags(current)
    if flags != _hysteresis_flags(current):
        raise ValueError(f"'state_dict' holds a rule with hysteresis {hysteresis} working as {flags}, but this "
                         f"scaler's hysteresis works as {_hysteresis_flags(current)}, which is fixed when it is "
                         f"built: load it into a scaler built with that rule (Paddle's spelling, "
                         f"GradScaler(init_loss_scaling=...), for a Paddle state; policy=... for another).")
    return flags


def _init_signature(cls):
    """``cls``'s constructor signature without ``self`` (what ``inspect.signature(cls)`` shows)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return inspect.Signature(parameters)


GradScaler.__signature__ = _init_signature(GradScaler)
TorchGradScaler.__signature__ = _init_signature(TorchGradScaler)
