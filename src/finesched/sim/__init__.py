"""Trace-driven simulation over the same scheduler core."""
