import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).sum(dim=-1)


def get_inputs():
    return [torch.randn(16, 128)]


def get_init_inputs():
    return []
