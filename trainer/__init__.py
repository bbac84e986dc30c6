"""STACX trainer."""
