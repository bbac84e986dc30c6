import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The same computation written another way: (a + b) * s == a * s + b * s."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.add(a * self.scale, b, alpha=self.scale)
