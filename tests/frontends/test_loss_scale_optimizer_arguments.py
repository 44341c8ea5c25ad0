"""LossScaleOptimizer's arguments, held to tf.keras' loss_scale_optimizer_test.py: hyperparameters delegated
to the inner optimizer, learning rates, bad arguments as tf.keras' errors, bad inner optimizers, and nesting."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from nets import Square, regression_net, scalar_of

from lossscale import LossScaleOptimizer


def test_hyperparameters_are_delegated():
    inner = nn.Adam(Square().trainable_params(), learning_rate=0.01, beta1=0.8)
    opt = LossScaleOptimizer(inner)
    assert opt.inner_optimizer is inner and scalar_of(opt.beta1) == pytest.approx(0.8)
    assert opt.parameters is inner.parameters and opt.iterations is inner.global_step
    opt.learning_rate = 0.5
    assert scalar_of(inner.learning_rate) == 0.5 and scalar_of(opt.lr) == 0.5
    opt.lr = Parameter(Tensor(np.float32(0.25)), name="new_lr")  # 0.1.0 failed on a Parameter
    assert scalar_of(inner.learning_rate) == 0.25
    opt.learning_rate = Tensor(np.float32(0.125))
    assert scalar_of(inner.learning_rate) == 0.125
    opt.learning_rate = 0.0  # Keras accepts a rate of 0 (a frozen step)
    assert scalar_of(inner.learning_rate) == 0.0


@pytest.mark.parametrize(
    "inner, name, value",
    [
        (lambda params: nn.Adam(params, learning_rate=0.01, beta1=0.8), "beta1", 0.7),  # a graph constant
        (lambda params: nn.Adam(params, learning_rate=0.01), "eps", 1e-4),
        (lambda params: nn.Momentum(params, 0.01, momentum=0.9), "momentum", 0.5),  # a Parameter
    ],
    ids=["adam_beta1", "adam_eps", "momentum"],
)
def test_setting_another_hyperparameter_is_refused_not_hidden(inner, name, value):
    """tf.keras forwards a hyperparameter set on the wrapper (`opt.beta_1 = 0.7`); here only the learning rate is.
    Setting another one made a wrapper attribute that reads returned while the inner optimizer trained with its
    own value: refused now, naming where to set it. Nothing changes; the wrapper's own attributes still set."""
    optimizer = inner(Square().trainable_params())
    opt = LossScaleOptimizer(optimizer)
    before = scalar_of(getattr(optimizer, name))
    with pytest.raises(
        AttributeError,
        match=rf"cannot set '{name}' on a LossScaleOptimizer: .* give {name} to the "
        rf"inner optimizer when building it \({type(optimizer).__name__}\(",
    ):
        setattr(opt, name, value)
    assert name not in vars(opt) and scalar_of(getattr(opt, name)) == before == scalar_of(getattr(optimizer, name))
    opt.note = "mine"  # an attribute the inner optimizer does not have
    opt.set_train(False)  # nn.Cell's own attributes
    assert opt.note == "mine" and not opt.training


@pytest.mark.parametrize(
    "name, hint",
    [
        ("get_config", "save_checkpoint"),
        ("from_config", "save_checkpoint"),
        ("get_weights", "get_parameters"),
        ("set_weights", "load_param_into_net"),
        ("variables", "get_parameters"),
        ("no_such_thing", None),
    ],
)
def test_a_missing_attribute_is_named_on_the_wrapper(name, hint):
    """An attribute neither the wrapper nor the inner optimizer has was reported as "The 'SGD' object has no
    attribute ..." (the inner optimizer's error), also for Keras' own methods that have no MindSpore
    counterpart (get_config/from_config, get_weights/set_weights, variables). Both are named now, with the
    MindSpore way for Keras' methods; still an AttributeError, so hasattr() answers False."""
    opt = LossScaleOptimizer(nn.SGD(Square().trainable_params(), 0.1))
    with pytest.raises(
        AttributeError,
        match=rf"'LossScaleOptimizer' object has no attribute '{name}', and its "
        rf"inner optimizer \(SGD\) has none either",
    ) as missing:
        getattr(opt, name)
    if hint is not None:
        assert hint in str(missing.value)
    assert not hasattr(opt, name)
    assert hasattr(opt, "learning_rate") and hasattr(opt, "parameters")


@pytest.mark.parametrize(
    "value",
    [float("nan"), -1.0, True, "0.1", Tensor(np.ones(2, np.float32)), float("inf"), Tensor(np.zeros(0, np.float32))],
)
def test_bad_learning_rates_are_refused(value):
    opt = LossScaleOptimizer(nn.SGD(Square().trainable_params(), 0.1))
    with pytest.raises(ValueError, match="'learning_rate'"):
        opt.learning_rate = value
    assert scalar_of(opt.learning_rate) == pytest.approx(0.1)


def test_learning_rate_of_a_schedule_is_refused():
    schedule = nn.ExponentialDecayLR(0.1, 0.9, 10)
    opt = LossScaleOptimizer(nn.SGD(Square().trainable_params(), schedule))
    with pytest.raises(ValueError, match="schedule"):
        opt.learning_rate = 0.5


