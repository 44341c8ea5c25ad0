"""How each framework spells a ``GradScaler``, written once: one frozen record per API.

A record holds the constructor's arguments with their defaults (in order), the names the framework gives
the rule's fields (:class:`lossscale.core.policy.LossScalePolicy`'s ``init_scale``, ``growth_factor``, ...),
the keys of its ``state_dict()`` and its accessors (``get_<name>`` / ``set_<name>``). The ``GradScaler``
classes bind their arguments, build their rule, name their errors and generate their accessors from it.

Example:
    >>> PADDLE.defaults["incr_every_n_steps"], TORCH.defaults["growth_interval"], PADDLE.name_of("growth_factor")
    (1000, 2000, 'incr_ratio')
    >>> spelling_of(("cuda",), {}) is TORCH, spelling_of((), {"init_loss_scaling": 8.0}) is PADDLE
    (True, True)
"""

import inspect
from dataclasses import dataclass
from types import MappingProxyType

# The rule's fields a GradScaler's arguments and accessors name (the rest of LossScalePolicy comes from the preset).
RULE_FIELDS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis")
# Keyword-only arguments of every GradScaler (lossscale's own).
KEYWORD_DEFAULTS = MappingProxyType({"policy": None, "overflow_check": None, "name": None})


@dataclass(frozen=True)
class Spelling:
    """One framework's ``GradScaler`` API.

    Attributes:
        framework (str): its name in messages (``"PyTorch"``, ``"Paddle"``).
        preset (str): the :mod:`lossscale.core.presets` rule its arguments adjust.
        arguments (tuple): ``(name, default)`` of the positional-or-keyword arguments, in order.
        fields (Mapping): rule field -> the framework's name for it (arguments, errors, state keys).
        enabled (str): the argument that turns scaling on or off.
        state_keys (tuple): the keys its ``state_dict()`` always has.
        counter_keys (tuple): the state keys of the clean steps toward a growth and of the bad steps toward a
            backoff (PyTorch's second, ``_hysteresis_tracker``, is lossscale's, for a rule with hysteresis).
        accessors (Mapping): ``get_<name>``/``set_<name>`` accessor name -> rule field.
        empty_state (str): its error for an empty state dict in ``load_state_dict``.
    """

    framework: str
    preset: str
    arguments: tuple
    fields: MappingProxyType
    enabled: str
    state_keys: tuple
    counter_keys: tuple
    accessors: MappingProxyType
    empty_state: str

    @property
    def defaults(self):
        """``{argument: default}`` of the positional-or-keyword arguments."""
        return dict(self.arguments)

    def name_of(self, field):
        """The framework's name for the rule field ``field``."""
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
    accessors=MappingProxyType(
        {
            "init_loss_scaling": "init_scale",
            "incr_ratio": "growth_factor",
            "decr_ratio": "backoff_factor",
            "incr_every_n_steps": "growth_interval",
            "decr_every_n_nan_or_inf": "hysteresis",
        }
    ),
    empty_state="The input state dict is empty, possibly because it was saved from a disabled instance of GradScaler.",
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
    accessors=MappingProxyType(
        {"growth_factor": "growth_factor", "backoff_factor": "backoff_factor", "growth_interval": "growth_interval"}
    ),
    empty_state="The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.",
)


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
