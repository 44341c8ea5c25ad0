"""Wiring into MindSpore's training front-ends: ``build_train_network`` and ``Model``.

``build_train_network`` mirrors ``mindspore.amp.build_train_network`` (mixed
precision through MindSpore's own ``auto_mixed_precision`` machinery), but wraps
the network in :class:`lossscale.TrainOneStepWithLossScaleCell` whenever a
loss-scale manager is given, on every backend including CPU, where MindSpore
raises "Only `loss_scale_manager=None` ... are supported on device `CPU`".

``Model`` is ``mindspore.train.Model`` with that builder: callbacks,
``LossMonitor``, ``eval`` and metrics are MindSpore's.
"""

import inspect

from mindspore import Tensor, get_context, nn
from mindspore.amp import LossScaleManager
from mindspore.common import dtype as mstype
from mindspore.train import Model as _MindSporeModel
from mindspore.train import amp as _ms_amp
from mindspore.train import model as _ms_model

from lossscale.core._optimizers import is_loss_scale_optimizer
from lossscale.core._validation import check_bool, check_int_in_range
from lossscale.core.clipping import GlobalNormClip
from lossscale.core.overflow import make_overflow_check
from lossscale.core.presets import get_preset
from lossscale.training.bookkeeping import PersistentOverflowPolicy, check_debug_flag
from lossscale.training.managers import DynamicLossScaleManager
from lossscale.training.train_cell import TrainOneStepWithLossScaleCell

AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
BOOST_LEVELS = ("O0", "O1", "O2")
_KWARGS = ("cast_model_type", "keep_batchnorm_fp32", "loss_scale_manager")
# Keyword arguments passed through to TrainOneStepWithLossScaleCell.
TRAIN_CELL_OPTIONS = (
    "clip_global_norm",
    "accumulation_steps",
    "overflow_policy",
    "max_consecutive_overflows",
    "debug_overflow",
    "overflow_check",
    "extra_outputs",
    "lr_per_micro_batch",
)


def _refuse_loss_scale_optimizer(optimizer):
    """Keras' habit ``model.compile(optimizer=LossScaleOptimizer(...))``: Keras' ``fit`` scales for the wrapper,
    MindSpore's ``Model`` scales through ``loss_scale_manager``. Refused with the translation, instead of
    MindSpore's "The type of 'optimizer' should be one of ..." (or an unscaled training)."""
    if is_loss_scale_optimizer(optimizer):
        raise TypeError(
            f"'optimizer' is a LossScaleOptimizer. Keras' Model.fit scales the loss for it; this Model "
            f"scales through 'loss_scale_manager': pass its inner optimizer with the same rule, "
            f"optimizer=opt.inner_optimizer, loss_scale_manager={_manager_for(optimizer)}. (A "
            f"LossScaleOptimizer scales in your own training step: get_scaled_loss, "
            f"get_unscaled_gradients, apply_gradients.)"
        )


def _manager_for(wrapper):
    """The manager expression with the rule of the LossScaleOptimizer ``wrapper``, as short as it can be said."""
    if not wrapper.dynamic:
        return f"FixedLossScaleManager({wrapper.initial_scale!r})"
    policy, window = wrapper.policy, wrapper.dynamic_growth_steps
    if window is not None and policy == get_preset("tf_keras", init_scale=policy.init_scale, growth_interval=window):
        return (
            f"DynamicLossScaleManager.from_policy(get_preset('tf_keras', init_scale={policy.init_scale!r}, "
            f"growth_interval={window!r}))"
        )
    return f"DynamicLossScaleManager.from_policy({policy!r})"


