"""STACX sandbox."""
