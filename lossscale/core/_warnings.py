"""Warnings about the user's code, attributed to the user's line."""

import sys
import warnings

# Packages whose frames lie between the user's line and a warning: this one, and MindSpore's (a Cell's __call__,
# Model.train and its callbacks).
_LIBRARY_PACKAGES = ("lossscale", "mindspore")


def warn_at_caller(message, category):
    """``warnings.warn(message, category)`` at the first caller outside lossscale and MindSpore, however many of
    their frames the call came through (a fixed ``stacklevel`` names a line inside MindSpore, or none, on some
    paths).

    Example:
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_at_caller("example", UserWarning)
        >>> [w.category.__name__ for w in caught]
        ['UserWarning']
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARY_PACKAGES:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)
