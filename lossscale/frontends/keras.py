"""``LossScaleOptimizer``: tf.keras' loss-scaling optimizer wrapper (Keras 2's API) on the core (docs/design.md, 6).

The default rule is tf.keras' (``get_preset("tf_keras")``): the scale doubles after ``dynamic_growth_steps``
finite steps and halves, floored at 1, on a non-finite one; it never grows to inf. Both scaling calls are checked
per iteration: ``apply_gradients`` refuses gradients of a scaled loss that were not unscaled and gradients unscaled
without a scaled loss, before anything is applied. A skipped step leaves weights and moments unchanged; as in
tf.keras the step counter (``global_step``, Keras' ``iterations``) still advances.

Example (Keras' recipe with MindSpore)::

    def forward(x):
        return opt.get_scaled_loss(loss_fn(net(x)))
    scaled_loss, grads = mindspore.value_and_grad(forward, None, opt.parameters)(x)
    opt.apply_gradients(opt.get_unscaled_gradients(grads))   # skipped on inf/nan; scale updated here
"""

import re
import weakref

import mindspore as ms
from mindspore import Parameter, Tensor, mutable, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale.core._naming import claim_name
from lossscale.core._optimizers import check_optimizer_loss_scale, is_parameter_optimizer, refuse_bfloat16_on_cpu
from lossscale.core._parameters import outside_graph
from lossscale.core._validation import TypeValueError
from lossscale.core._warnings import warn_at_caller
from lossscale.core.parallel import gradient_reducer
from lossscale.core.presets import get_preset
from lossscale.core.scaler import (
    LossScaler,
    apply_rule,
    positive_scale,
    scale_tensor,
    warn_if_scaled_outside_differentiation,
)
from lossscale.frontends.inner_optimizer import forwarded, refuse_shadowing, set_learning_rate
from lossscale.frontends.persistence import as_rule, framework_rule
from lossscale.frontends.refusals import (
    refuse_non_gradients,
    refuse_non_sequence,
    refuse_non_tensor_entries,
    refuse_sparse_gradients,
    refuse_undetermined_gradients,
)
from lossscale.frontends.spelling import KERAS, KERAS_DEFAULTS

# Keras 3 refuses these on the wrapper and tells the user to set them on the inner optimizer.
_INNER_OPTIMIZER_ARGUMENTS = (
    "weight_decay",
    "clipnorm",
    "global_clipnorm",
    "clipvalue",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)


def _pytorch_style_hint(optimizer):
    """What to use instead of a PyTorch-style optimizer (``mindspore.experimental.optim``, ``mint.optim``)."""
    if not is_parameter_optimizer(optimizer):
        return ""
    return (
        " MindSpore's PyTorch-style optimizers (mindspore.experimental.optim, mint.optim) have no global_step "
        "(Keras' iterations, which a skipped step advances): use lossscale.GradScaler with them, or the "
        "train cell."
    )


def _refuse_unsupported_arguments(inner_optimizer, kwargs):
    """Keras 3's ValueErrors for keyword arguments the wrapper does not take."""
    # MindSpore's optimizers record their constructor arguments (except params and learning_rate) in init_args.
    own = set(getattr(inner_optimizer, "init_args", {})) | {"learning_rate"}
    for name in kwargs:
        if name in _INNER_OPTIMIZER_ARGUMENTS or name in own:
            raise TypeValueError(
                f"LossScaleOptimizer does not support `{name}`. Instead, set `{name}` on the `inner_optimizer`."
            )
    if kwargs:
        raise TypeValueError(f"LossScaleOptimizer does not support arguments: `{'`, `'.join(kwargs)}`.")


