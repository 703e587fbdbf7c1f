"""Subcommands of the gpuwarden CLI, one module each."""
