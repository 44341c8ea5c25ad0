"""PyTorch's ``torch.amp.GradScaler`` for functional MindSpore loops, in one import.

Example:
    >>> from lossscale.torch import GradScaler
    >>> scaler = GradScaler()                 # PyTorch's defaults: 2**16, x2 after 2000 clean steps, x0.5
    >>> scaler.get_scale(), scaler.get_growth_interval()
    (65536.0, 2000)
"""

from lossscale.frontends.grad_scaler import TorchGradScaler as GradScaler

__all__ = ["GradScaler"]
