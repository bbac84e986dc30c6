"""The commented starter config that `stacx init` writes."""

from __future__ import annotations

__all__ = ["STARTER_CONFIG"]

STARTER_CONFIG = """\
# A STACX pipeline: your model, your tasks, GRPO through the whole loop.
#   stacx run THIS.yaml --explain    # validate, and print what every service will get
#   stacx run THIS.yaml              # train; results in runs/<name>/ (report.json, reward_curve.png)
# Needs the local services: `stacx infra up`. Walk-through: docs/own-tasks.md.
# Relative paths: from the working directory when they exist there, else from this file's folder.

bootstrap_servers: 127.0.0.1:9092  # Kafka (default: $STACX_KAFKA, else 127.0.0.1:9092)

pipeline:
  name: my-run                     # results go to runs/my-run/
  steps: 20                        # GRPO policy versions to train
  stall_timeout_s: 600             # stop with a diagnosis when nothing moves this long
  model:
    path: models/my-model          # a Hugging Face causal-LM directory (config.json, weights, tokenizer)
    # tiny: {hidden_size: 64}      # instead: make a tiny random Qwen2 in the run directory
  tasks:
    harbor: tasks                  # a folder of Harbor tasks (`stacx tasks check tasks` first)
    # jsonl: tasks.jsonl           # or TaskSample rows (`stacx tasks import` writes them)
    # topic: stacx.tasks           # or a Kafka topic of TaskSample events
    # heldout: heldout-tasks       # evaluation set (folder or .jsonl); default: the training tasks
  evaluation:
    every_versions: 4              # evaluate every 4 policy versions (0: before and after only)
    final_samples_per_problem: 1   # samples per task before and after training (0: none)

gateway:                           # the sandbox gateway (`stacx gateway --config` reads the same section)
  port: 8710
inference:                         # the inference server (`stacx serve --config`); the model is the run's
  server: {port: 30010}

rollout:                           # `stacx rollout` config: data source, URLs and topics come from the run
  data: {samples_per_task: 4, epochs: 0, shuffle: true}   # samples_per_task: the GRPO group size
  manager:
    max_concurrent_episodes: 16
    train_groups_per_version: 4    # groups per trainer step (= assembler.mixture.batch_size)
    pool: {sandboxes: 16, cpu: 16, memory_mb: 16384, generations: 16, gpus: 0}
    evaluators:
      default:                     # every task type (add a section named after a task type to differ)
        scaffold: terminal         # retool | terminal | single_turn
        reward: verifier           # the task's tests write /logs/verifier/reward.txt; or a registered reward
        max_turns: 8
        max_tokens: 4096
        max_new_tokens: 256
        temperature: 1.0
        episode: {sandboxes: 1, memory_mb: 512}
        step: {cpu: 1}

assembler:                         # `stacx assemble` config: topics come from the run
  grouping: {group_size: 4, group_timeout_s: 300.0}   # = rollout.data.samples_per_task
  filtering: {ok_statuses: [COMPLETED, TRUNCATED]}    # out of turns or tokens: trained on, reward 0
  mixture: {batch_size: 4, batch_unit: groups}

trainer:                           # `stacx train` config: model, topics and directories come from the run
  recipe: grpo                     # `stacx recipes` lists them
  optimizer: {lr: 1.0e-5}
  backend: {kind: fsdp2, world_size: 2, device: auto}
  checkpoint: {every_steps: 5}
"""
