"""STACX rollout."""
