"""finesched as a kube-scheduler extender (``finesched k8s-extender``), Koordinator-compatible.

convert.py (Pod -> Workload, bound Pod -> Binding), nodes.py (Node + Device CR + NodeResourceTopology
-> Node), wire.py (the extender JSON), assess.py (one Pod judged on every node: reasons, 0-10 scores),
extender.py (the verbs over one Scheduler), app.py (HTTP), api.py (the kubernetes client calls),
sync.py (list + watch into the state), setup.py (building it).
"""
