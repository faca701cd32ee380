"""Per-sample forward FLOPs of a model (PyTorch's FlopCounterMode), for compute costs."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@torch.no_grad()
def forward_flops(model: nn.Module, image_size: int = 32, in_channels: int = 3) -> float:
    """FLOPs of one forward pass of one image (eval mode; the model's mode is restored)."""
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    x = torch.zeros(1, in_channels, image_size, image_size, device=param.device, dtype=param.dtype)
    with FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was_training)
    return float(counter.get_total_flops())
