"""The train cell's checks of subclasses: what a subclass must not change, and what it cannot use.

Model-zoo subclasses of MindSpore's train cell override ``construct`` (sometimes without calling ours) and
assign options of their own after ``__init__``. The options only our ``construct`` honours, options assigned
after building, and host-side features compiled into another graph are each refused instead of silently
doing nothing. Host calls and traces are recorded by token (one per train cell), at compile time.
"""

import contextlib
import itertools

from mindspore import ops

from lossscale.core._validation import read_only

_HOST_CALLS = set()  # tokens of the train cells whose __call__ is running (compiling or stepping)
_TOKENS = itertools.count()


def host_call_token():
    """A token naming one train cell for :func:`host_call` and :func:`refuse_without_host_call`."""
    return next(_TOKENS)


@contextlib.contextmanager
def host_call(token):
    """The train cell's ``__call__`` is running: its graph may be compiled with host-side features."""
    _HOST_CALLS.add(token)
    try:
        yield
    finally:
        _HOST_CALLS.discard(token)


_TRACED_OWN_CONSTRUCT = set()  # tokens of the train cells whose own construct was traced (see below)


@ops.constexpr
def mark_own_construct_traced(token):
    """Graph (compile time): the train cell ``token``'s own ``construct`` was traced, so the options only it
    honours take effect (:func:`refuse_options_without_construct`)."""
    _TRACED_OWN_CONSTRUCT.add(token)
    return True


def refuse_options_without_construct(cell_class, token, options):
    """Host, after compiling: ``RuntimeError`` if ``options`` (non-default options only the train cell's own
    ``construct`` honours) were given to a subclass whose ``construct`` never runs it."""
    if token in _TRACED_OWN_CONSTRUCT:
        return
    raise RuntimeError(
        f"{', '.join(options)} would have no effect: {cell_class.__name__}.construct does not run "
        f"TrainOneStepWithLossScaleCell.construct (e.g. through super().construct(*inputs)), the only place they "
        f"act. Build the cell without them, or do it in your construct (nothing ran yet)."
    )


@ops.constexpr
def refuse_reassigned_options(names):
    """Graph (compile time): a subclass assigned these options after building and still runs the train cell's own
    ``construct``, which keeps the values the cell was built with (see ``train_cell._built_option``)."""
    option = next((name for name in names if name != "accumulation"), "accumulation_steps")
    part = " (the accumulation part is built from accumulation_steps)" if "accumulation" in names else ""
    raise RuntimeError(
        f"this cell's class assigned {', '.join(names)} after TrainOneStepWithLossScaleCell.__init__ and still runs "
        f"TrainOneStepWithLossScaleCell.construct, which keeps the values the cell was built with: give the options "
        f"to __init__ instead (super().__init__(network, optimizer, scale_sense, {option}=...)){part}, or name the "
        f"subclass's own attributes differently."
    )


@ops.constexpr
def refuse_without_host_call(token, features):
    """Graph (compile time): refuse to compile a train cell with host-side ``features`` (warn/raise policy,
    forensics) into another graph, where they would silently not run."""
    if token not in _HOST_CALLS:
        raise RuntimeError(
            f"this train cell checks {features} on the host after each call of the cell; compiled into another "
            f"graph (your own mindspore.jit function or Cell, or Model's dataset sink mode on GPU/Ascend) those "
            f"checks would silently not run. Call the train cell itself for each step (Model: "
            f"dataset_sink_mode=False), or build it with overflow_policy='skip' and debug_overflow=False."
        )
    return True


# Why the train cell's options cannot be assigned once it is built.
_BUILT = "the compiled step keeps the value the cell was built with; build a new cell."


def overrides_construct(cell):
    """Whether ``cell``'s class has a ``construct`` of its own (a subclass's, which may or may not run ours)."""
    return type(cell).construct is not type(cell).OWN_CONSTRUCT


def built_option(name, getter=None):
    """An option as the cell was built: read-only (``_BUILT``), since this class's ``construct`` keeps the value.

    A subclass with a ``construct`` of its own may assign the name for its own use, as subclasses of MindSpore's
    cell do (mindone's ``TrainOneStepWrapper`` assigns ``drop_overflow_update``, model-zoo accumulation cells
    ``accumulation_steps``): the attribute then reads the assigned value, and this class's ``construct``, if the
    subclass still calls it, refuses to compile (:func:`refuse_reassigned_options`).
    """
    fixed = read_only(name, _BUILT, getter)

    def get(self):
        assigned = self._subclass_options
        return assigned[name] if name in assigned else fixed.fget(self)

    def assign(self, value):
        if not overrides_construct(self):
            fixed.fset(self, value)
        self._subclass_options = {**self._subclass_options, name: value}
        self._reassigned_options = tuple(self._subclass_options)

    return property(get, assign, doc=f"``{name}`` as built (read-only unless a subclass has its own construct).")


# The train cell's options that act only in its own construct.
HONOURED_ONLY_BY_OUR_CONSTRUCT = (
    "drop_overflow_update",
    "clip_global_norm",
    "accumulation_steps",
    "overflow_policy",
    "debug_overflow",
    "extra_outputs",
    "lr_per_micro_batch",
)


def construct_only_options(cell, defaults):
    """The options ``cell`` was built with, at other than their ``defaults`` (the train cell's signature's), that act
    only in the train cell's own ``construct``, when its class overrides it (checked at its first call); ()
    otherwise. Reads the options as the cell reports them."""
    if not overrides_construct(cell):
        return ()
    given = ((name, getattr(cell, name)) for name in HONOURED_ONLY_BY_OUR_CONSTRUCT)
    return tuple(f"{name}={value!r}" for name, value in given if value != defaults[name])


def host_features(cell):
    """What runs on the host after each call of ``cell`` ("" if nothing): only its ``__call__`` runs it."""
    features = [f"overflow_policy={cell.overflow_policy!r}"] if cell.persistent_overflow.active else []
    return " and ".join(features + (["debug_overflow=True"] if cell.forensics is not None else []))


def keep_update_cell(cell, value):
    """Model-zoo subclasses (BERT, GPT, ...) assign ``self.loss_scaling_manager = scale_update_cell`` after
    ``super().__init__(network, optimizer, scale_update_cell)``: the update cell ``cell`` holds is accepted (nn.Cell's
    own assignment raised a KeyError, "the loss_scaling_manager child cell already exists"). Another one is refused:
    the core's scale and the compiled step are bound to the cell given when building."""
    current = cell.loss_scaling_manager
    if value is current:
        return
    held = "no update cell (a Tensor scale_sense)" if current is None else f"a {type(current).__name__}"
    raise AttributeError(
        f"{type(cell).__name__}.loss_scaling_manager cannot be replaced: this cell holds {held}, given when it was "
        f"built, and its scale and compiled step are bound to it. Assigning the same update cell again is accepted; "
        f"for another rule, build a new train cell with it."
    )
