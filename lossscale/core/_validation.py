"""Argument checks shared by every public constructor.

Every error names the argument, the value received and the allowed range, so a
user can fix the call without reading the source.
"""

import math
import numbers

import numpy as np

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
INT32_MAX = 2**31 - 1


class AssertionValueError(ValueError, AssertionError):
    """A ``ValueError`` that is also an ``AssertionError``.

    Raised where the framework a front-end follows asserts (PyTorch's and Paddle's
    ``GradScaler`` assert ``growth_factor > 1`` and ``backoff_factor < 1``), so code that
    catches either keeps working, while the message names the argument, value and range.
    """


class TypeValueError(TypeError, ValueError):
    """A ``ValueError`` that is also a ``TypeError``.

    Raised by :class:`lossscale.LossScaleOptimizer` for an argument of the wrong type: Keras
    documents ``ValueError`` for any invalid argument, while tf.keras' code raises ``TypeError``
    for these (and Keras 3 ``ValueError`` for unknown keywords), so code that catches either keeps
    working.
    """


def check_bool(name, value):
    """Return ``value`` if it is a real ``bool``; raise ``TypeError`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"'{name}' must be a bool, but got {value!r} of type {type(value).__name__}.")
    return value


def check_real(name, value):
    """Return ``value`` as a Python float if it is a real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"'{name}' must be a real number, but got {value!r} of type {type(value).__name__}.")
    return float(value)


def check_finite_in_range(name, value, *, low, high=FLOAT32_MAX, low_inclusive=True, high_inclusive=True):
    """Return ``float(value)`` if it is finite and within ``[low, high]`` (an end excluded when not inclusive)."""
    value = check_real(name, value)
    too_low = value < low if low_inclusive else value <= low
    too_high = value > high if high_inclusive else value >= high
    if not math.isfinite(value) or too_low or too_high:
        opening, closing = "[" if low_inclusive else "(", "]" if high_inclusive else ")"
        raise ValueError(f"'{name}' must be a finite number in {opening}{low!r}, {high!r}{closing}, but got {value!r}.")
    return value


def check_int_in_range(name, value, *, low, high=2**31 - 1):
    """Return ``value`` if it is an int (not a bool) within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"'{name}' must be an int, but got {value!r} of type {type(value).__name__}.")
    if not low <= value <= high:
        raise ValueError(f"'{name}' must be an int in [{low}, {high}], but got {value!r}.")
    return int(value)


def refuse_float32_degenerate(name, value, degenerate, how):
    """The device computes in float32: ``ValueError`` for a value that is valid as a Python float but ``degenerate``
    there (``how`` says why: "rounds to 1.0", ...)."""
    if degenerate:
        raise ValueError(f"'{name}' is {value!r}, which in float32 (the device's arithmetic) {how}.")


def positive_float32(name, value):
    """``value`` (a real number) as a float32 NumPy scalar that is finite, > 0 and has a finite reciprocal;
    else ``ValueError`` naming ``name`` (1e-46 is 0 in float32; 1e-45 is > 0 but 1/S is inf).

    Example:
        >>> float(positive_float32("scale", 1024))
        1024.0
    """
    with np.errstate(over="ignore", divide="ignore", under="ignore"):
        scale = np.float32(value)
        reciprocal = np.float32(1.0) / scale
    if not (np.isfinite(scale) and scale > 0 and np.isfinite(reciprocal)):
        raise ValueError(
            f"'{name}' must be a finite float32 number > 0 whose reciprocal is finite, in [2.94e-39, 3.4e38], "
            f"but got {value!r}."
        )
    return scale


def read_only(name, advice, getter=None):
    """A property reading ``self._<name>`` (or ``getter(self)``); assigning it is an ``AttributeError`` naming the
    class, the attribute and ``advice`` (what to do instead).

    Example:
        >>> class Rule:
        ...     window = read_only("window", "build a new Rule.")
        ...     def __init__(self):
        ...         self._window = 3
        >>> rule = Rule()
        >>> rule.window
        3
        >>> rule.window = 4
        Traceback (most recent call last):
        AttributeError: Rule.window cannot be assigned: build a new Rule.
    """

    def get(self):
        return getattr(self, f"_{name}") if getter is None else getter(self)

    def refuse(self, value):
        raise AttributeError(f"{type(self).__name__}.{name} cannot be assigned: {advice}")

    return property(get, refuse, doc=f"``{name}`` as given (read-only).")