def _keras_rule(dynamic, initial_scale, dynamic_growth_steps, policy):
    """A LossScalePolicy (dynamic) or a float (fixed) from Keras' arguments; ValueError for anything invalid."""
    if not isinstance(dynamic, bool):
        raise TypeValueError(f"'dynamic' must be a bool, but got {dynamic!r}.")
    if policy is not None:
        if not dynamic or initial_scale is not None or dynamic_growth_steps is not None:
            raise ValueError("give either 'policy' or 'dynamic'/'initial_scale'/'dynamic_growth_steps', not both.")
        try:
            return as_rule(policy)
        except TypeError as error:
            raise TypeValueError(str(error)) from None
    if not dynamic:
        if initial_scale is None:
            raise ValueError("'initial_scale' must be specified if 'dynamic' is False: it is the fixed loss scale.")
        if dynamic_growth_steps is not None:
            raise ValueError(
                f"'dynamic_growth_steps' must be None if 'dynamic' is False, but got {dynamic_growth_steps!r}."
            )
        try:
            return float(positive_scale("initial_scale", initial_scale))
        except TypeError as error:
            raise ValueError(str(error)) from None
    given = {"init_scale": initial_scale, "growth_interval": dynamic_growth_steps}
    fields = {name: KERAS_DEFAULTS[name] if value is None else value for name, value in given.items()}
    try:
        return framework_rule(fields, KERAS, get_preset(KERAS.preset))
    except TypeError as error:
        raise ValueError(str(error)) from None


def _require_optimizer_parameters(argument, variables, parameters):
    """ValueError unless ``variables`` are ``parameters`` (the inner optimizer's), the same objects in the same
    order: a MindSpore optimizer is bound to the parameters it was built with and applies its i-th gradient to
    its i-th parameter, so another order (a group-parameter optimizer lists its groups in turn) would update
    each parameter with another one's gradient."""
    if [id(variable) for variable in variables] != [id(parameter) for parameter in parameters]:
        if variables and not any(isinstance(variable, Parameter) for variable in variables):
            raise ValueError(
                f"the variables of '{argument}' are plain Tensors, not the inner optimizer's "
                f"Parameters, so their order cannot be checked (mindspore.jit(capture_mode='bytecode') "
                f"passes Parameters as Tensors). Pass the gradients alone, in the order of "
                f"opt.parameters, or compile with the default capture_mode='ast'."
            )
        given = [getattr(variable, "name", type(variable).__name__) for variable in variables]
        expected = [parameter.name for parameter in parameters]
        raise ValueError(
            f"'{argument}' must be the inner optimizer's parameters, in order (a MindSpore optimizer is "
            f"bound to the parameters it was built with): expected {expected}, but got {given}. Pass "
            f"them in the order of opt.parameters."
        )


def _check_variables(argument, variables, parameters):
    """The variables given as ``argument`` (those of Keras' ``(gradient, variable)`` pairs, or ``minimize``'s
    ``var_list``) against the inner optimizer's parameters: from Python, the same objects in order. Inside a
    compiled function a Parameter's identity is not visible and nothing is checked here: MindSpore refuses
    gradients whose shapes do not fit the optimizer while compiling, before anything runs (a shape check here
    would only add compile time). Eager or compiled: :func:`lossscale.core._parameters.outside_graph`."""
    if not variables or outside_graph(variables[0]):  # none at all is wrong anywhere
        _require_optimizer_parameters(argument, variables, parameters)
    return True


def _refuse_non_pairs(items, argument):
    """TypeError unless every entry of ``items`` is a ``(gradient, variable)`` pair (gradients nested as
    ``mindspore.value_and_grad`` with ``grad_position`` and ``weights`` returns them are not)."""
    for index, pair in enumerate(items):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"'{argument}' holds (gradient, variable) pairs (its first entry is a tuple or list), but "
                f"entry {index} is not a pair of two. Gradients nested as mindspore.value_and_grad with "
                f"grad_position and weights returns them, (inputs' gradients, weights' gradients): pass "
                f"the second."
            )
    return True


