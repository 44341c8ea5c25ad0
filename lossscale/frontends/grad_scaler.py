"""``GradScaler``: Paddle's and PyTorch's loss-scaling front-ends for functional MindSpore training.

Each translates its framework's API (:mod:`lossscale.frontends.spelling`) onto the
:class:`lossscale.core.scaler.LossScaler` core and PyTorch's per-optimizer state machine
(:mod:`lossscale.frontends.optimizer_states`), for any rule. Every number they keep is a Parameter, so a step
compiled with ``mindspore.jit`` and eager calls share one state, and setters or ``load_state_dict()`` reach steps
compiled before them. Misuse is refused before anything is applied: eagerly with a normal exception, inside
``mindspore.jit`` with a runtime ``raise`` reported at the next host read. Called from Python, ``unscale_``,
``step`` and ``update`` each run their graph part as one compiled graph (:mod:`lossscale.frontends._eager_calls`).
docs/design.md, section 6, has the iteration's algorithm, the host syncs and what "skip" means.
"""

import inspect
from collections.abc import Mapping

import mindspore as ms
from mindspore import Parameter, Tensor, ops
from mindspore.common import dtype as mstype

from lossscale.core import gradients
from lossscale.core._naming import claim_name, free_name
from lossscale.core._optimizers import refuse_bfloat16_on_cpu
from lossscale.core._parameters import outside_graph
from lossscale.core._validation import check_bool
from lossscale.core.presets import get_preset
from lossscale.core.rule import as_mapping, host_view
from lossscale.core.scaler import LossScaler, scale_tensor
from lossscale.frontends._eager_calls import CompiledCalls
from lossscale.frontends.iteration import (
    IterationGraph,
    checked_new_scale,
    new_scale_in_graph,
    refuse_host_call_in_graph,
    refuse_loss_scale_optimizer,
    refuse_optimizer_loss_scale,
    refuse_optimizer_without_parameters,
)
from lossscale.frontends.iteration_statistics import IterationStatistics
from lossscale.frontends.iteration_table import (
    apply_or_restore,
    host_table,
    raise_step_misuse,
    refuse_related_unscaled,
    unscaled_in,
)
from lossscale.frontends.optimizer_states import OptimizerStates
from lossscale.frontends.persistence import as_rule, framework_rule, parse_state, state_dict_of
from lossscale.frontends.refusals import refuse_non_gradients, refuse_sparse_gradients
from lossscale.frontends.spelling import PADDLE, RULE_FIELDS, TORCH, spelling_of

# What the generated accessors say about each field of the rule.
_FIELD_DOCS = {
    "init_scale": "the initial scale (setting it also sets the current scale, as Paddle does)",
    "growth_factor": "the growth multiplier (> 1)",
    "backoff_factor": "the backoff multiplier, in (0, 1)",
    "growth_interval": "the consecutive clean steps per growth (>= 1; a longer count is clipped to a new window)",
    "hysteresis": "the consecutive bad steps per backoff (>= 1)",
}


