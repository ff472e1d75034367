"""The control plane: a durable store, the scheduling loop and the HTTP API (a driver above `sched/`)."""
