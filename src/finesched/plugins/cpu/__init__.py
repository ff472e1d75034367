"""Exact CPU allocation (seed S3): the Koordinator and kubelet algorithms, and what they share.

The public import path is `finesched.plugins.cpu_orchestration`; these modules hold the pieces:

* `topology`: the derived, shared topology index (`topo_info`), errors, `AllocatedCPU`;
* `koordinator`: `take_cpus` and the resource manager's required-policy / NUMA-hint steps;
* `kubelet`: `kubelet_take_by_topology`, `kubelet_static_allocate`, the automatic reservation;
* `config`: a node's CPU / NUMA policies resolved from labels, `policies` and kubelet config;
* `request`: what a workload asks of the CPU plugins, compiled once per cycle, and the offer key;
* `prefilter`: the vectorized (and small-batch) necessary conditions both filters use.
"""
