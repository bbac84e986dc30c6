"""Weight export in Hugging Face layout (config.json + model.safetensors + tokenizer files).

Files are written to a hidden temporary directory next to the target and renamed into place, so a
reader never sees a half-written version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

__all__ = ["TOKENIZER_FILES", "content_hash", "export_hf", "prune_exports"]

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
    "generation_config.json",
)


def _split(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor],
                                                    dict[str, torch.Tensor]]:
    """StacxModel keys -> (HF backbone weights, extra head weights), prefixes stripped."""
    hf: dict[str, torch.Tensor] = {}
    heads: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        # clone: tied weights share storage, which safetensors refuses
        value = tensor.detach().to("cpu").contiguous().clone()
        if key.startswith("backbone."):
            hf[key.removeprefix("backbone.")] = value
        else:
            heads[key] = value
    return hf, heads


def content_hash(state: dict[str, torch.Tensor]) -> str:
    """`sha256:<hex>` of a state dict's names, dtypes, shapes and bytes (key order irrelevant):
    equal weights give equal hashes, so a re-announced version is recognisably the same."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return f"sha256:{digest.hexdigest()}"


def export_hf(state: dict[str, torch.Tensor], hf_config: Any, dest: Path,
              tokenizer_dir: str | None = None) -> Path:
    """Write `state` (a StacxModel state dict) as an HF model directory at `dest`, atomically."""
    from safetensors.torch import save_file

    hf, heads = _split(state)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        hf_config.save_pretrained(str(tmp))
        save_file(hf, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if heads:
            save_file(heads, str(tmp / "value_head.safetensors"), metadata={"format": "pt"})
        for name in TOKENIZER_FILES if tokenizer_dir else ():
            src = Path(tokenizer_dir) / name  # type: ignore[arg-type]
            if src.is_file():
                shutil.copy2(src, tmp / name)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def prune_exports(root: Path, keep_last: int | None) -> None:
    """Delete all but the newest `keep_last` exported versions under `root`."""
    if keep_last is None:
        return
    versions = sorted(p for p in root.glob("v*") if p.is_dir())
    for old in versions[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
