"""The node agent (seed S0.6): discovery, the Resource Manager (reports) and the Deploy Executor.

discover.py, gpus.py and rdma.py read the machine; report.py builds the encoded reports;
launch.py, cgroup.py and state.py start, confine and remember workload processes; executor.py
verifies bindings and reconciles; client.py speaks the control plane's HTTP API; loop.py ties
them together for `finesched agent`.
"""