def _gradients_of(grads_and_vars, parameters, argument):
    """Gradients from ``argument``, a tuple/list of gradients or of ``(gradient, variable)`` pairs (Keras' form),
    whose variables must be ``parameters`` in order (see :func:`_check_variables`)."""
    if not isinstance(grads_and_vars, (Tensor, nn.Cell, tuple, list)) and hasattr(grads_and_vars, "__iter__"):
        grads_and_vars = tuple(grads_and_vars)  # Keras' zip(grads, variables)
    refuse_non_sequence(grads_and_vars, argument)
    items = tuple(grads_and_vars)
    in_graph = bool(items) and not outside_graph(parameters[0])
    if in_graph:  # first: the pairs test below fails on gradients MindSpore left undetermined (sparse ones)
        refuse_undetermined_gradients(items, argument)
    if items and isinstance(items[0], (tuple, list)):
        _refuse_non_pairs(items, argument)
        _check_variables(argument, tuple(pair[1] for pair in items), parameters)
        items = tuple(pair[0] for pair in items)
    refuse_non_tensor_entries(items, argument)
    if in_graph:
        refuse_sparse_gradients(items, argument)
    for index, grad in enumerate(items):
        if grad is None:
            raise ValueError(f"gradient {index} is None: MindSpore optimizers need a gradient for every parameter.")
    return items


_APPLY_OPTIONS = {"name": (str, type(None)), "experimental_aggregate_gradients": (bool,)}


@constexpr
def _check_apply_options(skip_gradients_aggregation, options):
    """TypeError, while tracing inside a graph, unless the options of tf.keras' ``apply_gradients`` are of their
    types and known (an unknown or misspelt keyword would change nothing without a word).

    Example:
        >>> _check_apply_options(True, {"name": "step"})
        True
    """
    if not isinstance(skip_gradients_aggregation, bool):
        raise TypeError(
            f"'skip_gradients_aggregation' must be a bool, but got "
            f"{type(skip_gradients_aggregation).__name__} {skip_gradients_aggregation!r}."
        )
    for name, value in options.items():
        if name not in _APPLY_OPTIONS:
            known = " and ".join(map(repr, _APPLY_OPTIONS))
            raise TypeError(
                f"apply_gradients() got an unexpected keyword argument {name!r}: it takes "
                f"'skip_gradients_aggregation' and, as tf.keras, {known}."
            )
        if not isinstance(value, _APPLY_OPTIONS[name]):
            expected = " or ".join("None" if kind is type(None) else kind.__name__ for kind in _APPLY_OPTIONS[name])
            raise TypeError(f"'{name}' must be a {expected}, but got {type(value).__name__} {value!r}.")
    return True


def _variable(grads):
    """``grads`` (a tuple or list of Tensors, given from Python) as a ``mindspore.mutable`` tuple.

    A plain tuple of Tensors is a compile-time constant to MindSpore 2.10: the Cell would be compiled again
    for every new value and its checks folded at compile time."""
    if isinstance(grads, (tuple, list)) and grads and all(isinstance(grad, Tensor) for grad in grads):
        return mutable(tuple(grads))
    return grads