def _check_build_arguments(network, optimizer, level, kwargs):
    if not isinstance(network, nn.Cell):
        raise TypeError(f"'network' must be a mindspore.nn.Cell, but got {type(network).__name__}.")
    _refuse_loss_scale_optimizer(optimizer)
    if not isinstance(optimizer, nn.Optimizer):
        raise TypeError(f"'optimizer' must be a mindspore.nn.Optimizer, but got {type(optimizer).__name__}.")
    if not isinstance(level, str) or level not in AMP_LEVELS:
        raise ValueError(f"'level' must be one of {AMP_LEVELS}, but got {level!r}.")
    for key in kwargs:
        if key not in _KWARGS + TRAIN_CELL_OPTIONS:
            raise ValueError(f"Unsupported keyword argument {key!r}; allowed: {_KWARGS + TRAIN_CELL_OPTIONS}.")
    if "cast_model_type" in kwargs and kwargs["cast_model_type"] not in (mstype.float16, mstype.float32):
        raise TypeError(
            f"'cast_model_type' must be mindspore.float16 or mindspore.float32, but got "
            f"{kwargs['cast_model_type']!r} of type {type(kwargs['cast_model_type']).__name__}."
        )
    if "keep_batchnorm_fp32" in kwargs:
        check_bool("keep_batchnorm_fp32", kwargs["keep_batchnorm_fp32"])
    manager = kwargs.get("loss_scale_manager")
    if manager is not None and not isinstance(manager, LossScaleManager):
        advice = ""
        if hasattr(manager, "get_loss_scale"):
            advice = (
                " An update cell is what a manager makes: give the manager (e.g. DynamicLossScaleManager(...)), "
                "or build TrainOneStepWithLossScaleCell with the update cell."
            )
        raise TypeError(
            f"'loss_scale_manager' must be a mindspore.amp.LossScaleManager, but got {type(manager).__name__}.{advice}"
        )
    if _ms_amp._get_pipeline_stages() > 1:
        raise ValueError(
            "pipeline parallel (pipeline_stages > 1) needs MindSpore's pipeline train cell, which "
            "splits each step into micro-batches: build it with mindspore.amp.build_train_network and a "
            "lossscale update cell (manager.get_update_cell()); lossscale's train cell does not "
            "pipeline."
        )


def _train_cell_defaults():
    """The defaults of :data:`TRAIN_CELL_OPTIONS`, read from the train cell's signature (one source of truth)."""
    parameters = inspect.signature(TrainOneStepWithLossScaleCell.__init__).parameters
    return {name: parameters[name].default for name in TRAIN_CELL_OPTIONS}


def _check_train_cell_options(options):
    """The train-cell options of ``Model`` checked before MindSpore's ``Model.__init__`` runs: the same checks as the
    train cell's, without building it. With an optimizer the train cell built in ``__init__`` would refuse them too;
    without one (evaluation only) nothing else would, and a bad option would wait for the Model that trains."""
    options = dict(_train_cell_defaults(), **options)
    if options["clip_global_norm"] is not None:
        GlobalNormClip(options["clip_global_norm"])
    check_int_in_range("accumulation_steps", options["accumulation_steps"], low=1)
    PersistentOverflowPolicy(options["overflow_policy"], options["max_consecutive_overflows"])
    check_debug_flag(options["debug_overflow"])
    if options["overflow_check"] is not None:
        make_overflow_check(options["overflow_check"])
    for flag in ("extra_outputs", "lr_per_micro_batch"):
        check_bool(flag, options[flag])


def check_boost_level(boost_level, options, manager):
    """MindSpore's boost cells replace the train cell: refuse what they would drop.

    ``boost_level`` "O1"/"O2" builds MindSpore's ``BoostTrainOneStep(WithLossScale)Cell``, which has none of
    lossscale's train-cell options (they would be ignored) and, with an update cell, does not run on CPU.
    So with a boost level the options are refused, and so is a loss-scale manager on CPU; on GPU and
    Ascend, MindSpore's boost cell runs with the manager's update cell (lossscale's rule, MindSpore's check).
    """
    if boost_level not in BOOST_LEVELS:
        raise ValueError(f"'boost_level' must be one of {BOOST_LEVELS}, but got {boost_level!r}.")
    if boost_level == "O0":
        return
    if options:
        raise ValueError(
            f"boost_level={boost_level!r} builds MindSpore's boost train cell, which has none of "
            f"lossscale's options: {', '.join(sorted(options))} would be ignored. Use boost_level='O0' "
            f"with them, or drop them."
        )
    if manager is not None and get_context("device_target") == "CPU" and manager.get_update_cell() is not None:
        raise ValueError(
            f"boost_level={boost_level!r} with a loss-scale manager builds MindSpore's "
            f"BoostTrainOneStepWithLossScaleCell, which does not run on CPU. Use boost_level='O0' (then "
            f"lossscale's train cell runs here)."
        )


