"""Inference fixtures, shared with the other suites (tests/inference_fixtures.py)."""

from inference_fixtures import _one_torch_thread, other_model_dir, tiny_model_dir  # noqa: F401
