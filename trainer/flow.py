"""A tiny 2-D flow-matching model, so the recipe machinery trains diffusion policies too.

Samples travel in ordinary TrainingBatches: a row is `[FLOW_TOKEN, qx, qy]`, the point's
coordinates in fixed point (`round(x * POINT_SCALE)`, int32 token ids), loss mask `[0, 1, 1]`.
The model's forward pass decodes the points x1, draws `num_draws` pairs (noise x0 ~ N(0, I),
time t ~ U(0, 1)) per row, and returns the squared error of its velocity at
x_t = (1 - t) x0 + t x1 against the straight-path target x1 - x0 (rectified flow):

    flow_error[i, k] = || v(x_t^ik, t_ik) - (x1_i - x0_ik) ||^2          [B, K]

The draws are seeded by the rows' contents, so the policy and a frozen reference see the same
(x0, t) for the same sample (what Diffusion-DPO's ratio needs). Shape legend: B rows, K draws.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from stacx.schemas.records import TrainingBatch, logprobs, loss_mask, token_ids
from stacx.trainer.errors import ConfigError, RecipeError
from stacx.trainer.protocols import ModelOutput

__all__ = ["FLOW_TOKEN", "POINT_SCALE", "FlowConfig", "FlowModel", "decode_points",
           "point_batch"]

POINT_SCALE = 1 << 12
"""Fixed-point scale of a coordinate in a token id (resolution 1/4096)."""
FLOW_TOKEN = 1
"""First token of every flow row (the unconditional 'prompt')."""


@dataclass(kw_only=True, slots=True)
class FlowConfig:
    """Shape of the velocity network (a model slot's `tiny` dict for a `flow` head)."""

    hidden_size: int = 64
    """Width of the MLP."""
    num_layers: int = 3
    """Hidden layers."""
    num_draws: int = 16
    """(noise, time) draws per sample in one forward pass (K)."""
    time_features: int = 8
    """Sinusoidal features of t."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_draws", "time_features"):
            if getattr(self, name) < 1:
                raise ConfigError(f"flow model: {name}={getattr(self, name)} must be >= 1")


def decode_points(input_ids: torch.Tensor) -> torch.Tensor:
    """[B, L>=3] flow rows -> [B, 2] float32 points."""
    if input_ids.shape[1] < 3:
        raise RecipeError(f"flow rows are [FLOW_TOKEN, qx, qy]; got length {input_ids.shape[1]}")
    return input_ids[:, 1:3].to(torch.float32) / POINT_SCALE


def _content_seed(input_ids: torch.Tensor) -> int:
    digest = hashlib.sha256(input_ids.detach().cpu().numpy().tobytes()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class FlowModel(nn.Module):
    """Velocity field v(x, t) on R^2: an MLP on (x, sinusoidal features of t)."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.flow_config = config
        width, layers = config.hidden_size, []
        size = 2 + 2 * config.time_features
        for _ in range(config.num_layers):
            layers += [nn.Linear(size, width), nn.SiLU()]
            size = width
        self.net = nn.Sequential(*layers, nn.Linear(width, 2))
        self.freqs: torch.Tensor
        self.register_buffer("freqs", torch.exp(torch.linspace(0.0, math.log(100.0),
                                                               config.time_features)),
                             persistent=False)

    @property
    def config(self) -> FlowConfig:
        return self.flow_config

    def velocity(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [N, 2], t [N] -> v [N, 2]."""
        angles = t.unsqueeze(-1) * self.freqs  # [N, F]
        return self.net(torch.cat([x, torch.sin(angles), torch.cos(angles)], dim=-1))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        x1 = decode_points(input_ids).to(self.freqs.device)  # [B, 2]
        b, k = x1.shape[0], self.flow_config.num_draws
        gen = torch.Generator().manual_seed(_content_seed(input_ids))
        x0 = torch.randn(b, k, 2, generator=gen).to(x1.device)  # [B, K, 2]
        t = torch.rand(b, k, generator=gen).to(x1.device)  # [B, K]
        xt = (1 - t).unsqueeze(-1) * x0 + t.unsqueeze(-1) * x1.unsqueeze(1)  # [B, K, 2]
        v = self.velocity(xt.reshape(-1, 2), t.reshape(-1)).reshape(b, k, 2)
        target = x1.unsqueeze(1) - x0
        return ModelOutput(flow_error=((v - target) ** 2).sum(-1))  # [B, K]

    @torch.no_grad()
    def sample(self, num: int, *, steps: int = 20, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        """`num` points [num, 2] by Euler integration of dx/dt = v(x, t) from noise at t = 0."""
        x = torch.randn(num, 2, generator=generator).to(self.freqs.device)
        for i in range(steps):
            t = torch.full((num,), i / steps, device=x.device)
            x = x + self.velocity(x, t) / steps
        return x

    def hf_module(self) -> nn.Module:
        return self


def build_flow_model(overrides: dict[str, Any], seed: int) -> FlowModel:
    """A randomly initialised FlowModel (seeded) from a dict of FlowConfig fields."""
    try:
        config = FlowConfig(**overrides)
    except TypeError as exc:
        raise ConfigError(f"flow model `tiny` options: {exc}; valid: hidden_size, num_layers, "
                          "num_draws, time_features") from exc
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FlowModel(config)


def point_batch(batch_id: str, points: torch.Tensor, rewards: torch.Tensor, *,
                group_size: int = 1, policy_version: int = 0) -> TrainingBatch:
    """Pack points [B, 2] and their rewards [B] as a TrainingBatch of flow rows; consecutive
    `group_size` rows form one group (pairs for preference recipes)."""
    n = int(points.shape[0])
    if n % group_size:
        raise ValueError(f"{n} points do not split into groups of group_size={group_size}")
    q = torch.round(points.detach().cpu().double() * POINT_SCALE).to(torch.int64).numpy()
    rows = np.concatenate([np.full((n, 1), FLOW_TOKEN), q], axis=1).reshape(-1)
    mask = np.tile(np.array([0.0, 1.0, 1.0]), n)
    groups = [f"{batch_id}-g{i // group_size}" for i in range(n)]
    return TrainingBatch(
        batch_id=batch_id, model_name="flow", trajectory_ids=[f"{batch_id}-{i}" for i in range(n)],
        group_ids=groups, task_types=["flow"] * n,
        policy_versions=np.full(n, policy_version, dtype=np.int32),
        offsets=np.arange(0, 3 * n, 3, dtype=np.int32), lengths=np.full(n, 3, dtype=np.int32),
        prompt_lengths=np.ones(n, dtype=np.int32), token_ids=token_ids(rows),
        loss_mask=loss_mask(mask), logprobs=logprobs(np.zeros(3 * n)),
        rewards=rewards.detach().cpu().numpy().astype(np.float32),
    )