def _mixed_precision_network(network, loss_fn, level, kwargs):
    """Apply MindSpore's amp level (and keyword overrides) and attach the loss, as MindSpore does."""
    config = dict(_ms_amp._config_level.get(level), **kwargs)
    network = _ms_amp._auto_mixed_precision_process(network, config, level)
    if loss_fn:
        network = _ms_amp._add_loss_network(network, loss_fn, config["cast_model_type"])
    return network, config["loss_scale_manager"]


def build_train_network(network, optimizer, loss_fn=None, level="O0", boost_level="O0", **kwargs):
    """Build a mixed-precision training cell with our loss scaling.

    Same arguments as ``mindspore.amp.build_train_network``. A ``boost_level`` other than "O0"
    hands over to MindSpore's builder (its boost cells), after :func:`check_boost_level`.
    ``level='O2'`` defaults to ``lossscale.DynamicLossScaleManager()`` like MindSpore.
    The keyword arguments in :data:`TRAIN_CELL_OPTIONS` (``clip_global_norm``,
    ``accumulation_steps``, ``overflow_policy``, ``max_consecutive_overflows``,
    ``debug_overflow``, ``overflow_check``, ``extra_outputs``, ``lr_per_micro_batch``) go to
    :class:`TrainOneStepWithLossScaleCell`;
    without a loss-scale manager they select it with a fixed scale of 1.

    Returns:
        - with a manager whose ``get_update_cell()`` is a Cell: our
          :class:`TrainOneStepWithLossScaleCell` (skips overflowing steps);
        - with ``FixedLossScaleManager(S, drop_overflow_update=False)``: the same
          cell with a fixed Tensor scale that applies every step. It unscales the
          gradients itself when the optimizer has no ``loss_scale`` (e.g.
          ``nn.AdamWeightDecay``), lets the optimizer do it when its ``loss_scale``
          is S, and raises ``ValueError`` for any other optimizer ``loss_scale``;
        - without a manager: ``mindspore.nn.TrainOneStepCell``.

    Example:
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from lossscale import DynamicLossScaleManager, build_train_network
        >>> net = nn.Dense(4, 2)
        >>> opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
        >>> train_net = build_train_network(net, opt, nn.MSELoss(), level="O2",
        ...                                 loss_scale_manager=DynamicLossScaleManager())
        >>> type(train_net).__name__
        'TrainOneStepWithLossScaleCell'
    """
    _check_build_arguments(network, optimizer, level, kwargs)
    options = {key: kwargs.pop(key) for key in TRAIN_CELL_OPTIONS if key in kwargs}
    check_boost_level(boost_level, options, kwargs.get("loss_scale_manager"))
    if boost_level != "O0":
        return _ms_amp.build_train_network(network, optimizer, loss_fn, level, boost_level, **kwargs)
    if level == "O2" and "loss_scale_manager" not in kwargs:
        kwargs["loss_scale_manager"] = DynamicLossScaleManager()
    network, manager = _mixed_precision_network(network, loss_fn, level, kwargs)
    if manager is None and not options:
        return nn.TrainOneStepCell(network, optimizer).set_train()
    update_cell = None if manager is None else manager.get_update_cell()
    if update_cell is not None:
        return TrainOneStepWithLossScaleCell(network, optimizer, scale_sense=update_cell, **options).set_train()
    fixed_scale = Tensor(1.0 if manager is None else float(manager.get_loss_scale()), mstype.float32)
    return TrainOneStepWithLossScaleCell(
        network, optimizer, scale_sense=fixed_scale, drop_overflow_update=False, **options
    ).set_train()


