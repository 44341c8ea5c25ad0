"""``GradScaler``: Paddle's and PyTorch's loss-scaling front-end for functional MindSpore training.

Works eagerly (PyNative) and inside ``mindspore.jit`` (the whole train step compiled):
all numeric state lives in Parameters (the scale, the policy counters and this
iteration's overflow flag) and every method is made of graph ops. The update rule
is :func:`lossscale.policy.update`, applied by a :class:`DynamicLossScaleUpdateCell`.

Typical iteration (PyTorch order; Paddle's ``minimize`` = ``step`` + ``update``)::

    scaler = GradScaler(init_loss_scaling=1024)          # Paddle spelling (and defaults)
    def forward(x, y):
        return scaler.scale(loss_fn(net(x), y))           # scaled loss
    grad_fn = mindspore.value_and_grad(forward, None, optimizer.parameters)

    @mindspore.jit
    def train_step(x, y):
        scaled_loss, grads = grad_fn(x, y)
        grads = scaler.unscale_(grads)                     # optional: only to clip or inspect
        grads = ops.clip_by_global_norm(grads, 1.0)
        scaler.step(optimizer, grads)                      # skipped if a gradient is inf/nan
        scaler.update()                                    # once per iteration
        return scaled_loss

Usage rules (checked; a misuse raises ``RuntimeError`` saying what to do): at most
one ``unscale_`` and one ``step`` per optimizer between two ``update`` calls. The
checks run on every call in PyNative, and once, while compiling, inside
``mindspore.jit``. So put a whole iteration (``unscale_``/``step``/``update``) in one
compiled function, or run it all eagerly: an eager ``step`` after a compiled
``unscale_`` cannot tell that the gradients were already unscaled.
"""
import itertools
import sys

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale._validation import check_bool
from lossscale.overflow import any_nonfinite, unscale_gradients
from lossscale.policy import LossScaleState, build_policy, check_state
from lossscale.presets import get_preset
from lossscale.update_cells import DynamicLossScaleUpdateCell

_UNSET = object()
_PADDLE_NAMES = {"init_scale": "init_loss_scaling", "growth_factor": "incr_ratio", "backoff_factor": "decr_ratio",
                 "growth_interval": "incr_every_n_steps", "hysteresis": "decr_every_n_nan_or_inf"}
_PADDLE_DEFAULTS = {"init_loss_scaling": 32768.0, "incr_ratio": 2.0, "decr_ratio": 0.5, "incr_every_n_steps": 1000,
                    "decr_every_n_nan_or_inf": 2}
_TORCH_ALIASES = {"init_scale": "init_loss_scaling", "growth_factor": "incr_ratio", "backoff_factor": "decr_ratio",
                  "growth_interval": "incr_every_n_steps"}


# Usage bookkeeping: {(session, scaler id, key): {"unscale_", "step"}} since that scaler's last update().
# The functions are constexpr: they run on every eager call, and once while compiling under jit. Each
# compilation is its own session (static analysis does not keep the program order of independent
# calls, so nothing recorded while compiling may leak into eager use or into a recompilation).
_USAGE = {}
_SCALER_IDS = itertools.count(1)
_MISUSE = {
    ("unscale_", "unscale_"): "unscale_() was already called for key {key} since the last update(). Call it once per "
                              "iteration, right after computing the gradients, and pass the gradients it returned "
                              "to step(). With several optimizers, give each its own key.",
    ("unscale_", "step"): "unscale_() after step() for key {key} in the same iteration: step() has already "
                          "unscaled and applied those gradients. Call unscale_() before step(), or update() first.",
    ("step", "step"): "step() was already called for key {key} since the last update(). Call update() once per "
                      "iteration, after every optimizer's step(). With several optimizers, give each its own key.",
}


