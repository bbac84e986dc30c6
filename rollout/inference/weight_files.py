"""Read HF-layout safetensors checkpoints and check them against a loaded model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from stacx.rollout.inference.errors import WeightLoadError

__all__ = ["check_state_dict", "read_state_dict", "safetensors_files"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The checkpoint's safetensors files (one file, or the shards its index names)."""
    root = Path(model_dir)
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    index = root / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / shard for shard in shards]
    raise WeightLoadError(
        f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}; point model_path at a directory "
        "written by save_pretrained(safe_serialization=True)"
    )


def read_state_dict(model_dir: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint at `model_dir`, on `device`."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in safetensors_files(model_dir):
        try:
            state.update(load_file(str(path), device=str(device)))
        except (OSError, ValueError, RuntimeError) as exc:
            raise WeightLoadError(f"cannot read {path}: {exc}") from exc
    return state


def check_state_dict(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map each unique model parameter name to its new tensor (cast to the parameter's dtype).

    Raises `WeightLoadError` naming unknown, missing or mis-shaped tensors.
    """
    params = dict(model.named_parameters())  # tied weights appear once
    all_names = set(model.state_dict())
    unknown = sorted(set(state) - all_names)
    missing = sorted(set(params) - set(state))
    if unknown or missing:
        raise WeightLoadError(
            f"checkpoint does not match the loaded model: unknown tensors {unknown[:5]}, "
            f"missing tensors {missing[:5]}; was it saved from the same architecture?"
        )
    update: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        tensor = state[name]
        if tensor.shape != param.shape:
            raise WeightLoadError(
                f"tensor {name} has shape {tuple(tensor.shape)}, the model expects {tuple(param.shape)}"
            )
        update[name] = tensor.to(device=param.device, dtype=param.dtype)
    return update
