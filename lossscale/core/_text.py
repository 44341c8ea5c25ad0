"""Numbers as the command line and the monitor print them (no MindSpore import)."""

import math


def format_scale(scale):
    """A loss scale as people read it: ``2**24`` for a power of two, else ``%g``; ``none`` for None.

    Example:
        >>> format_scale(16777216.0), format_scale(1000.0), format_scale(0.5), format_scale(None)
        ('2**24', '1000', '2**-1', 'none')
    """
    if scale is None:
        return "none"
    if scale > 0 and math.isfinite(scale):
        mantissa, exponent = math.frexp(scale)
        if mantissa == 0.5:
            return f"2**{exponent - 1}"
    return f"{scale:g}"


def plural(count, word):
    """``count`` and ``word``, with an ``s`` unless ``count`` is 1.

    Example:
        >>> plural(1, "step"), plural(3, "step"), plural(0, "step")
        ('1 step', '3 steps', '0 steps')
    """
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
