"""The command line: one module per sub-command, registered by explicit import in ``parsim.cli.main``."""
