"""MindSpore's and MindFormers' names for a rule's fields, written once, and :func:`errors_named`, which makes a
rule's errors name the caller's arguments (the frameworks' front-ends have their tables in
:mod:`lossscale.frontends.spelling`). An API's arguments become a rule once, by :func:`rule_fields`.

Example:
    >>> MINDSPORE_CELL["growth_interval"], MINDSPORE_MANAGER["init_scale"]
    ('scale_window', 'init_loss_scale')
    >>> rule_fields(MINDSPORE_MANAGER, {"init_loss_scale": 8.0, "hysteresis": 2})
    {'init_scale': 8.0, 'hysteresis': 2}
"""

import contextlib
from types import MappingProxyType

_MINDSPORE = dict(
    growth_factor="scale_factor", growth_interval="scale_window", min_scale="min_loss_scale", max_scale="max_loss_scale"
)
# A rule's field -> the API's argument; a field not listed keeps its name (lossscale's keyword extensions).
MINDSPORE_CELL = MappingProxyType(dict(_MINDSPORE, init_scale="loss_scale_value"))
MINDSPORE_MANAGER = MappingProxyType(dict(_MINDSPORE, init_scale="init_loss_scale"))
# MindFormers' adaptive window: AdaptiveWindowRule's other fields are MindFormers' own names.
MINDFORMERS_CELL = MappingProxyType({"init_scale": "loss_scale_value"})
MINDFORMERS_MANAGER = MappingProxyType({"init_scale": "init_loss_scale"})


def rule_fields(names, arguments):
    """``{field: value}`` of ``arguments`` spelled as ``names`` says; ``TypeError`` for a field's own name where the
    API spells it otherwise (``init_scale=`` to MindSpore's cell, say)."""
    fields = {name: field for field, name in names.items()}
    for argument in arguments:
        if argument not in fields and argument in names:
            raise TypeError(f"got an unexpected keyword argument '{argument}' (this API calls it '{names[argument]}')")
    return {fields.get(argument, argument): value for argument, value in arguments.items()}


@contextlib.contextmanager
def errors_named(names):
    """Re-raise a rule's ``TypeError``/``ValueError`` with each field named as ``names`` spells it.

    Example:
        >>> from lossscale.core.policy import LossScalePolicy
        >>> try:
        ...     with errors_named({"growth_factor": "incr_ratio"}):
        ...         LossScalePolicy(growth_factor=0.5)
        ... except ValueError as error:
        ...     print(str(error).split(" must")[0])
        'incr_ratio'
    """
    try:
        yield
    except (TypeError, ValueError) as error:
        message = str(error)
        for field, name in names.items():
            message = message.replace(f"'{field}'", f"'{name}'")
        raise type(error)(message) from None
