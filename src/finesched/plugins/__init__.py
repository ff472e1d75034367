"""Built-in plugins; each implements only the extension points it needs (sched/framework.py)."""
