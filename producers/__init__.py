"""STACX producers."""
