"""A port is one import: ``lossscale.torch``, ``lossscale.paddle`` and ``lossscale.keras`` give each framework's
front-end with its own arguments, defaults, rule and state-dict keys; the top-level names keep working."""

import inspect

import pytest
from mindspore import nn

import lossscale
from lossscale.core.presets import get_preset
from lossscale.frontends.spelling import PADDLE, TORCH


def test_pytorchs_grad_scaler_with_no_arguments_is_pytorchs():
    from lossscale.torch import GradScaler

    scaler = GradScaler()
    assert isinstance(scaler, lossscale.TorchGradScaler) and scaler._rule == get_preset("pytorch")
    assert (scaler.get_scale(), scaler.get_growth_interval(), scaler.is_enabled()) == (65536.0, 2000, True)
    assert sorted(scaler.state_dict()) == sorted(TORCH.state_keys)
    assert list(inspect.signature(GradScaler).parameters)[:6] == [name for name, _ in TORCH.arguments]


def test_paddles_grad_scaler_is_paddles_alone():
    from lossscale.paddle import GradScaler

    scaler = GradScaler()
    assert scaler._rule == get_preset("paddle") and sorted(scaler.state_dict()) == sorted(PADDLE.state_keys)
    assert (scaler.get_init_loss_scaling(), scaler.get_decr_every_n_nan_or_inf()) == (32768.0, 2)
    with pytest.raises(TypeError, match="'enable' must be a bool"):  # no turn to PyTorch's spelling
        GradScaler("cuda")
    with pytest.raises(TypeError, match="GradScaler.* got an unexpected keyword argument 'init_scale'"):
        GradScaler(init_scale=8.0)


def test_keras_port_and_the_top_level_names_are_the_same_classes():
    from lossscale.keras import LossScaleOptimizer
    from lossscale.paddle import GradScaler as PaddleScaler
    from lossscale.torch import GradScaler as TorchScaler

    assert LossScaleOptimizer is lossscale.LossScaleOptimizer and TorchScaler is lossscale.TorchGradScaler
    assert issubclass(PaddleScaler, lossscale.GradScaler)
    wrapper = LossScaleOptimizer(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1))
    assert (wrapper.initial_scale, wrapper.dynamic_growth_steps) == (2.0**15, 2000)
    assert type(lossscale.GradScaler()) is lossscale.GradScaler  # Paddle's spelling, as before
    assert type(lossscale.GradScaler("cuda")) is lossscale.TorchGradScaler


@pytest.mark.parametrize("spelling", [PADDLE, TORCH], ids=["paddle", "pytorch"])
def test_each_spelling_is_written_once_and_consistent(spelling):
    """Every rule field has the framework's name; the defaults make the framework's preset; each accessor names a
    rule field; the state keys hold the scale and every rule argument."""
    defaults = spelling.defaults
    rule = {field: defaults[name] for field, name in spelling.fields.items() if name in defaults}
    assert all(getattr(get_preset(spelling.preset), field) == value for field, value in rule.items())
    assert set(spelling.accessors.values()) <= set(spelling.fields)
    assert "scale" in spelling.state_keys
    assert {spelling.name_of(f) for f in rule if f != "init_scale"} <= set(spelling.state_keys)
