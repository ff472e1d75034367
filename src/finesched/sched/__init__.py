"""The scheduling core: framework, runtime, queue, and the Scheduler every driver uses."""