@ms.jit_class
class GradScaler:
    """Dynamic (or fixed) loss scaling for ``mindspore.value_and_grad`` loops: Paddle's ``GradScaler``.

    Called with PyTorch's spelling (a device string first, or any of ``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval``, ``enabled``) it returns a :class:`TorchGradScaler` instead; mixing both
    spellings is a ``ValueError``. The ports ``lossscale.paddle`` and ``lossscale.torch`` give each framework's class.

    The rule is Paddle's dygraph one: the scale is multiplied by ``incr_ratio`` after ``incr_every_n_steps``
    consecutive clean steps, and by ``decr_ratio`` after ``decr_every_n_nan_or_inf`` consecutive bad steps (a clean
    step or a backoff restarts that count), with no floor; unlike Paddle's, it never grows to inf. The defaults are
    Paddle 2.4's and earlier's, the signature implemented here; Paddle 2.5 and later default to ``2**16``, ``2000``
    and ``1``: ``GradScaler.from_preset("paddle_2_5")``. ``GradScaler()`` without arguments is Paddle's spelling,
    also for ``lossscale.GradScaler``: PyTorch's defaults need PyTorch's spelling or ``lossscale.torch``.

    Args:
        enable (bool): False makes every method a no-op (``step`` just applies). Default True.
        init_loss_scaling (float): initial scale. Default 32768.0 (Paddle <= 2.4).
        incr_ratio (float): growth multiplier, > 1. Default 2.0.
        decr_ratio (float): backoff multiplier, in (0, 1). Default 0.5.
        incr_every_n_steps (int): clean steps per growth, >= 1. Default 1000 (Paddle <= 2.4).
        decr_every_n_nan_or_inf (int): consecutive bad steps per backoff, >= 1. Default 2 (Paddle <= 2.4).
        use_dynamic_loss_scaling (bool): False keeps the scale fixed (steps with inf/nan are still skipped, as in
            Paddle; ``update()`` or ``minimize`` still ends each iteration). Default True.

    Keyword Args:
        policy (LossScaleRule or str): any rule (a preset's name, ``AdaptiveWindowRule``, your own) instead of the
            rule arguments, which then stay at their defaults. Setters change what the rule's ``changed()`` allows
            (all of a ``LossScalePolicy``; the initial scale of another rule).
        overflow_check (str or check Cell): the backend check; default the device target's.
        name (str): prefix of this scaler's Parameter names; default a unique one.

    Raises:
        TypeError, ValueError: a bad argument, named with its value and range. Range errors of the rule are also
        ``AssertionError`` (Paddle asserts on its ratios).

    Example:
        >>> scaler = GradScaler(init_loss_scaling=1024)
        >>> scaler.get_init_loss_scaling(), scaler.get_decr_every_n_nan_or_inf(), type(scaler).__name__
        (1024.0, 2, 'GradScaler')
        >>> type(GradScaler("cuda")).__name__, GradScaler("cpu").get_scale()
        ('TorchGradScaler', 65536.0)
    """

    SPELLING = PADDLE

    def __new__(cls, *args, **kwargs):
        if cls is GradScaler and spelling_of(args, kwargs) is TORCH:
            cls = TorchGradScaler
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        spelling = self.SPELLING
        arguments = spelling.bind(args, kwargs, type(self).__name__)
        if "device" in arguments and not isinstance(arguments["device"], str):
            raise TypeError(
                f"'device' must be a str such as 'cuda' or 'cpu', but got {type(arguments['device']).__name__}."
            )
        self._enabled = check_bool(spelling.enabled, arguments[spelling.enabled])
        self._update_needs_checks = spelling.update_needs_checks  # an attribute a compiled update() can read
        dynamic = check_bool("use_dynamic_loss_scaling", arguments.get("use_dynamic_loss_scaling", True))
        self._rule = _chosen_rule(spelling, arguments)
        self._config = arguments
        # What update(new_scale) accepts: the rule's bounds, which no setter or loaded state changes.
        self._scale_bounds = self._rule.scale_bounds()
        self._core = self._states = self._iteration = None
        self._calls = CompiledCalls()
        if self._enabled:
            prefix = claim_name(arguments["name"], self, "grad_scaler")
            self._core = LossScaler(
                self._rule, name=prefix, overflow_check=arguments["overflow_check"], mutable_rule=True
            )
            if not dynamic:
                self._core.set_rule(dynamic=False)
            self._states = OptimizerStates(prefix)
            statistics = IterationStatistics(prefix, len(self._rule.statistics))
            self._iteration = IterationGraph(self._core, self._states, statistics)

    @classmethod
    def from_preset(cls, name, enable=True, **overrides):
        """A scaler with preset ``name`` (:mod:`lossscale.core.presets`); ``"pytorch"`` gives a TorchGradScaler
        (``enable``: the framework's ``enable``/``enabled``).

        Example:
            >>> type(GradScaler.from_preset("pytorch")).__name__, GradScaler.from_preset("megatron").get_scale()
            ('TorchGradScaler', 4294967296.0)
        """
        if name == "pytorch" and cls is GradScaler:
            cls = TorchGradScaler
        return cls(**{cls.SPELLING.enabled: enable}, policy=get_preset(name, **overrides))

    # ---- the training-loop API (graph ops; eager or inside mindspore.jit) --------------------------
    def scale(self, outputs):
        """``outputs`` (a loss, or a nested tuple/list of losses) times the scale; unchanged when disabled.

        Each loss is promoted to at least float32 first. A non-finite loss is multiplied by nan instead, so every
        gradient computed from it is nan: the ``step`` those gradients feed is skipped and ``update`` backs off.
        Nothing is recorded: a batch dropped by hand after a non-finite loss does not affect the next iteration.
        """
        if not self._enabled:
            return outputs
        return self._core.scale(outputs)

    def unscale_(self, grads, key=None):
        """Return ``grads`` divided by the scale (in float32) and record whether any is inf/nan.

        Call at most once per optimizer per iteration, before anything that needs the true
        gradients (clipping), and pass what it returns to ``step``. Called from Python, the given
        gradient Tensors are unscaled in place too, as PyTorch's ``unscale_(optimizer)`` does, so
        PyTorch's recipes written with the result dropped (``scaler.unscale_(grads)``, then
        ``clip_grad_value_``'s ``ops.clip_by_value`` on ``grads``) train as written. Inside
        ``mindspore.jit`` Tensors are values and cannot change: there only the returned gradients
        are unscaled (``grads = scaler.unscale_(grads)``, then clip those). ``key``: an int or str
        naming the optimizer, for several optimizers whose parameters have the same shapes; by
        default the gradients' shapes identify it. ``None`` entries pass through (PyTorch skips
        parameters without a gradient).
        """
        refuse_non_gradients(grads, "grads")
        if not self._enabled:
            return grads
        if not outside_graph(self._states.table):
            refuse_sparse_gradients(grads, "grads")
        given, grads = grads, _graph_values(self, grads)
        structure = self._states.structure_of(grads)
        slot = self._states.slot(key, structure)
        unscaled, stage = _run(self, self._iteration.unscale_and_record, grads, slot, structure)
        # Reading the result reports a refusal (graphs run asynchronously) and waits for the record.
        unscaled = ops.depend(unscaled, self._states.refuse_unscale(stage))
        if outside_graph(self._states.table):
            _unscale_in_place(given, unscaled)
        return unscaled

    def step(self, optimizer, grads, key=None):
        """``optimizer(grads)`` unless this optimizer's gradients overflowed; return True if skipped.

        If ``unscale_`` was called for this optimizer in this iteration, ``grads`` are taken as unscaled and the
        decision is the one ``unscale_`` recorded (whatever happened to the gradients since, e.g. clamping), also
        skipping if ``grads`` now hold inf/nan; otherwise ``grads`` are unscaled and checked here. Refused before
        anything is applied: a second ``step`` for the optimizer, the still-scaled gradients ``unscale_`` was
        given, an optimizer built with its own ``loss_scale`` or a ``LossScaleOptimizer``, and gradients whose
        shapes are not those of ``optimizer.parameters``, one for one. A list is applied as a tuple. Called from
        Python, an optimizer that raises leaves the iteration as it was, so ``step`` can be called again.
        """
        refuse_non_gradients(grads, "grads")
        if not self._enabled:
            return ops.depend(Tensor(False), optimizer(tuple(grads)))
        if hasattr(optimizer, "get_unscaled_gradients"):
            refuse_loss_scale_optimizer()
        refuse_optimizer_loss_scale(getattr(optimizer, "loss_scale", 1.0))
        parameters = getattr(optimizer, "parameters", None)
        if parameters is None:
            refuse_optimizer_without_parameters()
        refuse_bfloat16_on_cpu(tuple(parameter.dtype for parameter in parameters))
        if not outside_graph(self._states.table):
            refuse_sparse_gradients(grads, "grads")
        self._states.refuse_misfit(grads, parameters)
        grads = _graph_values(self, grads)
        structure = self._states.structure_of(grads)
        slot = self._states.slot(key, structure)
        # Called from Python the stage is read on the host, so only the branch this call takes is compiled.
        before = host_table(self._states.table)
        refuse_related_unscaled(before, slot, structure)
        unscaled = unscaled_in(before, slot)
        to_apply, skipped, code = _run(self, self._iteration.step_decision, grads, slot, structure, unscaled)
        # A refusal shares the optimizer's branch: no extra control flow on a correct step.
        if not skipped:
            if before is None:
                skipped = ops.depend(skipped, optimizer(tuple(to_apply)))
            else:
                skipped = ops.depend(skipped, apply_or_restore(self._states.table, optimizer, tuple(to_apply), before))
        else:
            skipped = ops.depend(skipped, raise_step_misuse(code))
        return skipped

    def update(self, new_scale=None):
        """Update the scale from this iteration's overflows (once per iteration, after every ``step``).

        Backs off if any optimizer's gradients (or a scaled loss) overflowed, grows after the window of clean
        iterations; with ``new_scale`` (PyTorch: a number or a one-value Tensor) sets the scale instead, refused
        unless finite, > 0 and within the rule's bounds. Starts the next iteration. Returns the scaler, so under
        ``mindspore.jit`` (which rebinds the receiver of a method named ``update``) the scaler stays usable.
        """
        if not self._enabled:
            return self
        if new_scale is None:
            _refuse_update_without_checks(self)
            _run(self, self._iteration.update_from_checks)
        else:
            low, high = self._scale_bounds
            # The check on a graph Tensor lives in a function that returns the value the write uses: inline here,
            # an `if` on a Tensor in a method returning `self` made MindSpore 2.10 drop the writes after it.
            if isinstance(new_scale, Tensor) and not outside_graph(self._states.table):
                value = new_scale_in_graph(new_scale, low, high)
            else:
                value = checked_new_scale(new_scale, low, high)
            scale = self._core.scale_value
            ops.assign(scale, ops.cast(value, mstype.float32).reshape(scale.shape))
            self._iteration.restart()
        return self

    def minimize(self, optimizer, grads, key=None):
        """``step(optimizer, grads, key)`` then ``update()`` (Paddle); return True if the step was skipped."""
        skipped = self.step(optimizer, grads, key)
        self.update()
        return skipped

    # ---- queries (host, and reads inside compiled functions) ---------------------------------------
    def is_enable(self):
        """Whether loss scaling is on (Paddle's name; PyTorch's is ``is_enabled``)."""
        return self._enabled

    is_enabled = is_enable

    def is_use_dynamic_loss_scaling(self):
        """Whether the scale is updated dynamically (False when disabled, as Paddle)."""
        _host_only(self, "is_use_dynamic_loss_scaling()")
        return self._enabled and self._core.dynamic

    def get_scale(self):
        """The current scale: eagerly a Python float (one host sync); inside a compiled function a float32 scalar
        Tensor read when the graph runs, so PyTorch's ``inv_scale = 1. / scaler.get_scale()`` follows the scale
        there too. 1.0 when disabled."""
        return self._core.get_scale() if self._enabled else 1.0

    def get_loss_scaling(self):
        """The current scale as a float32 Tensor, as Paddle's (eagerly one host sync, a graph read when compiled)."""
        return scale_tensor(self._core) if self._enabled else Tensor(1.0, mstype.float32)

    def _rule_value(self, field):
        """What the generated getters return: the rule's view (``growth_interval``, ...), eagerly a Python number,
        inside a compiled function a graph read (a setter called after compiling shows there too). A disabled
        scaler has no Parameters: its numbers are the rule's (and its initial scale 1.0, as Paddle's)."""
        if field == "init_scale":
            return self._rule.init_scale if self._enabled else 1.0
        if self._core is None:
            return host_view(self._rule, self._rule.initial_state())[field]
        return self._core.update_cell.read(field)

    def _set_rule(self, **fields):
        """What the generated setters do: change the rule (checked, in this scaler's spelling)."""
        _host_only(self, "set_...() (a setter)")
        rule = framework_rule(fields, self.SPELLING, self._rule)
        if self._enabled:
            state = None
            if "init_scale" in fields:  # as Paddle: the new initial scale is the current scale, counts kept
                state = dict(as_mapping(self._rule, self.get_state()), scale=rule.init_scale)
            self._core.set_rule(rule, state)
        self._rule = rule

    # ---- state (host) -------------------------------------------------------------------------------------------
    def get_state(self):
        """The rule's state, read from the device, in the rule's form (``LossScaleState``, ``AdaptiveState``, ...)."""
        _host_only(self, "get_state()")
        if not self._enabled:
            return self._rule.initial_state()
        return self._core.update_cell.get_state()

    def state_dict(self):
        """The state in this scaler's framework's format, empty when disabled (one host sync): Paddle's ``scale`` (a
        float32 array of shape (1,)), the rule, ``incr_count``, ``decr_count``, ``use_dynamic_loss_scaling``;
        PyTorch's ``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``_growth_tracker``. A rule's
        extras (a hysteresis mode, a window state) are added under their own keys, which the frameworks' own
        ``load_state_dict`` ignore; a rule without a view saves its own state (:mod:`lossscale.frontends.persistence`).
        """
        _host_only(self, "state_dict()")
        if not self._enabled:
            return {}
        return state_dict_of(self.SPELLING, self._rule, self.get_state(), self._core.dynamic)

    def load_state_dict(self, state_dict):
        """Restore a state: this scaler's, Paddle's or PyTorch's format (checked; nothing changes on error). Ignored
        when disabled (as both frameworks). The saved scale also becomes the initial scale (as both do). PyTorch's
        spelling refuses a fixed Paddle state: its scale is always dynamic."""
        _host_only(self, "load_state_dict()")
        if not self._enabled:
            return
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"'state_dict' must be a dict, but got {type(state_dict).__name__}.")
        if not state_dict:
            raise RuntimeError(self.SPELLING.empty_state)
        rule, state, dynamic = parse_state(state_dict, self._rule)
        if not dynamic and self.SPELLING.always_dynamic:
            raise ValueError(
                f"'state_dict['use_dynamic_loss_scaling']' is False, but a {self.SPELLING.framework} GradScaler's "
                f"scale is always dynamic: load a fixed Paddle state into a scaler of Paddle's spelling, "
                f"GradScaler(init_loss_scaling=..., use_dynamic_loss_scaling=False)."
            )
        self._core.set_rule(rule, state, dynamic)
        self._rule = rule

    def __getstate__(self):
        """Pickle between iterations only (as PyTorch): the configuration and the state. An explicit ``name`` comes
        back as given if no living scaler holds it (e.g. in a new process), else as ``name_1``, ..."""
        if self._enabled and not self._states.between_iterations():
            raise RuntimeError(
                "A GradScaler can only be pickled at the beginning of an iteration, or at the end after update()."
            )
        return {"config": self._config, "policy": self._rule, "state": self.state_dict()}

    def __setstate__(self, saved):
        config = dict(saved["config"])
        if config.get("name") is not None:
            config["name"] = free_name(config["name"])
        self.__init__(**config)
        if saved["state"]:
            self.load_state_dict(saved["state"])


