"""Presets: other libraries' loss-scaling rules as rules (:func:`get_preset`), one per original, with its defaults.

Use one anywhere a rule is accepted: ``DynamicLossScaleManager.from_policy(get_preset("megatron"))``,
``GradScaler.from_preset("paddle")``, ``LossScaleOptimizer(opt, policy="keras")``, ``--loss-scale preset:jmp``.
Every preset keeps lossscale's finiteness guard (growth never produces inf); for Paddle's dygraph ``GradScaler``,
Keras 3, Megatron-LM, MindSpore and MindFormers that deliberately differs from the original, whose scale can grow
to inf. :data:`DIFFERENCES` lists it per preset.

Example:
    >>> p = get_preset("pytorch")
    >>> p.init_scale, p.growth_interval, p.min_scale
    (65536.0, 2000, 0.0)
    >>> get_preset("paddle", init_scale=1024.0).hysteresis
    2
"""

from dataclasses import fields, replace

from lossscale.core.adaptive import MAX_SCALE_WINDOW, MIN_SCALE_WINDOW, AdaptiveWindowRule
from lossscale.core.automatic import AutomaticLossScaleRule
from lossscale.core.policy import LossScalePolicy

_PRESETS = {
    # MindSpore DynamicLossScaleManager / DynamicLossScaleUpdateCell: floor at 1.
    "mindspore": dict(init_scale=2.0**24, growth_factor=2.0, growth_interval=2000, min_scale=1.0),
    # torch.amp.GradScaler (_amp_update_scale_): no floor, never grows to a non-finite scale.
    "pytorch": dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, min_scale=0.0),
    # paddle.amp.GradScaler in dygraph: decr_every_n_nan_or_inf consecutive bad steps (a clean step
    # resets the count, a backoff restarts it), no floor.
    "paddle": dict(
        init_scale=2.0**15,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=1000,
        hysteresis=2,
        consecutive_hysteresis=True,
        refill_hysteresis_on_backoff=True,
        min_scale=0.0,
    ),
    # paddle.amp.GradScaler's defaults from Paddle 2.5 on (2.6, 3.x): 2**16, 2000 clean steps, back off at every bad
    # step (decr_every_n_nan_or_inf=1); the counting of "paddle" otherwise.
    "paddle_2_5": dict(
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        hysteresis=1,
        consecutive_hysteresis=True,
        refill_hysteresis_on_backoff=True,
        min_scale=0.0,
    ),
    # Paddle's static-graph update_loss_scaling op: the same counting, floor at 1, finiteness guard.
    "paddle_static": dict(
        init_scale=2.0**15,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=1000,
        hysteresis=2,
        consecutive_hysteresis=True,
        refill_hysteresis_on_backoff=True,
        min_scale=1.0,
    ),
    # Keras 3 LossScaleOptimizer: x2 after dynamic_growth_steps finite steps, /2 on overflow, no floor.
    "keras": dict(init_scale=2.0**15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, min_scale=0.0),
    # tf.keras (Keras 2) LossScaleOptimizer, the API lossscale.LossScaleOptimizer follows: the same counting,
    # /2 floored at 1 (maximum(scale / 2, 1)), growth only to a finite scale (_assign_if_finite).
    "tf_keras": dict(init_scale=2.0**15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, min_scale=1.0),
    # DeepMind jmp DynamicLossScale: floor at min_loss_scale (1), first_finite guard on growth.
    "jmp": dict(init_scale=2.0**15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, min_scale=1.0),
    # Megatron-LM DynamicGradScaler: hysteresis counted since the last growth, floor at min_scale.
    "megatron": dict(
        init_scale=2.0**32,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=1000,
        hysteresis=2,
        consecutive_hysteresis=False,
        min_scale=1.0,
    ),
}
# Adaptive-window rules (AdaptiveWindowRule): MindFormers' AdaptiveLossScaleUpdateCell as its documentation
# configures it (runner_wrapper.scale_sense: 2**32, factor 2, starting at the lowest window, 20 to 1000).
_ADAPTIVE_PRESETS = {
    "mindformers": dict(
        init_scale=2.0**32,
        scale_factor=2,
        scale_window=MIN_SCALE_WINDOW,
        max_scale_window=MAX_SCALE_WINDOW,
        min_scale_window=MIN_SCALE_WINDOW,
    ),
}

