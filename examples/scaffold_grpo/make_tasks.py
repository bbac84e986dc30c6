"""Write the Harbor tasks and the SFT transcripts of the scaffold GRPO example.

    .venv/bin/python examples/scaffold_grpo/make_tasks.py    # rewrites train/, heldout/, transcripts.jsonl

Every task is "write the word W to the file N.txt" for a file name N and a word W from two small
vocabularies. The (N, W) pairs are split: `heldout/` pairs are never trained on (neither in the
SFT transcripts nor in GRPO), `train/` holds the GRPO tasks, `transcripts.jsonl` one expert and
one novice answer for every pair that is not held out. The answers are mini-swe-agent actions
(one ```bash block): the expert's writes the word and submits, the novice's only creates the
file (reward 0) and submits.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("notes", "hello", "data", "todo", "plan", "memo", "list", "info", "draft", "report", "log", "idea")
WORDS = ("apple", "river", "stone", "green", "cloud", "tiger", "piano", "lemon", "ocean", "maple", "sugar")
WORDS += ("robot",)
NUM_HELDOUT = 12
NUM_TRAIN = 24
SEED = 0
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
IMAGE = "stacx/sandbox:bookworm"
WORKDIR = "/workspace"


def instruction(name: str, word: str) -> str:
    """The task's instruction.md, as the scaffold gets it (with its final newline)."""
    return f"Write the word {word} to the file {name}.txt.\n"


def expert_answer(name: str, word: str) -> str:
    return f"```bash\necho {word} > {name}.txt && {SUBMIT}\n```"


def novice_answer(name: str, word: str) -> str:
    return f"```bash\ntouch {name}.txt && {SUBMIT}\n```"


def _task_toml(name: str, word: str) -> str:
    return f"""schema_version = "1.1"

[task]
name = "stacx/write-{name}-{word}"
description = "Write one word to a file."

[metadata]
difficulty = "easy"
category = "write-word"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 60.0

[environment]
docker_image = "{IMAGE}"
workdir = "{WORKDIR}"
cpus = 1
memory_mb = 256
network_mode = "no-network"
"""


def _test_sh(name: str, word: str) -> str:
    return f"""#!/bin/bash
# Reward 1 when {WORKDIR}/{name}.txt holds exactly "{word}" and a newline.
mkdir -p /logs/verifier
file={WORKDIR}/{name}.txt
if [ "$(cat "$file" 2>/dev/null)" = "{word}" ] && [ "$(wc -c < "$file")" = "{len(word) + 1}" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def write_task(root: Path, name: str, word: str) -> None:
    task = root / f"write-{name}-{word}"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text(_task_toml(name, word))
    (task / "instruction.md").write_text(instruction(name, word))
    (task / "tests" / "test.sh").write_text(_test_sh(name, word))
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {word} > {WORKDIR}/{name}.txt\n")
    for script in (task / "tests" / "test.sh", task / "solution" / "solve.sh"):
        script.chmod(0o755)


def split() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """(held-out pairs, GRPO training pairs, every pair that is not held out)."""
    pairs = [(n, w) for n in NAMES for w in WORDS]
    random.Random(SEED).shuffle(pairs)
    heldout, rest = pairs[:NUM_HELDOUT], pairs[NUM_HELDOUT:]
    return heldout, rest[:NUM_TRAIN], rest


def main() -> None:
    heldout, train, rest = split()
    for folder, pairs in (("heldout", heldout), ("train", train)):
        root = HERE / folder
        shutil.rmtree(root, ignore_errors=True)
        for name, word in pairs:
            write_task(root, name, word)
    rows = []
    for name, word in sorted(rest):
        for kind, answer in (("expert", expert_answer), ("novice", novice_answer)):
            rows.append({"instruction": instruction(name, word), "answer": answer(name, word), "kind": kind})
    (HERE / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(heldout)} held-out tasks, {len(train)} training tasks, {len(rows)} transcripts")


if __name__ == "__main__":
    main()
