"""How each framework spells its loss scaler, written once: one frozen record per API (PyTorch, Paddle, tf.keras).

A record holds the constructor's arguments with their defaults (in order), the framework's names for what a rule's
view says (:meth:`lossscale.core.rule.LossScaleRule.view`: ``init_scale``, ``growth_factor``, ...), the keys of its
state dict and its accessors. The front-ends bind their arguments, build their rule, name their errors, save and load
their state and generate their accessors from it. MindSpore's and MindFormers' are in :mod:`lossscale.core.spelling`.

Example:
    >>> PADDLE.defaults["incr_every_n_steps"], TORCH.defaults["growth_interval"], PADDLE.name_of("growth_factor")
    (1000, 2000, 'incr_ratio')
    >>> spelling_of(("cuda",), {}) is TORCH, spelling_of((), {"init_loss_scaling": 8.0}) is PADDLE
    (True, True)
"""

import inspect
from dataclasses import dataclass
from types import MappingProxyType

# What a framework's arguments and accessors name of a rule (the rest of the rule comes from its preset).
RULE_FIELDS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis")
# Keyword-only arguments of every GradScaler (lossscale's own).
KEYWORD_DEFAULTS = MappingProxyType({"policy": None, "overflow_check": None, "name": None})


@dataclass(frozen=True)
class Spelling:
    """One framework's loss-scaler API.

    Attributes:
        framework (str): its name in messages.
        preset (str): the :mod:`lossscale.core.presets` rule its arguments adjust.
        arguments (tuple): ``(name, default)`` of the positional-or-keyword arguments, in order.
        fields (Mapping): a view's name -> the framework's (arguments, errors, state keys).
        enabled (str): the argument that turns scaling on or off.
        state_keys (tuple): the keys its state dict always has.
        counter_keys (tuple): its keys of a view's ``good_steps`` and ``bad_steps`` (PyTorch's second is
            lossscale's, saved only for a rule with hysteresis).
        hysteresis_saved (bool): whether its state dicts always hold the hysteresis (Paddle's do).
        implied (Mapping): the extras a rule's view adds that its own state dicts leave out (they imply them).
        accessors (Mapping): ``get_<name>``/``set_<name>`` accessor name -> view name.
        empty_state (str): its error for an empty state dict in ``load_state_dict``.
        always_dynamic (bool): its scale is always dynamic (no fixed state; Paddle's saves
            ``use_dynamic_loss_scaling``).
        update_needs_checks (bool): ``update()`` without an ``unscale_``/``step`` since the last one asserts.
        scale_as_array (bool): its state dict holds the scale as a float32 array of shape (1,) (Paddle's).
        ignored (tuple): keys a load accepts and ignores (lossscale 0.1.0's ``init_loss_scaling``); any other key
            no rule of the scaler knows is refused: it was saved with another rule.
    """

    framework: str
    preset: str
    arguments: tuple
    fields: MappingProxyType
    enabled: str
    state_keys: tuple
    counter_keys: tuple
    hysteresis_saved: bool
    implied: MappingProxyType
    accessors: MappingProxyType
    empty_state: str = ""
    always_dynamic: bool = False
    update_needs_checks: bool = False
    scale_as_array: bool = False
    ignored: tuple = ()

    @property
    def defaults(self):
        """``{argument: default}`` of the positional-or-keyword arguments."""
        return dict(self.arguments)

    def name_of(self, field):
        """The framework's name for the view's ``field``."""
        return self.fields.get(field, field)

    def bind(self, args, kwargs, cls_name):
        """``{argument: value}`` of a call ``cls_name(*args, **kwargs)``, defaults filled in; Python's ``TypeError``
        for a call that does not fit the signature."""
        try:
            bound = self.signature().bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{cls_name}() {error}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def signature(self):
        """The constructor's signature, ``self`` left out (what ``inspect.signature`` of the class shows)."""
        positional = [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
            for name, default in self.arguments
        ]
        keywords = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for name, default in KEYWORD_DEFAULTS.items()
        ]
        return inspect.Signature(positional + keywords)