class Model(_MindSporeModel):
    """``mindspore.train.Model`` that trains with lossscale's cell whenever a loss-scale manager is given.

    Works on every backend including CPU (where MindSpore's ``Model`` refuses dynamic
    loss scaling). Callbacks, ``LossMonitor``, ``eval`` and metrics are MindSpore's.
    Extra keyword arguments: those of :data:`TRAIN_CELL_OPTIONS` (clipping,
    accumulation, overflow policy, forensics), passed to the train cell.
    After (or during) training ``manager.get_loss_scale()`` reports the scale the
    device holds: ``Model`` calls ``manager.update_loss_scale(overflow)`` after every
    step, which for our managers refreshes the host mirror from the device.

    Example:
        >>> from mindspore import nn
        >>> from lossscale import DynamicLossScaleManager, Model
        >>> net = nn.Dense(4, 2)
        >>> opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
        >>> model = Model(net, nn.MSELoss(), opt, loss_scale_manager=DynamicLossScaleManager())
        >>> type(model.train_network).__name__
        'TrainOneStepWithLossScaleCell'
    """

    def __init__(
        self,
        network,
        loss_fn=None,
        optimizer=None,
        metrics=None,
        eval_network=None,
        eval_indexes=None,
        amp_level="O0",
        boost_level="O0",
        **kwargs,
    ):
        _refuse_loss_scale_optimizer(optimizer)
        self._train_cell_options = {key: kwargs.pop(key) for key in TRAIN_CELL_OPTIONS if key in kwargs}
        check_boost_level(boost_level, self._train_cell_options, kwargs.get("loss_scale_manager"))
        if kwargs.get("keep_batchnorm_fp32") is not None:  # MindSpore's Model takes None as "the level's default"
            check_bool("keep_batchnorm_fp32", kwargs["keep_batchnorm_fp32"])
        _check_train_cell_options(self._train_cell_options)
        _refuse_host_counting_manager(kwargs.get("loss_scale_manager"), self._train_cell_options)
        super().__init__(
            network, loss_fn, optimizer, metrics, eval_network, eval_indexes, amp_level, boost_level, **kwargs
        )

    def _build_train_network(self):
        manager = self._loss_scale_manager if self._loss_scale_manager_set else None
        wanted = manager is not None or self._amp_level == "O2" or self._train_cell_options
        if self._optimizer is None or self._boost_level != "O0" or not wanted:
            return super()._build_train_network()
        kwargs = dict(self._train_cell_options)
        if manager is not None:
            kwargs["loss_scale_manager"] = manager
        if self._keep_bn_fp32 is not None:
            kwargs["keep_batchnorm_fp32"] = self._keep_bn_fp32
        network = build_train_network(self._network, self._optimizer, self._loss_fn, level=self._amp_level, **kwargs)
        _apply_declared_inputs(network, self._network, self._loss_fn)
        return network


def _refuse_host_counting_manager(manager, options):
    """MindSpore's ``DynamicLossScaleManager`` under accumulation: ``Model`` calls its ``update_loss_scale`` after
    every micro-batch, and it takes each False (no decision yet) for a clean optimizer step, so its host scale
    grows ahead of the device's and its ``bad_step`` stop never comes. Refused, with the replacement."""
    steps = options.get("accumulation_steps", 1)
    if isinstance(manager, _ms_amp.DynamicLossScaleManager) and steps > 1:
        raise ValueError(
            f"accumulation_steps={steps} with MindSpore's DynamicLossScaleManager: Model calls its "
            f"update_loss_scale after every micro-batch and it counts each as an optimizer step, so "
            f"its get_loss_scale() and its stop after bad_step_max overflows would not follow the "
            f"training. Use lossscale.DynamicLossScaleManager (the same arguments), which counts "
            f"optimizer steps."
        )


def _apply_declared_inputs(train_network, network, loss_fn):
    """Carry inputs declared with ``network.set_inputs`` (dynamic shapes) over, as MindSpore's Model does."""
    net_inputs = network.get_inputs()
    if loss_fn is not None and loss_fn.get_inputs() and net_inputs:
        loss_inputs = _ms_model._process_loss_inputs(loss_fn.get_inputs())
        net_inputs = _ms_model._merge_inputs(net_inputs, loss_inputs)
    if net_inputs is not None:
        _ms_model._set_with_processed_inputs(train_network, net_inputs)