class _IterationFlags(nn.Cell):
    """This iteration's scaling calls (Parameters, shared by eager and compiled code)."""

    def __init__(self, prefix):
        super().__init__(auto_prefix=False)
        self.loss_scaled = Parameter(Tensor(False), name=f"{prefix}.loss_scaled", requires_grad=False)
        self.grads_unscaled = Parameter(Tensor(False), name=f"{prefix}.grads_unscaled", requires_grad=False)
        self._usage_checked = False

    def record_scaled(self):
        return ops.assign(self.loss_scaled, Tensor(True))

    def record_unscaled(self):
        return ops.assign(self.grads_unscaled, Tensor(True))

    def refuse_mismatch(self):
        if ops.logical_and(self.loss_scaled, ops.logical_not(self.grads_unscaled)):
            raise RuntimeError(
                "apply_gradients() got the gradients of a scaled loss without get_unscaled_gradients(): "
                "they are loss_scale times too large. Pass opt.get_unscaled_gradients(grads)."
            )
        if ops.logical_and(self.grads_unscaled, ops.logical_not(self.loss_scaled)):
            raise RuntimeError(
                "apply_gradients() got gradients unscaled with get_unscaled_gradients() but the loss was "
                "not scaled with get_scaled_loss(): they are 1/loss_scale of the true gradients."
            )
        return self.loss_scaled

    def reset(self):
        ops.assign(self.loss_scaled, Tensor(False))
        return ops.assign(self.grads_unscaled, Tensor(False))

    def warn_once_without_scaling(self):
        """Host, first call from Python only (one read): warn if neither scaling call was made."""
        if self._usage_checked:
            return
        self._usage_checked = True
        if not (bool(self.loss_scaled.asnumpy()) or bool(self.grads_unscaled.asnumpy())):
            warn_at_caller(
                "LossScaleOptimizer applied gradients without get_scaled_loss() and "
                "get_unscaled_gradients(): the loss is not scaled, so float16 gradients can underflow. "
                "Scale the loss with get_scaled_loss() and unscale the gradients with "
                "get_unscaled_gradients(), or use minimize().",
                UserWarning,
            )


_APPLY_STEPS = weakref.WeakValueDictionary()  # id -> _ApplyGradients, for the check when a step is compiled


@constexpr
def _check_state_when_compiled(key):
    """While a step is compiled (before its first run): the wrapper's state check, a host read. A checkpoint is
    loaded before training starts, so the step compiled then sees it."""
    apply_step = _APPLY_STEPS.get(key)
    if apply_step is not None:
        apply_step.check_state()
    return True


class _ApplyGradients(nn.Cell):
    """The apply step: skip or apply, update the scale, start the next iteration.

    A child Cell, so ``apply_gradients`` can call it both from Python (compiled, with the host
    check of :meth:`_IterationFlags.warn_once_without_scaling`) and inside ``mindspore.jit``.
    """

    def __init__(self, core, inner, flags):
        super().__init__(auto_prefix=False)
        self.core = core
        self.inner = inner
        self.flags = flags
        self._one = Tensor(1, mstype.int32)
        self._key = id(self)
        _APPLY_STEPS[self._key] = self

    def check_state(self):
        """Host: ``ValueError`` if the dynamic rule's counters (as a checkpoint left them) are outside this rule's
        ranges: a state saved by a wrapper with another ``dynamic_growth_steps`` or hysteresis. One host sync."""
        cell = self.core.update_cell
        if cell is None or not self.core.dynamic:
            return
        try:
            cell.check_loaded_state(scale_name=self.core.scale_value.name)
        except ValueError as error:
            window = cell.read("growth_interval")
            here = cell.rule.describe() if window is None else f"dynamic_growth_steps={window}"
            raise ValueError(
                f"{error} The loaded state was saved by a wrapper with another rule ({here} here): load a checkpoint "
                f"of the same configuration."
            ) from None

    @ms.jit  # from Python in PyNative mode too: one graph, not each kernel in turn
    def construct(self, grads):
        _check_state_when_compiled(self._key)
        self.flags.refuse_mismatch()
        overflow = self.core.is_overflow(self.core.flag(None, grads))
        if not overflow:
            overflow = ops.depend(overflow, self.inner(grads))
        else:  # tf.keras: the optimizer's step counter advances on a skipped step too
            overflow = ops.depend(overflow, ops.assign_add(self.inner.global_step, self._one))
        overflow = apply_rule(self.core, overflow, self.core.statistics(grads))
        self.flags.reset()
        return overflow

    def __call__(self, grads):
        self.flags.warn_once_without_scaling()
        # Refused here, from Python (a host read), so the compiled construct never raises: on MindSpore 2.10 a
        # compiled Cell that raised fails at every later call (measured in GRAPH_MODE).
        self.flags.refuse_mismatch()
        return super().__call__(_variable(grads))


