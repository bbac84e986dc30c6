"""The SFT warm start runs the trainer's `sft` recipe in process and exports a servable model."""

from __future__ import annotations

from pathlib import Path

from quickstart_plugin import arithmetic

from stacx.infra.pipeline.config import SFTConfig
from stacx.infra.pipeline.sft import DemonstrationEncoder, demonstration_batches, run_sft


def test_sft_trains_and_exports_an_hf_directory(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from stacx.rollout.models import make_tiny_model
    from stacx.rollout.tokens import HFTokenizer

    base = make_tiny_model(tmp_path / "base", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1)
    tokenizer = HFTokenizer(str(base))
    sft = SFTConfig(steps=3, skill_steps=1, batch_size=4, lr=1e-2, warmup_steps=0)
    source = arithmetic().ArithmeticTasks(num_train=4, num_heldout=4)
    batches = demonstration_batches(source.demonstration, DemonstrationEncoder(tokenizer=tokenizer),
                                    sft, end_token="<|im_end|>")
    losses: list[tuple[int, float]] = []
    out = run_sft(base, tmp_path / "models", batches, lr=sft.lr,
                  on_step=lambda step, loss: losses.append((step, loss)))
    assert out.parent.name == "sft" and out.name == "v00000003"
    assert [s for s, _ in losses] == [1, 2, 3]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    before = load_file(str(base / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    name = "model.embed_tokens.weight"
    assert not bool((before[name] == after[name]).all())  # the weights were trained
