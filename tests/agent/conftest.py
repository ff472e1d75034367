"""Fixtures of the agent tests: directories workloads of any uid can reach (tests/reachable.py)."""

from reachable import exchange, work_root

__all__ = ["exchange", "work_root"]