def _default_name(inner_optimizer):
    """The default prefix of a wrapper's Parameter names, from the first parameter its inner optimizer updates
    (``loss_scale_optimizer.fc1.weight``): a checkpoint then restores each wrapper's scale into the wrapper of the
    same optimizer, whatever order the wrappers are built in."""
    parameters = inner_optimizer.parameters
    if not parameters:
        return "loss_scale_optimizer"
    return "loss_scale_optimizer." + re.sub(r"[^A-Za-z0-9_.]", "_", parameters[0].name)


def _held_inner(wrapper):
    """The inner optimizer a wrapper holds among its cells (None while it is being built)."""
    return vars(wrapper).get("_cells", {}).get("_inner")


class LossScaleOptimizer(nn.Cell):
    """Wrap a MindSpore optimizer with (dynamic) loss scaling, as ``tf.keras.mixed_precision.LossScaleOptimizer``.

    Args:
        inner_optimizer (nn.Optimizer): the optimizer to wrap (once; built without ``loss_scale``).
        dynamic (bool): dynamic loss scaling (default True) or a fixed scale.
        initial_scale (float): the initial scale; default 2**15 when dynamic; required
            when ``dynamic=False`` (it is then the fixed scale).
        dynamic_growth_steps (int): consecutive finite steps per doubling; default 2000.

    Keyword Args:
        policy (LossScalePolicy, AdaptiveWindowRule or str): another rule (see :mod:`lossscale.core.presets`).
        overflow_check (str or check Cell): the backend check; default the device target's.
        name (str): prefix of this wrapper's Parameter names; default ``loss_scale_optimizer.`` and the name
            of the inner optimizer's first parameter (``_1``, ``_2``, ... appended while another wrapper
            holds it).

    Raises:
        ValueError: for any invalid argument (as Keras documents), including keyword arguments
            of the inner optimizer (set them there) and an inner optimizer with its own
            ``loss_scale``. Where tf.keras' code raises ``TypeError`` (a non-bool ``dynamic``,
            an inner optimizer of the wrong type or a wrapper, an unknown keyword) the error is
            also a ``TypeError``.

    Calling the wrapper (or :meth:`apply_gradients`) with *unscaled* gradients applies them
    unless one is inf/nan (as every gradient of a non-finite scaled loss is), then updates the
    scale; it returns True when the step was skipped. Hyperparameters (``learning_rate``,
    ``beta1``, ``parameters``, ...) are read from the inner optimizer; ``learning_rate`` (alias
    ``lr``) can be set. Setting another attribute the inner optimizer has (``opt.beta1 = 0.7``,
    which tf.keras forwards) raises ``AttributeError``: give it to the inner optimizer when
    building it.

    Example:
        >>> from mindspore import nn
        >>> opt = LossScaleOptimizer(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.25))
        >>> opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps, float(opt.loss_scale)
        (True, 32768.0, 2000, 32768.0)
    """

    def __init__(
        self,
        inner_optimizer,
        dynamic=True,
        initial_scale=None,
        dynamic_growth_steps=None,
        *,
        policy=None,
        overflow_check=None,
        name=None,
        **kwargs,
    ):
        super().__init__(auto_prefix=False)
        _refuse_unsupported_arguments(inner_optimizer, kwargs)
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeValueError(
                "LossScaleOptimizer cannot wrap another LossScaleOptimizer: wrap its inner_optimizer instead."
            )
        if not isinstance(inner_optimizer, nn.Optimizer):
            raise TypeValueError(
                f"'inner_optimizer' must be a mindspore.nn.Optimizer, but got "
                f"{type(inner_optimizer).__name__}.{_pytorch_style_hint(inner_optimizer)}"
            )
        if getattr(inner_optimizer, "_wrapped_by_loss_scale_optimizer", False):
            raise ValueError(
                "'inner_optimizer' is already wrapped by a LossScaleOptimizer. An optimizer can only be "
                "wrapped by a single LossScaleOptimizer."
            )
        check_optimizer_loss_scale(inner_optimizer)
        refuse_bfloat16_on_cpu(tuple(parameter.dtype for parameter in inner_optimizer.parameters), "inner_optimizer")
        rule = _keras_rule(dynamic, initial_scale, dynamic_growth_steps, policy)
        prefix = claim_name(name, self, _default_name(inner_optimizer))
        # A fixed scale is a constant, as in tf.keras: no checkpoint of another wrapper can change it.
        self._core = LossScaler(rule, name=prefix, overflow_check=overflow_check, frozen=not dynamic)
        self._dynamic = dynamic
        self._initial_scale = rule.init_scale if dynamic else rule
        self._inner = inner_optimizer
        inner_optimizer._wrapped_by_loss_scale_optimizer = True
        self._iteration = _IterationFlags(prefix)
        self._apply_step = _ApplyGradients(self._core, inner_optimizer, self._iteration)
        # minimize() computes the gradients itself, so it reduces them over the ranks (data parallel) itself.
        self._grad_reducer = gradient_reducer(inner_optimizer.parameters)

    # ---- the inner optimizer's attributes (lossscale.frontends.inner_optimizer) -------------------------------
    inner_optimizer = property(lambda self: self._inner, doc="The wrapped optimizer.")
    iterations = property(
        lambda self: self._inner.global_step, doc="The inner optimizer's step counter (``global_step``), Keras' name."
    )
    learning_rate = property(
        lambda self: self._inner.learning_rate,
        lambda self, value: set_learning_rate(self._inner, value),
        doc="The inner optimizer's learning rate (delegated; settable, also as ``lr``).",
    )
    lr = learning_rate

    def __setattr__(self, name, value):
        if name in ("learning_rate", "lr"):  # not nn.Cell's Parameter registration: set the inner optimizer's
            object.__setattr__(self, name, value)
            return
        refuse_shadowing(self, _held_inner(self), name)
        super().__setattr__(name, value)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = _held_inner(self)
            if inner is None or name.startswith("__"):
                raise
        return forwarded(self, inner, name)

    # ---- Keras API (graph ops: eager or inside mindspore.jit) -------------------------------------
    def get_scaled_loss(self, loss):
        """``loss * loss_scale`` (promoted to at least float32); a callable returns a callable doing that.

        A non-finite loss is multiplied by nan instead, so every gradient computed from it is nan and
        ``apply_gradients`` skips them; nothing is recorded for a later iteration. Called from Python
        outside a function being differentiated, it warns: that scaled loss carries no gradients."""
        if not isinstance(loss, (Tensor, tuple, list)):
            if outside_graph(self._iteration.loss_scaled) and not callable(loss):  # (no callable() in graph syntax)
                raise ValueError(f"'loss' must be a Tensor or a callable returning one, but got {type(loss).__name__}.")

            def scaled_loss():
                return self.get_scaled_loss(loss())

            return scaled_loss
        if not self._dynamic:  # a fixed scale is a constant of the core: the core cannot tell Python from a graph
            warn_if_scaled_outside_differentiation(self._iteration.loss_scaled)
        scaled = self._core.scale(loss)
        self._iteration.record_scaled()
        return scaled

    def get_unscaled_gradients(self, grads):
        """Every gradient divided by the loss scale (in float32); None entries are passed through."""
        # allow_empty positional: a constexpr called with a keyword inside mindspore.jit receives {name: value} as its
        # next positional argument instead (MindSpore 2.7.1 and 2.10, measured).
        refuse_non_gradients(grads, "grads", True)  # Keras returns [] for []
        if not outside_graph(self._iteration.loss_scaled):
            refuse_sparse_gradients(grads, "grads")
        unscaled = self._core.unscale(grads)
        self._iteration.record_unscaled()
        return unscaled

    def construct(self, grads):
        return self._apply_step(_gradients_of(grads, self._inner.parameters, "grads"))

    def __call__(self, grads):
        # Checked before the warning (construct checks compiled calls): one Tensor, None entries, Keras' pairs.
        grads = _gradients_of(grads, self._inner.parameters, "grads")
        self._iteration.warn_once_without_scaling()
        self._iteration.refuse_mismatch()  # from Python, as in _ApplyGradients.__call__
        return super().__call__(_variable(grads))

    def apply_gradients(self, grads_and_vars, skip_gradients_aggregation=False, **kwargs):
        """Apply unscaled gradients (a tuple, or Keras' ``(gradient, variable)`` pairs) unless one is inf/nan,
        then update the scale; return True if the step was skipped.

        The pairs' variables must be the inner optimizer's parameters, all of them, in its order
        (``opt.parameters``): a MindSpore optimizer applies its i-th gradient to its i-th parameter.
        From Python they are checked by identity (``ValueError`` before anything is applied); inside
        a compiled function they cannot be, and MindSpore refuses only gradients whose shapes do not
        fit the optimizer (while compiling).

        tf.keras' signature: ``skip_gradients_aggregation`` (a bool) and the keywords ``name`` (a str)
        and ``experimental_aggregate_gradients`` (a bool) are accepted and change nothing, since this
        method never reduces the gradients over the ranks (under data parallel the caller reduces
        them, as for any MindSpore optimizer; :meth:`minimize` reduces them itself). Any other keyword
        is a ``TypeError``, raised before anything is applied (tf.keras ignores unknown keywords)."""
        _check_apply_options(skip_gradients_aggregation, kwargs)
        return self._apply_step(_gradients_of(grads_and_vars, self._inner.parameters, "grads_and_vars"))

    def minimize(self, loss, var_list=None):
        """Keras' ``minimize``: scale ``loss()`` (a callable), differentiate, unscale, apply, update the scale.

        ``var_list``, if given, must be the inner optimizer's parameters (a MindSpore
        optimizer is bound to them). Under data parallel the gradients are reduced over the
        ranks first, as MindSpore's ``TrainOneStepCell`` does (with ``apply_gradients`` the
        caller reduces them). Returns True if the step was skipped.
        """
        return self.apply_gradients(self._gradients(loss, var_list, "var_list"))

    def get_gradients(self, loss, params=None):
        """Keras' ``get_gradients``: the gradients of ``loss()`` (a callable) for the inner optimizer's parameters,
        computed from the scaled loss and unscaled (float32 arithmetic), as a tuple in ``opt.parameters``' order.

        Pass them to :meth:`apply_gradients` (directly or as Keras' pairs with ``params``), which skips the step
        if one is inf/nan and updates the scale. ``params``, if given, must be the inner optimizer's parameters
        in its order, as ``var_list`` in :meth:`minimize`. A loss Tensor is a ``ValueError``: MindSpore
        differentiates a function, not a value computed before. Under data parallel the gradients are reduced
        over the ranks (the gradients this wrapper computes, it reduces; see :meth:`minimize`).

        Example:
            >>> import numpy as np
            >>> from mindspore import nn
            >>> class Loss(nn.Cell):                  # the forward pass, here a Cell taking no inputs
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
            ...         self.x = Tensor(np.ones((1, 2), np.float32))
            ...     def construct(self):
            ...         return self.net(self.x).sum()
            >>> loss = Loss()
            >>> opt = LossScaleOptimizer(nn.SGD(loss.trainable_params(), 0.5))
            >>> grads = opt.get_gradients(loss, opt.parameters)
            >>> [g.asnumpy().tolist() for g in grads]
            [[[1.0, 1.0]], [1.0]]
            >>> bool(opt.apply_gradients(zip(grads, opt.parameters)).asnumpy()), loss.net.weight.asnumpy().tolist()
            (False, [[0.5, 0.5]])
        """
        return self._gradients(loss, params, "params")

    def compute_gradients(self, loss, var_list=None, tape=None):
        """Keras' ``compute_gradients`` (tf.keras 2.11+): :meth:`get_gradients` as a list of ``(gradient,
        variable)`` pairs, the variables being the inner optimizer's parameters. ``tape`` must be None (MindSpore
        has no gradient tape: it differentiates the callable ``loss``).

        Example (``loss`` and ``opt`` as in :meth:`get_gradients`'s)::

            skipped = opt.apply_gradients(opt.compute_gradients(loss, opt.parameters))
        """
        if tape is not None:
            raise ValueError(
                f"'tape' must be None, but got {type(tape).__name__}: MindSpore has no gradient tape, "
                f"it differentiates the callable 'loss' (pass the forward pass as a function)."
            )
        return list(zip(self._gradients(loss, var_list, "var_list"), self._inner.parameters))

    def _gradients(self, loss, variables, argument):
        """The unscaled gradients of the callable ``loss`` for the inner optimizer's parameters, reduced over the
        ranks under data parallel; ``variables`` (named ``argument`` in errors), if given, checked against them."""
        parameters = self._inner.parameters
        if outside_graph(parameters[0]) and not callable(loss):  # (MindSpore's graph syntax has no callable())
            raise ValueError(
                f"'loss' must be a callable returning the loss, but got {type(loss).__name__}: "
                f"MindSpore differentiates a function, so pass the forward pass, e.g. lambda: "
                f"loss_fn(net(x), y)."
            )
        if variables is not None:
            _check_variables(
                argument, tuple(variables) if isinstance(variables, (list, tuple)) else (variables,), parameters
            )

        def scaled_loss():
            return self.get_scaled_loss(loss())

        _, grads = ms.value_and_grad(scaled_loss, None, parameters)()
        return self.get_unscaled_gradients(self._grad_reducer(grads))

    # ---- properties ------------------------------------------------------------------------------
    @property
    def loss_scale(self):
        """The current loss scale as a float32 scalar Tensor (eagerly one host sync, a graph read when compiled)."""
        return scale_tensor(self._core)

    @property
    def policy(self):
        """The dynamic rule (a :class:`lossscale.core.policy.LossScalePolicy`, or MindFormers' adaptive
        :class:`lossscale.core.adaptive.AdaptiveWindowRule`), or None for a fixed scale."""
        return self._core.rule if self._dynamic else None

    dynamic = property(lambda self: self._dynamic, doc="Whether the loss scale is updated dynamically.")

    @property
    def dynamic_counter(self):
        """Consecutive finite steps since the scale last changed (None if not dynamic): eagerly an int (one sync),
        inside a compiled function a graph read (an int32 Tensor)."""
        return self._core.update_cell.read("good_steps") if self._dynamic else None

    def check_state(self):
        """Raise ``ValueError`` if the scale state does not fit this wrapper's rule: a checkpoint loaded with
        ``load_param_into_net`` from a wrapper with another ``dynamic_growth_steps``, say. Runs by itself when a
        step is compiled (its first call); call it after loading into a wrapper whose steps already ran. One
        host sync."""
        self._apply_step.check_state()

    @property
    def dynamic_growth_steps(self):
        """Finite steps per growth (None if not dynamic); with MindFormers' adaptive rule, the current window (one
        host sync)."""
        return self._core.update_cell.read("growth_interval") if self._dynamic else None

    def state_dict(self):
        """The scale and the rule's counters as Python numbers (one host sync): ``{'loss_scale', 'good_steps',
        'hysteresis_left'}`` for a dynamic rule, MindFormers' window state for its adaptive rule
        (:meth:`lossscale.AdaptiveLossScaleUpdateCell.state_dict`), ``{'loss_scale'}`` when fixed. Not tf.keras' API
        (its state lives in variables, as here in the wrapper's Parameters, which checkpoints save)."""
        return self._core.state_dict()

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict` output (validated against this wrapper's rule; nothing changes on error). A
        fixed wrapper's state must hold its scale."""
        self._core.load_state_dict(state_dict)

    initial_scale = property(
        lambda self: self._initial_scale, doc="The initial loss scale (the fixed scale when not dynamic)."
    )
