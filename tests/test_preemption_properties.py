"""Safety properties of preemption and quota reclaim under random submits, releases and runs (hypothesis).

After every step: nothing is over-allocated (state invariants); no workload was preempted by one
of lower or equal priority unless quota reclaim said so; no tenant at or under its min was a
reclaim victim; every preemption ended with its preemptor bound (or evicted later by a stronger
one in the same run) — and a run that preempts nothing evicts nothing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from builders import make_node, make_workload
from finesched.model.binding import Binding
from finesched.model.resources import ResourceVector
from finesched.model.tenant import Tenant
from finesched.plugins.deviceshare.request import TypeRequest, compile_rule, fit_mask
from finesched.plugins.preemption_model import slot_fits
from finesched.sched.framework import Preemption
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

TENANTS = ["a", "b", "c"]
HALF_GPU = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}


class PreemptionMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        # 2 NUMA nodes x 1 core x 2 threads: exclusive cpusets and SingleNUMANode take the exact path
        topo = {"sockets": 1, "numa_per_socket": 2, "cores_per_numa": 1, "threads": 2}
        nodes = [
            make_node(f"n{i}").cpu("4").memory("16Gi").gpus(1).topology(**topo).numa(2, "8Gi").obj() for i in range(3)
        ]
        tenants = [
            Tenant(name="a", min={"cpu": 4000}, max={"cpu": 8000}),
            Tenant(name="b", min={"cpu": 4000}),
            Tenant(name="c"),
        ]
        self.mins = {t.name: dict(t.min or {}) for t in tenants}
        self.s = Scheduler(ClusterState.from_nodes(nodes), tenants=tenants)
        self.count = 0

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.integers(0, 3),
        cpu=st.integers(1, 3),
        gpu=st.booleans(),
        never=st.booleans(),
    )
    def submit_and_run(self, tenant: str, priority: int, cpu: int, gpu: bool, never: bool) -> None:
        self.count += 1
        w = make_workload(f"w{self.count}").req(cpu=str(cpu), **(HALF_GPU if gpu else {})).tenant(tenant)
        w = w.priority(priority).set(preemptionPolicy="Never" if never else "PreemptLowerPriority")
        self.s.submit([w.obj()])
        self.run_and_check()

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.integers(0, 3),
        cpu=st.integers(1, 2),
        bind=st.sampled_from(["", "FullPCPUs", "SpreadByPCPUs"]),
        single_numa=st.booleans(),
    )
    def submit_exclusive_and_run(self, tenant: str, priority: int, cpu: int, bind: str, single_numa: bool) -> None:
        # LSR cpusets (and SingleNUMANode): preemption picks their victims with the real filters.
        self.count += 1
        w = make_workload(f"x{self.count}").req(cpu=str(cpu), memory="1Gi").lim(cpu=str(cpu), memory="1Gi")
        spec = {"resourceSpec": {"requiredCPUBindPolicy": bind}} if bind else {}
        if single_numa:
            spec["numaTopologyPolicy"] = "SingleNUMANode"
        self.s.submit([w.qos("LSR").tenant(tenant).priority(priority).set(**spec).obj()])
        self.run_and_check()

    @rule(tenant=st.sampled_from(TENANTS), priority=st.integers(0, 3), cpu=st.integers(1, 3))
    def submit_gang_and_run(self, tenant: str, priority: int, cpu: int) -> None:
        # Two members, all or nothing: a gang that cannot place both evicts nothing.
        self.count += 1
        gang = {"gang": {"name": f"g{self.count}", "minMember": 2}}
        members = [
            make_workload(f"g{self.count}-{i}").req(cpu=str(cpu)).tenant(tenant).priority(priority).set(**gang).obj()
            for i in range(2)
        ]
        self.s.submit(members)
        self.run_and_check()
        bound = [m.key in self.s.state.bindings for m in members]
        assert all(bound) or not any(bound)

    @rule(pick=st.integers(0, 1000))
    def release_and_run(self, pick: int) -> None:
        bound = sorted(self.s.state.bindings)
        if bound:
            self.s.release(bound[pick % len(bound)])
        self.run_and_check()

    def run_and_check(self) -> None:
        s = self.s
        before = {k: b for k, b in s.state.bindings.items()}
        usage = {t: dict(s.usage.of(t)) for t in TENANTS}
        results = s.run()
        preemptions = s.take_preemptions()
        self.check_victims(before, results, {p.preemptor: p for p in preemptions})
        evicted_later: set[str] = set()
        for p in reversed(preemptions):
            if p.preemptor not in evicted_later:
                assert s.state.bindings.get(p.preemptor) == p.binding
            evicted_later.update(p.victim_keys)
        gone = set(before) - set(s.state.bindings)
        assert gone <= {k for p in preemptions for k in p.victim_keys}, (gone, preemptions)
        for t, floor in self.mins.items():  # reclaim never took a tenant below its min
            if any(p.reasons.get(k, "").startswith("reclaim") for p in preemptions for k in p.victim_keys):
                for name, amount in floor.items():
                    if usage[t].get(name, 0) >= amount:
                        assert s.usage.of(t).get(name, 0) >= amount or t in {p.binding.tenant for p in preemptions}

    def check_victims(self, before: dict[str, Binding], results: list, preemptions: dict[str, Preemption]) -> None:
        """Replay the run in decision order: a victim of equal or higher priority is a quota reclaim,
        and at the moment of its eviction its tenant held more cpu than its min (it was borrowing;
        what it held may have been placed earlier in the same run)."""
        held = dict(before)
        for result in results:
            if not isinstance(result, Binding):
                continue
            p = preemptions.get(result.workload)
            for victim in p.victims if p is not None else ():
                reason = p.reasons[victim.workload]
                if victim.priority >= p.binding.priority:
                    assert victim.priority == p.binding.priority and reason.startswith("reclaim"), (p, reason)
                    holds = sum(b.requests.get("cpu", 0) for b in held.values() if b.tenant == victim.tenant)
                    assert holds > self.mins.get(victim.tenant, {}).get("cpu", 0), (p, holds)
                held.pop(victim.workload, None)
            held[result.workload] = result

    @invariant()
    def nothing_over_allocated(self) -> None:
        if hasattr(self, "s"):
            self.s.state.check_invariants()


PreemptionMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPreemptionProperties = PreemptionMachine.TestCase


GPU_DIMS = ("gpu-core", "gpu-memory-ratio", "gpu-memory")


@settings(max_examples=200, deadline=None)
@given(
    core=st.integers(0, 100),
    ratio=st.integers(0, 100),
    nbytes=st.sampled_from([0, 1 << 30, 20 << 30]),
    free=st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 100), st.integers(0, 80 << 30)), min_size=1, max_size=4
    ),
    memory=st.sampled_from([0, 40 << 30, 80 << 30]),
    healthy=st.booleans(),
)
def test_slot_fits_agrees_with_fit_mask(core, ratio, nbytes, free, memory, healthy) -> None:
    # The reprieve model's per-device rule is the exact allocator's fit_mask, one device at a time.
    per_device = {k: v for k, v in {"gpu-core": core, "gpu-memory-ratio": ratio, "gpu-memory": nbytes}.items() if v}
    request = TypeRequest("gpu", 1, ResourceVector(per_device), True)
    rule = compile_rule(request, GPU_DIMS)
    free_rows = np.array([[f[k] for f in free] for k in range(3)], dtype=np.int64)
    total_rows = np.array([[100] * len(free), [100] * len(free), [memory] * len(free)], dtype=np.int64)
    health = np.array([healthy] * len(free))
    want = fit_mask(rule, free_rows, total_rows, health).tolist()
    got = [slot_fits(rule, free_rows.tolist(), total_rows.tolist(), healthy, s) for s in range(len(free))]
    assert got == want