_EMPTY = "state dict is empty, possibly because it was saved from a disabled instance of GradScaler."

PADDLE = Spelling(
    framework="Paddle",
    preset="paddle",
    arguments=(
        ("enable", True),
        ("init_loss_scaling", 32768.0),
        ("incr_ratio", 2.0),
        ("decr_ratio", 0.5),
        ("incr_every_n_steps", 1000),
        ("decr_every_n_nan_or_inf", 2),
        ("use_dynamic_loss_scaling", True),
    ),
    fields=MappingProxyType(
        {
            "init_scale": "init_loss_scaling",
            "growth_factor": "incr_ratio",
            "backoff_factor": "decr_ratio",
            "growth_interval": "incr_every_n_steps",
            "hysteresis": "decr_every_n_nan_or_inf",
        }
    ),
    enabled="enable",
    state_keys=(
        "scale",
        "incr_ratio",
        "decr_ratio",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_count",
        "decr_count",
        "use_dynamic_loss_scaling",
    ),
    counter_keys=("incr_count", "decr_count"),
    hysteresis_saved=True,
    implied=MappingProxyType({"consecutive_hysteresis": True, "refill_hysteresis_on_backoff": True}),
    accessors=MappingProxyType(
        {
            "init_loss_scaling": "init_scale",
            "incr_ratio": "growth_factor",
            "decr_ratio": "backoff_factor",
            "incr_every_n_steps": "growth_interval",
            "decr_every_n_nan_or_inf": "hysteresis",
        }
    ),
    empty_state="The input " + _EMPTY,
    scale_as_array=True,
    ignored=("init_loss_scaling",),
)

TORCH = Spelling(
    framework="PyTorch",
    preset="pytorch",
    arguments=(
        ("device", "cuda"),
        ("init_scale", 2.0**16),
        ("growth_factor", 2.0),
        ("backoff_factor", 0.5),
        ("growth_interval", 2000),
        ("enabled", True),
    ),
    fields=MappingProxyType({field: field for field in RULE_FIELDS}),
    enabled="enabled",
    state_keys=("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"),
    counter_keys=("_growth_tracker", "_hysteresis_tracker"),
    hysteresis_saved=False,
    implied=MappingProxyType({}),
    accessors=MappingProxyType(
        {"growth_factor": "growth_factor", "backoff_factor": "backoff_factor", "growth_interval": "growth_interval"}
    ),
    empty_state="The source " + _EMPTY,
    always_dynamic=True,
    update_needs_checks=True,
)

# tf.keras' LossScaleOptimizer (Keras 2): its names for the initial scale and the window; its rule is the preset's.
KERAS = Spelling(
    framework="tf.keras",
    preset="tf_keras",
    arguments=(("dynamic", True), ("initial_scale", None), ("dynamic_growth_steps", None)),
    fields=MappingProxyType({"init_scale": "initial_scale", "growth_interval": "dynamic_growth_steps"}),
    enabled="dynamic",
    state_keys=(),
    counter_keys=("dynamic_counter",),
    hysteresis_saved=False,
    implied=MappingProxyType({}),
    accessors=MappingProxyType({}),
)
KERAS_DEFAULTS = MappingProxyType({"init_scale": 2.0**15, "growth_interval": 2000})


def spelling_of(args, kwargs):
    """:data:`TORCH` or :data:`PADDLE` for a call ``GradScaler(*args, **kwargs)``: PyTorch's when a str comes first
    or one of its argument names is given, else Paddle's; ``ValueError`` when both are mixed."""
    torch = [name for name in kwargs if name in TORCH.defaults]
    paddle = [name for name in kwargs if name in PADDLE.defaults]
    if args:
        (torch if isinstance(args[0], str) else paddle).append(
            f"a first positional argument of type {type(args[0]).__name__}"
        )
    if torch and paddle:
        raise ValueError(
            f"GradScaler got PyTorch's spelling ({', '.join(torch)}) and Paddle's ({', '.join(paddle)}) "
            f"together: give one framework's arguments, e.g. enabled= (PyTorch) or enable= (Paddle)."
        )
    return TORCH if torch else PADDLE