def _chosen_rule(spelling, arguments):
    """The rule a constructor's arguments make: ``policy`` (a rule or a preset's name, the rule arguments then left
    at their defaults), else the framework's preset with the arguments given."""
    fields = {
        field: arguments[spelling.name_of(field)] for field in RULE_FIELDS if spelling.name_of(field) in arguments
    }
    if arguments["policy"] is None:
        return framework_rule(fields, spelling, get_preset(spelling.preset))
    changed = [
        spelling.name_of(field)
        for field, value in fields.items()
        if value != spelling.defaults[spelling.name_of(field)]
    ]
    if changed:
        raise ValueError(f"give either 'policy' or the rule arguments ({', '.join(changed)}), not both.")
    return as_rule(arguments["policy"])


def _graph_values(scaler, grads):
    """``grads`` as values the graph computes when they are constants: a plain tuple of Tensors given to a compiled
    function (:func:`lossscale.core.gradients.is_constant`) is multiplied by ``S / S``, exactly 1 but known only when
    the graph runs (with constant gradients and the optimizer given by keyword, MindSpore 2.10 folded their unscaling
    inside step()'s branch into ``(0, 0)``, measured). Other gradients, and every call from Python, pass through.
    (Each helper asks ``outside_graph`` itself: a decision passed on as an argument is no longer a constant there.)"""
    if outside_graph(scaler._states.table) or not gradients.is_constant(grads):
        return grads
    scale = scaler._core.scale_value.reshape(())
    return gradients.multiply_gradients(scaler._states.hyper_map, scale / scale, grads)


