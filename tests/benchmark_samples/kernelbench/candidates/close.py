import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Off by 0.1 % of the output: within KernelBench v0.1's 1e-2, outside its fp32 1e-4."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + b) * self.scale * 1.001