def _session():
    """``"eager"``, or an id for the MindSpore compilation that is running (one per jit compile)."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        if frame.f_code.co_name == "compile" and "mindspore" in frame.f_code.co_filename:
            return id(frame)
        frame = frame.f_back
    return "eager"


@constexpr(reuse_result=False)
def _record(scaler, key, event):
    """Record ``event`` ("unscale_" or "step") for (scaler, key); raise on a misuse. Returns True if
    unscale_ had already been called for this key (so step() must not unscale again)."""
    session = _session()
    for stale in [k for k in _USAGE if k[0] != session and k[0] != "eager"]:
        del _USAGE[stale]  # a finished compilation
    seen = _USAGE.setdefault((session, scaler, key), set())
    for earlier in sorted(seen):
        if (event, earlier) in _MISUSE:
            raise RuntimeError(_MISUSE[(event, earlier)].format(key=key))
    already_unscaled = "unscale_" in seen
    seen.add(event)
    return already_unscaled


@constexpr(reuse_result=False)
def _forget(scaler):
    """update() in eager mode: a new iteration starts for every key of this scaler."""
    if _session() == "eager":
        for usage_key in [k for k in _USAGE if k[0] == "eager" and k[1] == scaler]:
            del _USAGE[usage_key]
    return True


def _resolve_arguments(paddle, torch):
    """Merge Paddle-spelled and PyTorch-spelled arguments; reject the same setting given twice."""
    values = {}
    for name, default in _PADDLE_DEFAULTS.items():
        values[name] = default if paddle[name] is _UNSET else paddle[name]
    for torch_name, paddle_name in _TORCH_ALIASES.items():
        if torch[torch_name] is None:
            continue
        if paddle[paddle_name] is not _UNSET:
            raise ValueError(f"give either '{paddle_name}' (Paddle) or '{torch_name}' (PyTorch), not both.")
        values[paddle_name] = torch[torch_name]
    return values


def _paddle_policy(values, policy=None):
    """The Paddle dygraph rule (consecutive bad steps, no floor) from Paddle-named values."""
    if policy is not None:
        return policy
    return build_policy(_PADDLE_NAMES, init_scale=values["init_loss_scaling"], growth_factor=values["incr_ratio"],
                        backoff_factor=values["decr_ratio"], growth_interval=values["incr_every_n_steps"],
                        hysteresis=values["decr_every_n_nan_or_inf"], consecutive_hysteresis=True,
                        refill_hysteresis_on_backoff=True, min_scale=0.0)


@ms.jit_class
class GradScaler:
    """Dynamic (or fixed) loss scaling for ``mindspore.value_and_grad`` training loops.

    Paddle's constructor and defaults (seed: ``paddle.amp.GradScaler``); PyTorch's
    keyword spelling is accepted too (``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval``, ``enabled``), with Paddle's defaults for
    whatever is not given. For PyTorch's defaults and rule use
    ``GradScaler.from_preset("pytorch")``.

    The default rule is Paddle's dygraph one: the scale is multiplied by
    ``incr_ratio`` after ``incr_every_n_steps`` consecutive clean steps, and by
    ``decr_ratio`` after ``decr_every_n_nan_or_inf`` consecutive bad steps (a clean
    step resets that count), with no floor. Unlike Paddle's dygraph scaler it never
    grows to inf.

    Args:
        enable (bool): False makes every method an exact no-op. Default True.
        init_loss_scaling (float): initial scale. Default 32768.0.
        incr_ratio (float): growth multiplier, > 1. Default 2.0.
        decr_ratio (float): backoff multiplier, in (0, 1). Default 0.5.
        incr_every_n_steps (int): clean steps per growth, >= 1. Default 1000.
        decr_every_n_nan_or_inf (int): consecutive bad steps per backoff, >= 1. Default 2.
        use_dynamic_loss_scaling (bool): False keeps the scale fixed (steps with inf/nan
            are still skipped, as in Paddle). Default True.
        policy (LossScalePolicy, keyword only): use this rule instead (see
            :mod:`lossscale.presets`); then give no rule arguments.

    Host syncs: ``get_scale()``, ``get_loss_scaling()`` read back, ``state_dict()`` reads
    the state; ``scale``, ``unscale_``, ``step``, ``update`` and ``minimize`` stay on
    the device, except that eager ``step`` reads its skip flag to branch.

    Example:
        >>> scaler = GradScaler(init_loss_scaling=1024)
        >>> scaler.get_init_loss_scaling(), scaler.get_decr_every_n_nan_or_inf(), scaler.is_enable()
        (1024.0, 2, True)
    """

    def __init__(self, enable=True, init_loss_scaling=_UNSET, incr_ratio=_UNSET, decr_ratio=_UNSET,
                 incr_every_n_steps=_UNSET, decr_every_n_nan_or_inf=_UNSET, use_dynamic_loss_scaling=True, *,
                 init_scale=None, growth_factor=None, backoff_factor=None, growth_interval=None, enabled=None,
                 policy=None):
        paddle = {"init_loss_scaling": init_loss_scaling, "incr_ratio": incr_ratio, "decr_ratio": decr_ratio,
                  "incr_every_n_steps": incr_every_n_steps, "decr_every_n_nan_or_inf": decr_every_n_nan_or_inf}
        torch = {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                 "growth_interval": growth_interval}
        if policy is not None and any(v is not _UNSET for v in paddle.values()) | any(
                v is not None for v in torch.values()):
            raise ValueError("give either 'policy' or the rule arguments (init_loss_scaling, incr_ratio, ...), "
                             "not both.")
        if enabled is not None:
            enable = enabled
        self._enable = check_bool("enable", enable)
        self._dynamic = check_bool("use_dynamic_loss_scaling", use_dynamic_loss_scaling)
        self._policy = _paddle_policy(_resolve_arguments(paddle, torch), policy)
        self._scale = Parameter(Tensor(np.float32(self._policy.init_scale)), name="grad_scaler_scale",
                                requires_grad=False)
        self._found_inf = Parameter(Tensor(0.0, mstype.float32), name="grad_scaler_found_inf", requires_grad=False)
        self._updater = self._make_updater(self._policy)
        self._hyper_map = ops.HyperMap()
        self._one = Tensor(1.0, mstype.float32)
        self._zero = Tensor(0.0, mstype.float32)
        self._usage_id = next(_SCALER_IDS)

    @classmethod
    def from_preset(cls, name, enable=True, **overrides):
        """A scaler applying preset ``name`` of :mod:`lossscale.presets` (e.g. ``"pytorch"``).

        Example:
            >>> GradScaler.from_preset("pytorch").get_scale()
            65536.0
        """
        return cls(enable=enable, policy=get_preset(name, **overrides))

    def _make_updater(self, policy):
        updater = DynamicLossScaleUpdateCell.from_policy(policy)
        updater.bind_scale_parameter(self._scale)
        return updater

    # ---- the training-loop API (graph ops; usable inside mindspore.jit) -------------------------
    def scale(self, var):
        """``var * scale`` (a float16 loss is promoted to float32); ``var`` unchanged when disabled."""
        if not self._enable:
            return var
        return var * self._scale

    def unscale_(self, grads, key=0):
        """Divide ``grads`` by the scale (in float32) and record whether any is inf/nan; return them.

        Call at most once per optimizer per iteration, after the backward pass, before
        anything that needs true gradients (clipping). ``step(optimizer, grads)`` then
        uses them as they are. With several optimizers, give each a distinct constant
        ``key`` (an int) in both ``unscale_`` and ``step``.
        """
        if not self._enable:
            return grads
        _record(self._usage_id, key, "unscale_")
        return self._unscale(grads)

    def _unscale(self, grads):
        inv_scale = self._one / self._scale
        grads = unscale_gradients(self._hyper_map, inv_scale, grads)
        bad = ops.select(any_nonfinite(self._hyper_map, grads), self._one, self._zero)
        grads = ops.depend(grads, ops.assign(self._found_inf, ops.maximum(self._found_inf, bad)))
        return grads

    def step(self, optimizer, grads, key=0):
        """Apply ``optimizer(grads)`` unless a gradient is inf/nan; return True if the step was skipped.

        Unscales ``grads`` first unless ``unscale_`` was called with the same ``key`` in this
        iteration. Each optimizer decides on its own gradients (as in PyTorch); ``update()``
        backs off if any of them overflowed. Skipping means the optimizer is not called:
        no weight, moment or optimizer step counter changes.
        """
        if not self._enable:
            optimizer(grads)
            return False
        if not _record(self._usage_id, key, "step"):
            grads = self._unscale(grads)
        skipped = any_nonfinite(self._hyper_map, grads)
        if not skipped:
            skipped = ops.depend(skipped, optimizer(grads))
        return skipped

    def update(self):
        """Update the scale from this iteration's overflow flag (once per iteration) and reset it."""
        if not self._enable:
            return None
        _forget(self._usage_id)
        overflow = self._found_inf > self._zero
        if self._dynamic:
            overflow = self._updater(self._scale, overflow)
        done = ops.assign(self._found_inf, ops.depend(self._zero, overflow))
        return ops.depend(self._scale, done)

    def minimize(self, optimizer, grads, key=0):
        """``step(optimizer, grads)`` then ``update()`` (Paddle); return True if the step was skipped."""
        skipped = self.step(optimizer, grads, key)
        return ops.depend(skipped, self.update())

    # ---- queries and settings (host) -----------------------------------------------------------
    def is_enable(self):
        """Whether loss scaling is on (Paddle)."""
        return self._enable

    def is_enabled(self):
        """Whether loss scaling is on (PyTorch)."""
        return self._enable

    def is_use_dynamic_loss_scaling(self):
        """Whether the scale is updated dynamically (Paddle)."""
        return self._dynamic

    def get_scale(self):
        """The current scale as a Python float (PyTorch; one host sync); 1.0 when disabled."""
        return float(self._scale.asnumpy()) if self._enable else 1.0

    def get_loss_scaling(self):
        """The current scale as a float32 Tensor (Paddle)."""
        return Tensor(self._scale.asnumpy())

    def get_state(self):
        """The policy state (:class:`lossscale.policy.LossScaleState`), read from the device."""
        return self._updater.get_state()

    def _rule_with(self, **paddle_values):
        """The current rule with some Paddle-named values replaced (validated; Paddle names in errors)."""
        values = {"init_loss_scaling": self._policy.init_scale, "incr_ratio": self._policy.growth_factor,
                  "decr_ratio": self._policy.backoff_factor, "incr_every_n_steps": self._policy.growth_interval,
                  "decr_every_n_nan_or_inf": self._policy.hysteresis}
        values.update(paddle_values)
        return build_policy(_PADDLE_NAMES, init_scale=values["init_loss_scaling"],
                            growth_factor=values["incr_ratio"], backoff_factor=values["decr_ratio"],
                            growth_interval=values["incr_every_n_steps"],
                            hysteresis=values["decr_every_n_nan_or_inf"],
                            consecutive_hysteresis=self._policy.consecutive_hysteresis,
                            refill_hysteresis_on_backoff=self._policy.refill_hysteresis_on_backoff,
                            min_scale=self._policy.min_scale, max_scale=self._policy.max_scale)

    def _install(self, policy, state):
        """Switch to ``policy`` starting from ``state`` (a new update cell on the same scale Parameter)."""
        self._policy = policy
        self._updater = self._make_updater(policy)
        self._updater.set_state(state)

    def _set_rule(self, **paddle_values):
        """Change the rule, keeping the current scale and counters (clipped to the new bounds)."""
        state = self.get_state()
        policy = self._rule_with(**paddle_values)
        self._install(policy, LossScaleState(scale=state.scale,
                                             good_steps=min(state.good_steps, policy.growth_interval - 1),
                                             hysteresis_left=min(state.hysteresis_left, policy.hysteresis)))

    def get_init_loss_scaling(self):
        """The initial scale."""
        return self._policy.init_scale

    def set_init_loss_scaling(self, new_init_loss_scaling):
        """Set the initial scale; like Paddle it also becomes the current scale."""
        policy = self._rule_with(init_loss_scaling=new_init_loss_scaling)
        self._install(policy, LossScaleState(scale=policy.init_scale, good_steps=0,
                                             hysteresis_left=policy.hysteresis))

    def get_incr_ratio(self):
        """The growth multiplier."""
        return self._policy.growth_factor

    def set_incr_ratio(self, new_incr_ratio):
        """Set the growth multiplier (must be > 1.0)."""
        self._set_rule(incr_ratio=new_incr_ratio)

    def get_decr_ratio(self):
        """The backoff multiplier."""
        return self._policy.backoff_factor

    def set_decr_ratio(self, new_decr_ratio):
        """Set the backoff multiplier (must be in (0, 1))."""
        self._set_rule(decr_ratio=new_decr_ratio)

    def get_incr_every_n_steps(self):
        """Consecutive clean steps per growth."""
        return self._policy.growth_interval

    def set_incr_every_n_steps(self, new_incr_every_n_steps):
        """Set the clean steps per growth (an int >= 1)."""
        self._set_rule(incr_every_n_steps=new_incr_every_n_steps)

    def get_decr_every_n_nan_or_inf(self):
        """Consecutive bad steps per backoff."""
        return self._policy.hysteresis

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf):
        """Set the bad steps per backoff (an int >= 1)."""
        self._set_rule(decr_every_n_nan_or_inf=new_decr_every_n_nan_or_inf)

    def get_growth_factor(self):
        """PyTorch spelling of :meth:`get_incr_ratio`."""
        return self.get_incr_ratio()

    def get_backoff_factor(self):
        """PyTorch spelling of :meth:`get_decr_ratio`."""
        return self.get_decr_ratio()

    def get_growth_interval(self):
        """PyTorch spelling of :meth:`get_incr_every_n_steps`."""
        return self.get_incr_every_n_steps()

    def state_dict(self):
        """Paddle's keys (empty when disabled): the rule, the scale and the counters (one host sync)."""
        if not self._enable:
            return {}
        state = self.get_state()
        return {"scale": state.scale, "init_loss_scaling": self._policy.init_scale,
                "incr_ratio": self._policy.growth_factor, "decr_ratio": self._policy.backoff_factor,
                "incr_every_n_steps": self._policy.growth_interval,
                "decr_every_n_nan_or_inf": self._policy.hysteresis, "incr_count": state.good_steps,
                "decr_count": self._policy.hysteresis - state.hysteresis_left,
                "use_dynamic_loss_scaling": self._dynamic}

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict` output (validated first; nothing changes on error)."""
        if not self._enable:
            if state_dict:
                raise ValueError("this GradScaler is disabled; it can only load an empty state_dict.")
            return
        if not state_dict:
            raise ValueError("'state_dict' is empty: it was saved by a disabled GradScaler.")
        policy = self._rule_with(**{key: state_dict[key] for key in _PADDLE_DEFAULTS})
        state = check_state(policy, LossScaleState(scale=float(state_dict["scale"]),
                                                   good_steps=int(state_dict["incr_count"]),
                                                   hysteresis_left=policy.hysteresis - int(state_dict["decr_count"])))
        self._dynamic = check_bool("use_dynamic_loss_scaling", state_dict["use_dynamic_loss_scaling"])
        self._install(policy, state)
