"""Inference fixtures (tiny local models), shared with the other suites."""

from inference_fixtures import _one_torch_thread, tiny_model_dir  # noqa: F401
