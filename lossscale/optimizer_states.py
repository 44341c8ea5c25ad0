"""PyTorch's per-optimizer state machine for :class:`lossscale.GradScaler`, kept in Parameters.

Per optimizer slot, between two ``update()`` calls::

    READY --unscale_()--> UNSCALED --step()--> STEPPED        (step() from READY unscales itself)
    unscale_() in UNSCALED or STEPPED, step() in STEPPED: RuntimeError, with PyTorch's messages

The stage, this iteration's overflow flag (``found_inf``), the fingerprint of the scaled
gradients ``unscale_()`` was given and their structure live in Parameters, so the machine is
the same for eager calls, every compiled function and every recompilation: nothing is keyed
by a compilation. A misuse is refused before anything is applied; inside a compiled graph the
refusal is a runtime ``raise`` (MindSpore >= 2.9 supports it), eagerly a normal one.

A slot is chosen per *key* at trace time: an explicit ``key`` (an int or str constant), or by
default the structure of the gradients (their shapes and dtypes), which is the same for
``unscale_()`` and ``step()`` of one optimizer and differs between optimizers whose parameters
differ. Optimizers with identical parameter shapes need explicit keys.

Example:
    >>> states = OptimizerStates("doc_states", capacity=4)
    >>> states.slot(None, 1234), states.slot(0, None), states.slot(None, 1234), states.slot("disc", None)
    (0, 1, 0, 2)
"""
import zlib

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

READY, UNSCALED, STEPPED = 0, 1, 2
DEFAULT_CAPACITY = 16
_REGISTRIES = {}  # OptimizerStates name -> {key: slot}

_describe = ops.MultitypeFuncGraph("_describe")


@_describe.register("Tensor")
def _tensor_describe(grad):
    return grad.shape, grad.dtype


@_describe.register("RowTensor")
def _row_tensor_describe(grad):
    return grad.dense_shape, grad.values.dtype


@_describe.register("None")
def _none_describe(grad):
    return None


@constexpr
def _signature(description):
    """A deterministic int32 for the (shape, dtype) structure of a gradient tuple."""
    return zlib.crc32(repr(description).encode()) & 0x7FFFFFFF


@constexpr
def _slot(registry, key, signature, capacity):
    """The slot of ``key`` (or of ``signature`` when key is None), assigned on first use."""
    slots = _REGISTRIES.setdefault(registry, {})
    token = ("structure", signature) if key is None else ("key", key)
    if token not in slots:
        if len(slots) >= capacity:
            raise ValueError(f"more than {capacity} optimizer keys in one GradScaler: {sorted(map(str, slots))}. "
                             f"Use at most {capacity} distinct keys (or gradient structures).")
        slots[token] = len(slots)
    return slots[token]


@constexpr
def _check_key(key):
    if key is not None and (isinstance(key, bool) or not isinstance(key, (int, str))):
        raise TypeError(f"'key' must be an int or a str constant (or None), but got {key!r} of type "
                        f"{type(key).__name__}.")
    return True


