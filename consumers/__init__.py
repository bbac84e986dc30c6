"""STACX consumers."""