def _run(scaler, method, *args):
    """``method(*args)``: inline inside a compiled function; called from Python, compiled once per method and gradient
    structure (:mod:`lossscale.frontends._eager_calls`): a few graphs per eager iteration, not hundreds of kernels."""
    if outside_graph(scaler._states.table):
        return scaler._calls.run(method, *args)
    return method(*args)


def _refuse_update_without_checks(scaler):
    """PyTorch's ``update()`` needs an ``unscale_()`` or ``step()`` since the last one (Paddle's does not). A function
    returning a value: an ``if`` written inline in ``update()``, which returns the scaler, made MindSpore 2.10 drop
    the writes after it (measured)."""
    if scaler._update_needs_checks:
        return scaler._states.refuse_update_without_checks()
    return None


def _host_only(scaler, method):
    """A clear error when a host method is traced into a compiled function (MindSpore's own message would be about
    ``asnumpy`` or an unsupported ``try``). A disabled scaler has no device state: nothing to refuse."""
    if scaler._enabled:
        refuse_host_call_in_graph(method, outside_graph(scaler._states.table))


def _unscale_in_place(given, unscaled):
    """From Python, after a successful ``unscale_``: each given gradient Tensor takes the unscaled values (a swap of
    buffers, no copy), as PyTorch's ``unscale_`` changes ``.grad``. Parameters given as gradients are left alone."""
    for grad, value in zip(given, unscaled):
        if isinstance(grad, Tensor) and not isinstance(grad, Parameter) and grad is not value:
            grad.assign_value(value)


