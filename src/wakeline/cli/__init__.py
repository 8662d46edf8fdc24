"""The ``wakeline`` command line: one module per command, each a thin wrapper."""