class OptimizerStates(nn.Cell):
    """The per-optimizer stages and overflow flags of one scaler (see the module docstring).

    Args:
        name (str): Parameter name prefix (unique per scaler).
        capacity (int): the most optimizer slots (keys) one scaler serves.
    """

    def __init__(self, name, capacity=DEFAULT_CAPACITY):
        super().__init__(auto_prefix=False)
        self.registry = name
        self.capacity = capacity
        self.hyper_map = ops.HyperMap()
        self.stage = Parameter(Tensor(np.zeros(capacity, np.int32)), name=f"{name}.stage", requires_grad=False)
        self.found_inf = Parameter(Tensor(np.zeros(capacity, np.float32)), name=f"{name}.found_inf",
                                   requires_grad=False)
        self.fingerprint = Parameter(Tensor(np.zeros(capacity, np.float32)), name=f"{name}.fingerprint",
                                     requires_grad=False)
        self.structure = Parameter(Tensor(np.zeros(capacity, np.int32)), name=f"{name}.structure",
                                   requires_grad=False)
        self.loss_nonfinite = Parameter(Tensor(0.0, mstype.float32), name=f"{name}.loss_nonfinite",
                                        requires_grad=False)
        # Tensor constants rather than Python numbers in graph arithmetic (see lossscale.overflow).
        self._ready, self._unscaled, self._stepped = (Tensor(v, mstype.int32) for v in (READY, UNSCALED, STEPPED))
        self._zero, self._one = Tensor(0.0, mstype.float32), Tensor(1.0, mstype.float32)
        self._others = Tensor(~np.eye(capacity, dtype=np.bool_))  # row i: every slot but i

    # ---- trace time ----------------------------------------------------------------------------
    def structure_of(self, grads):
        """The int32 structure signature of ``grads`` (a constant)."""
        return _signature(self.hyper_map(_describe, grads))

    def slot(self, key, signature):
        """The slot index for ``key`` (int/str) or, with ``key=None``, for the structure ``signature``."""
        _check_key(key)
        return _slot(self.registry, key, signature, self.capacity)

    # ---- graph: refusals (nothing has changed when they raise) ---------------------------------
    def refuse_unscale(self, slot):
        if self.stage[slot] == self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update(). "
                               "Call it once per optimizer per iteration and pass the gradients it returned to "
                               "step(); with several optimizers give each its own key.")
        if self.stage[slot] == self._stepped:
            raise RuntimeError("unscale_() is being called after step(). Call unscale_() before step() (step() "
                               "has already unscaled and applied these gradients), or update() first.")
        return self.stage[slot]

    def refuse_step(self, slot):
        if self.stage[slot] == self._stepped:
            raise RuntimeError("step() has already been called since the last update(). Call update() once per "
                               "iteration, after every optimizer's step(); with several optimizers give each its "
                               "own key.")
        return self.stage[slot]

    def refuse_scaled_gradients(self, slot, fingerprint, scale):
        """step() after unscale_(): refuse the very gradients unscale_() was given (still scaled)."""
        seen = self.fingerprint[slot]
        if ops.logical_and(ops.logical_and(fingerprint == seen, seen != self._zero), scale != self._one):
            raise RuntimeError("step() got the scaled gradients that unscale_() was given for this optimizer. In "
                               "MindSpore unscale_() cannot change gradients in place: pass the gradients it "
                               "returned (after any clipping) to step(), e.g. grads = scaler.unscale_(grads).")
        return seen

    def refuse_ambiguous(self, slot, structure):
        """step() without unscale_() for this slot, while another slot unscaled gradients shaped like these."""
        others = ops.logical_and(self.stage == self._unscaled, self.structure == structure)
        if ops.logical_and(others, self._others[slot]).any():
            raise RuntimeError("step() got gradients shaped like the ones unscale_() returned for another key in "
                               "this iteration, so they may be unscaled already: pass the same key to unscale_() "
                               "and step() for one optimizer, or call unscale_() for this key too.")
        return structure

    def refuse_update_without_checks(self):
        """PyTorch: update() needs an unscale_() or step() since the last update()."""
        if (self.stage == self._ready).all():
            raise AssertionError("No inf checks were recorded prior to update(): call step() (or unscale_()) for "
                                 "each optimizer before update().")
        return self.stage

    def unscaled(self, stage):
        """Whether ``stage`` (from :meth:`refuse_step`) is UNSCALED."""
        return stage == self._unscaled

    def skips(self, found):
        """Whether a recorded ``found`` (float32 0/1) means the step is skipped."""
        return found > self._zero

    # ---- graph: records --------------------------------------------------------------------------
    def record_loss(self, loss_flag):
        """A non-finite scaled loss this iteration makes every later decision an overflow."""
        bad = ops.select(ops.isfinite(loss_flag), ops.zeros_like(loss_flag), ops.ones_like(loss_flag))
        return ops.assign(self.loss_nonfinite, ops.maximum(self.loss_nonfinite, bad))

    def found(self, overflow):
        """This decision as float32 0/1, including a non-finite loss seen this iteration."""
        return ops.maximum(ops.cast(overflow, mstype.float32), self.loss_nonfinite)

    def record_unscale(self, slot, found, fingerprint, structure):
        self.found_inf[slot] = found
        self.fingerprint[slot] = fingerprint
        self.structure[slot] = structure
        self.stage[slot] = self._unscaled
        return self.stage

    def record_step(self, slot, found):
        self.found_inf[slot] = found
        self.stage[slot] = self._stepped
        return self.stage

    def any_found(self):
        """Whether any optimizer (or the loss) overflowed since the last update()."""
        return ops.logical_or(self.found_inf.max() > self._zero, self.loss_nonfinite > self._zero)

    def reset(self):
        """A new iteration: every slot READY, no overflow recorded."""
        done = ops.assign(self.stage, ops.zeros_like(self.stage))
        done = ops.depend(ops.assign(self.found_inf, ops.zeros_like(self.found_inf)), done)
        done = ops.depend(ops.assign(self.fingerprint, ops.zeros_like(self.fingerprint)), done)
        return ops.depend(ops.assign(self.loss_nonfinite, ops.zeros_like(self.loss_nonfinite)), done)

    # ---- host ----------------------------------------------------------------------------------
    def between_iterations(self):
        """True when no unscale_() or step() happened since the last update() (one host sync)."""
        return not self.stage.asnumpy().any() and not float(self.loss_nonfinite.asnumpy())