@ms.jit_class
class PaddleGradScaler(GradScaler):
    """Paddle's ``paddle.amp.GradScaler`` alone (``from lossscale.paddle import GradScaler``): the arguments, defaults
    and rule of :class:`GradScaler`, without its turn to PyTorch's spelling.

    Example:
        >>> PaddleGradScaler(init_loss_scaling=8.0).get_scale()
        8.0
    """


@ms.jit_class
class TorchGradScaler(GradScaler):
    """PyTorch's ``torch.amp.GradScaler`` on MindSpore (``from lossscale.torch import GradScaler``).

    Defaults and rule are PyTorch's: the scale starts at 2**16, is multiplied by ``growth_factor`` after
    ``growth_interval`` consecutive iterations without inf/nan, by ``backoff_factor`` on every iteration with one,
    with no floor; growth never produces inf. ``update()`` without an ``unscale_``/``step`` since the last
    ``update`` raises ``AssertionError`` ("No inf checks were recorded prior to update"), as in PyTorch;
    ``update(new_scale)`` needs no checks.

    Args:
        device (str): accepted for PyTorch compatibility (``"cuda"``, ``"cpu"``, ...). The scale lives on
            MindSpore's context device; scaling is never disabled because of it.
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

    SPELLING = TORCH


def _getter(name, field):
    """``get_<name>``: the rule's ``field`` (graph-readable)."""

    def get(self):
        return self._rule_value(field)

    get.__name__ = get.__qualname__ = f"get_{name}"
    get.__doc__ = f"The rule's {_FIELD_DOCS[field]}: eagerly a number, inside a compiled function a graph read."
    return get