def test_learning_rate_of_parameter_groups_is_refused_and_left_as_it_is():
    params = regression_net().trainable_params()
    groups = [
        {"params": [p for p in params if "weight" in p.name], "lr": 0.1},
        {"params": [p for p in params if "bias" in p.name], "lr": 0.01},
    ]
    opt = LossScaleOptimizer(nn.SGD(groups, 0.05))
    rates = [round(scalar_of(rate), 6) for rate in opt.inner_optimizer.learning_rate]  # one per parameter
    assert sorted(set(rates)) == [0.01, 0.1]
    with pytest.raises(ValueError, match="per-group rates"):
        opt.learning_rate = 0.5
    assert [round(scalar_of(rate), 6) for rate in opt.inner_optimizer.learning_rate] == rates


BAD_ARGUMENTS = [
    (dict(dynamic=False), "'initial_scale' must be specified if 'dynamic' is False"),
    (dict(dynamic=False, initial_scale=8.0, dynamic_growth_steps=10), "'dynamic_growth_steps' must be None"),
    (dict(dynamic="yes"), "'dynamic' must be a bool"),
    (dict(dynamic=1), "'dynamic' must be a bool"),
    (dict(initial_scale=0.0), "'initial_scale'"),
    (dict(initial_scale=-1.0), "'initial_scale'"),
    (dict(initial_scale=0.5), "'initial_scale'.*1.0"),  # below the floor of 1
    (dict(initial_scale=float("nan")), "'initial_scale'"),
    (dict(initial_scale=float("inf")), "'initial_scale'"),
    (dict(initial_scale="8"), "'initial_scale'"),
    (dict(dynamic=False, initial_scale=1e-45), "'initial_scale'"),
    (dict(dynamic=False, initial_scale="8"), "'initial_scale'"),
    (dict(dynamic_growth_steps=0), "'dynamic_growth_steps'"),
    (dict(dynamic_growth_steps=2.5), "'dynamic_growth_steps'"),
    (dict(dynamic_growth_steps=True), "'dynamic_growth_steps'"),
    (dict(policy="keras", initial_scale=8.0), "either 'policy'"),
    (dict(policy="keras", dynamic=False), "either 'policy'"),
    (dict(policy="keras", dynamic_growth_steps=10), "either 'policy'"),
    (dict(clipnorm=1.0), "does not support `clipnorm`. Instead, set `clipnorm` on the `inner_optimizer`"),
    (dict(momentum=0.9), "does not support `momentum`. Instead, set `momentum` on the `inner_optimizer`"),
    (dict(loss_scale=8.0), "does not support `loss_scale`. Instead"),
    (dict(foo=1, bar=2), "does not support arguments: `foo`, `bar`"),
    (dict(name="a b"), "'name'"),
]


@pytest.mark.parametrize("kwargs, pattern", BAD_ARGUMENTS, ids=[str(c[0]) for c in BAD_ARGUMENTS])
def test_bad_arguments_are_value_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        LossScaleOptimizer(nn.Momentum(Square().trainable_params(), 0.1, 0.9), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [dict(dynamic="yes"), dict(momentum=0.9), dict(foo=1)],
    ids=["dynamic", "inner_keyword", "unknown_keyword"],
)
def test_tf_keras_type_errors_are_also_type_errors(kwargs):
    """Keras documents ValueError for invalid arguments; tf.keras' code raises TypeError for these."""
    with pytest.raises(TypeError):
        LossScaleOptimizer(nn.Momentum(Square().trainable_params(), 0.1, 0.9), **kwargs)


@pytest.mark.parametrize(
    "inner, pattern",
    [
        ("sgd", "'inner_optimizer' must be a mindspore.nn.Optimizer, but got str.$"),
        (None, "'inner_optimizer'"),
        (
            ms.experimental.optim.Adam(Square().trainable_params(), lr=0.1),
            "must be a mindspore.nn.Optimizer, but got Adam. MindSpore's PyTorch-style optimizers "
            ".* use lossscale.GradScaler",
        ),
        (nn.Momentum(Square().trainable_params(), 0.1, 0.9, loss_scale=128.0), "'optimizer.loss_scale' is 128.0"),
    ],
)
def test_bad_inner_optimizers(inner, pattern):
    with pytest.raises(ValueError, match=pattern) as refused:
        LossScaleOptimizer(inner)
    assert isinstance(refused.value, TypeError) == (not isinstance(inner, nn.Optimizer))  # tf.keras: TypeError


def test_an_optimizer_is_wrapped_once_and_a_wrapper_is_not_wrapped():
    inner = nn.SGD(Square().trainable_params(), 0.1)
    wrapper = LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped by a LossScaleOptimizer"):
        LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="cannot wrap another LossScaleOptimizer") as refused:
        LossScaleOptimizer(wrapper)
    assert isinstance(refused.value, TypeError)  # tf.keras' type
