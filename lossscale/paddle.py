"""Paddle's ``paddle.amp.GradScaler`` for functional MindSpore loops, in one import.

The defaults are those of Paddle 2.4 and earlier (2**15, x2 after 1000 clean steps, x0.5 after 2 bad ones), the
signature this port implements; Paddle 2.5 and later default to 2**16, 2000 and 1: ``GradScaler.from_preset(
"paddle_2_5")`` is that rule in one argument.

Example:
    >>> from lossscale.paddle import GradScaler
    >>> GradScaler().get_init_loss_scaling(), GradScaler().get_decr_every_n_nan_or_inf()          # Paddle <= 2.4
    (32768.0, 2)
    >>> today = GradScaler.from_preset("paddle_2_5")                                               # Paddle >= 2.5
    >>> today.get_init_loss_scaling(), today.get_incr_every_n_steps(), today.get_decr_every_n_nan_or_inf()
    (65536.0, 2000, 1)
"""

from lossscale.frontends.grad_scaler import PaddleGradScaler as GradScaler

__all__ = ["GradScaler"]
