"""Subcommand modules of the `stacx` CLI; each exposes `register(subparsers)`.

Keep imports of heavy libraries (torch, transformers) inside the command functions so that
`stacx --help` stays fast.
"""
