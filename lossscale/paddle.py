"""Paddle's ``paddle.amp.GradScaler`` for functional MindSpore loops, in one import.

Example:
    >>> from lossscale.paddle import GradScaler
    >>> scaler = GradScaler()                 # Paddle's documented defaults: 2**15, x2 after 1000, x0.5 after 2 bad
    >>> scaler.get_init_loss_scaling(), scaler.get_decr_every_n_nan_or_inf()
    (32768.0, 2)
"""

from lossscale.frontends.grad_scaler import PaddleGradScaler as GradScaler

__all__ = ["GradScaler"]