# Automatic loss scaling (AutomaticLossScaleRule): Graphcore PopART's defaults (binEdgeLocation 1/16,
# thresholdUpperCountProportion 1e-7, updatePeriod 1, factor 2).
_AUTOMATIC_PRESETS = {"graphcore": dict(bin_edge=0.0625, threshold=1e-7, update_period=1, factor=2.0)}
# preset name -> (rule class, its arguments, the field that `window` sets)
_KINDS = {
    **{name: (LossScalePolicy, values, "growth_interval") for name, values in _PRESETS.items()},
    **{name: (AdaptiveWindowRule, values, "scale_window") for name, values in _ADAPTIVE_PRESETS.items()},
    **{name: (AutomaticLossScaleRule, values, "update_period") for name, values in _AUTOMATIC_PRESETS.items()},
}

#: What each preset does differently from its original, on purpose.
_NO_SUBNORMALS = (
    " With no floor, a scale that would fall below 2**-126 (the smallest normal float32) is 0, where the "
    "original goes through subnormal values (see lossscale.core.policy.backed_off_scale)."
)
DIFFERENCES = {
    "mindspore": "MindSpore grows the scale to inf (from 2**127 with window 1) and stays there; "
    "the preset never grows to a non-finite scale.",
    "pytorch": "PyTorch also refuses a non-finite growth." + _NO_SUBNORMALS,
    "paddle": "Paddle's dygraph GradScaler multiplies without a finiteness check; the preset never grows to inf."
    + _NO_SUBNORMALS,
    "paddle_2_5": "as 'paddle': Paddle multiplies without a finiteness check; the preset never grows to inf."
    + _NO_SUBNORMALS,
    "paddle_static": "none (the update_loss_scaling op floors at 1 and refuses a non-finite growth).",
    "keras": "Keras 3 doubles without a finiteness check; the preset never grows to inf."
    + _NO_SUBNORMALS
    + " (Keras 3 on JAX does not: XLA flushes subnormal results to zero on CPU, measured.)",
    "tf_keras": "none (tf.keras floors the scale at 1 and refuses a non-finite growth).",
    "jmp": "none (jmp keeps the old scale when the grown one is not finite). jmp has no default initial "
    "scale; 2**15 is the value of its documentation.",
    "megatron": "Megatron-LM multiplies without a finiteness check; the preset never grows to inf.",
    "graphcore": "PopART counts the gradients of matmul and convolution outputs and never skips a step; the preset "
    "counts the parameters' gradients (what a MindSpore train step sees), skips a step with inf/nan and divides the "
    "scale at once, and keeps the scale within [1, 2**24] (PopART has no bounds). Its initial scale is 2**16.",
    "mindformers": "MindFormers multiplies without a finiteness check (and then backs off inf to inf); the preset "
    "never grows to inf. Its cell has no default initial scale: 2**32 is its documentation's.",
}

PRESET_NAMES = tuple(_KINDS)
ADAPTIVE_PRESET_NAMES = tuple(_ADAPTIVE_PRESETS)


def get_preset(name, window=None, **overrides):
    """The rule of preset ``name`` with optional field overrides: a :class:`LossScalePolicy`, an
    :class:`lossscale.core.adaptive.AdaptiveWindowRule` for the names in :data:`ADAPTIVE_PRESET_NAMES`, an
    :class:`lossscale.core.automatic.AutomaticLossScaleRule` for ``"graphcore"``.

    Args:
        name: one of :data:`PRESET_NAMES`.
        window: the growth window (``growth_interval``; the adaptive window's starting ``scale_window``; automatic
            loss scaling's ``update_period``), or None.
        **overrides: the rule's fields to change (e.g. ``init_scale``).

    Raises:
        ValueError: unknown preset; TypeError/ValueError: a bad override.

    Example:
        >>> get_preset("megatron").hysteresis, get_preset("jmp", growth_interval=10).growth_interval
        (2, 10)
    """
    if not isinstance(name, str):
        raise TypeError(f"'preset' must be a str, one of {PRESET_NAMES}, but got {type(name).__name__} {name!r}.")
    if name not in PRESET_NAMES:
        raise ValueError(f"'preset' must be one of {PRESET_NAMES}, but got {name!r}.")
    kind, values, window_field = _KINDS[name]
    allowed = sorted(field.name for field in fields(kind) if field.init)
    unknown = set(overrides) - set(allowed)
    if unknown:
        raise TypeError(f"unknown {kind.__name__} field(s) {sorted(unknown)}; allowed: {allowed}.")
    if window is not None:
        overrides[window_field] = window
    policy = kind(**values)
    if "growth_factor" in overrides and "backoff_factor" not in overrides and "backoff_factor" not in values:
        overrides["backoff_factor"] = None  # keep backoff = 1/growth for rules defined that way
    return replace(policy, **overrides) if overrides else policy
