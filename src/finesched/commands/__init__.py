"""CLI command implementations, one module per command group (wired in finesched.cli)."""