def _setter(name, field):
    """``set_<name>(new_<name>)``: set the rule's ``field`` (host)."""
    method, argument = f"set_{name}", f"new_{name}"
    signature = inspect.Signature([inspect.Parameter(argument, inspect.Parameter.POSITIONAL_OR_KEYWORD)])

    def set_value(self, *args, **kwargs):
        _host_only(self, f"{method}()")  # first: traced into a compiled function, nothing below is
        self._set_rule(**{field: _bound_value(signature, method, args, kwargs)})

    set_value.__name__ = set_value.__qualname__ = method
    set_value.__doc__ = f"Set {_FIELD_DOCS[field]} (validated; nothing changes on error)."
    set_value.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *signature.parameters.values()]
    )
    return set_value


def _bound_value(signature, method, args, kwargs):
    """The one argument of a call ``method(*args, **kwargs)`` of ``signature``; Python's ``TypeError`` otherwise."""
    try:
        return next(iter(signature.bind(*args, **kwargs).arguments.values()))
    except TypeError as error:
        raise TypeError(f"{method}() {error}") from None


# Both frameworks' accessors on every GradScaler (a Paddle scaler answers PyTorch's getters too), from the tables.
for _spelling in (PADDLE, TORCH):
    for _name, _field in _spelling.accessors.items():
        setattr(GradScaler, f"get_{_name}", _getter(_name, _field))
        setattr(GradScaler, f"set_{_name}", _setter(_name, _field))
GradScaler.__signature__ = PaddleGradScaler.__signature__ = PADDLE.signature()
TorchGradScaler.__signature__ = TORCH.signature()
