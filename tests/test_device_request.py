"""Device request normalization, rule by rule from CPU-DEVICE-SEMANTICS.md "Koordinator device sharing",
and the per-device fit rule (compile_rule / fit_mask / explain_type) as pure functions."""

from __future__ import annotations

import numpy as np
import pytest

from finesched.model.workload import DeviceJointAllocate
from finesched.plugins.deviceshare import InvalidDeviceRequest, JointSpec, normalize_device_request
from finesched.plugins.deviceshare.request import FitRule, compile_rule, device_resource, explain_type, fit_mask
from finesched.sched.framework import Code

GI = 2**30
CORE, MEM, RATIO = "gpu-core", "gpu-memory", "gpu-memory-ratio"
GPU_DIMS = (CORE, RATIO, MEM)


def gpu(request):
    return normalize_device_request(request).types["gpu"]


# Translation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "count", "per_device", "shared"),
    [
        # nvidia.com/gpu N -> core = ratio = 100·N -> N whole GPUs of 100/100
        pytest.param({"nvidia.com/gpu": "2"}, 2, {CORE: 100, RATIO: 100}, False, id="nvidia-2"),
        pytest.param({"amd.com/gpu": 1}, 1, {CORE: 100, RATIO: 100}, False, id="amd-1"),
        pytest.param({"dcu.com/gpu": 3}, 3, {CORE: 100, RATIO: 100}, False, id="dcu-3"),
        # gpu: 50 -> core 50 + ratio 50, on one GPU (shared: ratio < 100)
        pytest.param({"koordinator.sh/gpu": "50"}, 1, {CORE: 50, RATIO: 50}, True, id="shortcut-50"),
        pytest.param({"kubernetes.io/gpu": 50}, 1, {CORE: 50, RATIO: 50}, True, id="deprecated-name"),
        pytest.param({"gpu": 100}, 1, {CORE: 100, RATIO: 100}, False, id="short-name-whole"),
        # gpu: 200 -> ratio 200 > 100 and divisible -> count 2, each 200/2 = 100
        pytest.param({"koordinator.sh/gpu": 200}, 2, {CORE: 100, RATIO: 100}, False, id="shortcut-200"),
        pytest.param({CORE: 50, RATIO: 60}, 1, {CORE: 50, RATIO: 60}, True, id="core-and-ratio"),
        pytest.param({CORE: 60, MEM: "4Gi"}, 1, {CORE: 60, MEM: 4 * GI}, True, id="core-and-bytes"),
        # ratio present -> gpu-memory dropped (refilled per card after allocation)
        pytest.param({CORE: 50, RATIO: 50, MEM: "4Gi"}, 1, {CORE: 50, RATIO: 50}, True, id="bytes-dropped-with-ratio"),
        pytest.param({RATIO: 200}, 2, {RATIO: 100}, False, id="ratio-only-200"),
        pytest.param({MEM: "8Gi"}, 1, {MEM: 8 * GI}, True, id="bytes-only"),
        # count is 1 without a ratio > 100: gpu-core 200 + bytes asks 200 core on ONE GPU (Koordinator)
        pytest.param({CORE: 200, MEM: "8Gi"}, 1, {CORE: 200, MEM: 8 * GI}, True, id="core-200-bytes-one-gpu"),
        # core 50 + ratio 200 -> count 2: core 50/2 = 25, ratio 200/2 = 100 each
        pytest.param({CORE: 50, RATIO: 200}, 2, {CORE: 25, RATIO: 100}, False, id="divide-by-count"),
        # gpu.shared S: count = S; core 100/2 = 50, ratio 100/2 = 50
        pytest.param(
            {"koordinator.sh/gpu.shared": 2, CORE: 100, RATIO: 100}, 2, {CORE: 50, RATIO: 50}, True, id="shared-2"
        ),
        pytest.param({"gpu.shared": 2, "gpu": 150}, 2, {CORE: 75, RATIO: 75}, True, id="shared-shortcut"),
        # bytes with shared: 16Gi / 2 = 8Gi per GPU
        pytest.param({"gpu.shared": 2, CORE: 100, MEM: "16Gi"}, 2, {CORE: 50, MEM: 8 * GI}, True, id="shared-bytes"),
    ],
)
def test_gpu_translation_and_split(request_, count, per_device, shared):
    r = gpu(request_)
    assert (r.count, dict(r.per_device), r.shared) == (count, per_device, shared)


def test_issue_api_example():
    r = normalize_device_request({"nvidia.com/gpu": "2"})
    assert r.types["gpu"].count == 2
    assert r.types["gpu"].per_device == {"gpu-core": 100, "gpu-memory-ratio": 100}
    assert r.types["gpu"].shared is False
    assert normalize_device_request({}).types == {}


@pytest.mark.parametrize(
    ("request_", "want"),
    [
        pytest.param({"koordinator.sh/gpu": 0, "cpu": 4000}, {}, id="zero-dropped-nothing-left"),
        pytest.param({"cpu": 4000, "memory": 8 * GI}, {}, id="scalars-pass-through"),
        # rdma 100 -> 1 whole device; 300 -> 3 devices of 100; 50 -> a half device
        pytest.param({"koordinator.sh/rdma": 100}, {"rdma": (1, 100)}, id="rdma-1"),
        pytest.param({"rdma": 300}, {"rdma": (3, 100)}, id="rdma-3"),
        pytest.param({"kubernetes.io/fpga": 50}, {"fpga": (1, 50)}, id="fpga-half"),
    ],
)
def test_other_types(request_, want):
    got = {t: (r.count, r.per_device[t]) for t, r in normalize_device_request(request_).types.items()}
    assert got == want


def test_manifest_defined_type_needs_no_code():
    # S1.4: "npu" is known only because a node manifest has npu devices.
    r = normalize_device_request({"koordinator.sh/npu": 200, "cpu": 1000}, device_types={"gpu", "npu"})
    assert (r.types["npu"].count, dict(r.types["npu"].per_device)) == (2, {"npu": 100})
    assert device_resource("npu", {"npu"}) == ("npu", "npu")
    assert device_resource("npu") is None  # unknown types are plain scalar names


# Validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        pytest.param({"koordinator.sh/gpu": 150}, "invalid resource unit koordinator.sh/gpu: 150", id="gpu-150"),
        pytest.param({"rdma": 250}, "invalid resource unit koordinator.sh/rdma: 250", id="rdma-250"),
        pytest.param({"fpga": 101}, "invalid resource unit koordinator.sh/fpga: 101", id="fpga-101"),
        pytest.param({CORE: 150, RATIO: 100}, "invalid resource unit koordinator.sh/gpu-core: 150", id="core-150"),
        pytest.param(
            {CORE: 100, RATIO: 150}, "invalid resource unit koordinator.sh/gpu-memory-ratio: 150", id="ratio-150"
        ),
        pytest.param({CORE: 50}, "invalid resource device requests: [koordinator.sh/gpu-core]", id="core-alone"),
        pytest.param(
            {"nvidia.com/gpu": 1, CORE: 50, RATIO: 50},
            "invalid resource device requests: "
            "[koordinator.sh/gpu-core koordinator.sh/gpu-memory-ratio nvidia.com/gpu]",
            id="nvidia-mixed-with-koordinator",
        ),
        pytest.param(
            {"gpu.shared": 2}, "invalid resource device requests: [koordinator.sh/gpu.shared]", id="shared-alone"
        ),
        # shared 3: 100 is not a multiple of 3
        pytest.param(
            {"gpu.shared": 3, CORE: 100, RATIO: 99}, "koordinator.sh/gpu-core: 100 (with", id="shared-not-multiple"
        ),
        # shared 2: 300 > 100·2
        pytest.param({"gpu.shared": 2, "gpu": 300}, "koordinator.sh/gpu: 300 (with", id="shared-above-100S"),
        pytest.param(
            {MEM: "-1Gi", CORE: 10}, "koordinator.sh/gpu-memory: -1Gi (must not be negative)", id="negative-memory"
        ),
        pytest.param({"gpu": "1.5x"}, "invalid resource unit koordinator.sh/gpu:", id="bad-quantity"),
        pytest.param({"gpu-core": 50, "koordinator.sh/gpu-core": 50, RATIO: 50}, "requested twice", id="alias-twice"),
    ],
)
def test_invalid_requests(request_, message):
    with pytest.raises(InvalidDeviceRequest, match=None) as exc:
        normalize_device_request(request_)
    assert message in str(exc.value)


def test_invalid_request_names_offenders():
    with pytest.raises(InvalidDeviceRequest) as exc:
        normalize_device_request({"koordinator.sh/gpu": 150})
    assert exc.value.names == ("koordinator.sh/gpu",) and exc.value.values == ("150",)


@pytest.mark.parametrize(
    ("joint", "ok"),
    [
        pytest.param(DeviceJointAllocate(device_types=("gpu", "rdma")), True, id="gpu-rdma"),
        pytest.param(JointSpec(("gpu", "rdma"), "SameNUMA"), True, id="same-numa"),
        pytest.param(DeviceJointAllocate(device_types=("gpu", "fpga")), False, id="type-not-requested"),
        pytest.param(JointSpec(("gpu", "xpu")), False, id="unknown-device-type"),
        pytest.param(JointSpec(("gpu", "gpu")), False, id="duplicate"),
        pytest.param(JointSpec(("gpu", "rdma"), "SameRack"), False, id="bad-scope"),
    ],
)
def test_joint_spec(joint, ok):
    request = {"gpu": 100, "rdma": 100}
    if ok:
        assert normalize_device_request(request, joint=joint).joint.types == tuple(
            joint.device_types if hasattr(joint, "device_types") else joint.types
        )
    else:
        with pytest.raises(InvalidDeviceRequest, match="deviceJointAllocate"):
            normalize_device_request(request, joint=joint)


# The fit rule ---------------------------------------------------------------------------------------


def arrays(*devices):
    """[K, 1, D] free and total from (free_core, free_ratio, free_mem, total_mem) per device."""
    free = np.array([[[d[0] for d in devices]], [[d[1] for d in devices]], [[d[2] for d in devices]]], dtype=np.int64)
    total = np.array([[[100] * len(devices)], [[100] * len(devices)], [[d[3] for d in devices]]], dtype=np.int64)
    return free, total


@pytest.mark.parametrize(
    ("request_", "device", "fits"),
    [
        # ratio 50 on an 80Gi card with 40Gi free: 40Gi >= 50·80Gi/100 = 40Gi -> fits
        pytest.param({CORE: 50, RATIO: 50}, (50, 50, 40 * GI, 80 * GI), True, id="ratio-exact"),
        # ratio 50 needs 20Gi on a 40Gi card but only 19Gi free (bytes taken by bytes grants) -> no
        pytest.param({CORE: 50, RATIO: 50}, (100, 60, 19 * GI, 40 * GI), False, id="ratio-needs-bytes-per-card"),
        pytest.param({CORE: 60, RATIO: 50}, (50, 100, 80 * GI, 80 * GI), False, id="core-short"),
        # bytes 20Gi on an 80Gi card -> ratio ⌊20·100/80⌋ = 25 must be free too; 24 free -> no
        pytest.param({CORE: 10, MEM: 20 * GI}, (100, 24, 80 * GI, 80 * GI), False, id="bytes-needs-ratio"),
        pytest.param({CORE: 10, MEM: 20 * GI}, (100, 25, 20 * GI, 80 * GI), True, id="bytes-exact"),
        # a shared ratio on a card without a memory figure cannot be converted -> never fits
        pytest.param({CORE: 50, RATIO: 50}, (100, 100, 0, 0), False, id="ratio-share-no-memory-figure"),
        # a whole GPU needs no conversion
        pytest.param({CORE: 100, RATIO: 100}, (100, 100, 0, 0), True, id="whole-gpu-no-memory-figure"),
    ],
)
def test_fit_rule(request_, device, fits):
    rule = compile_rule(gpu(request_), GPU_DIMS)
    free, total = arrays(device)
    assert fit_mask(rule, free, total, np.ones((1, 1), dtype=bool)).tolist() == [[fits]]


def test_rule_for_missing_dimension():
    assert compile_rule(gpu({CORE: 50, RATIO: 50}), (CORE, RATIO)).missing == (MEM,)
    assert compile_rule(gpu({CORE: 100, RATIO: 100}), (CORE, RATIO)) == FitRule(((0, 100), (1, 100)))


def test_unhealthy_device_never_fits():
    rule = compile_rule(gpu({"gpu": 50}), GPU_DIMS)
    free, total = arrays((100, 100, 80 * GI, 80 * GI))
    assert not fit_mask(rule, free, total, np.zeros((1, 1), dtype=bool)).any()


def explain(request_, *devices, healthy=None, valid=None):
    r = gpu(request_)
    free, total = arrays(*devices) if devices else (np.zeros((3, 1, 0), np.int64), np.zeros((3, 1, 0), np.int64))
    d = len(devices)
    h = np.ones((1, d), bool) if healthy is None else np.array([healthy])
    v = np.ones((1, d), bool) if valid is None else np.array([valid])
    out = explain_type("gpu", compile_rule(r, GPU_DIMS), r.count, GPU_DIMS, free, total, h, v)
    # codes are per node (a Code, or a bool array: True = unresolvable on that node); one node here
    return {reason: _code_of(code) for reason, (mask, code) in out.items() if mask[0]}


def _code_of(code):
    if isinstance(code, np.ndarray):
        return Code.UNRESOLVABLE if code[0] else Code.UNSCHEDULABLE
    return code


@pytest.mark.parametrize(
    ("request_", "devices", "kw", "want"),
    [
        pytest.param({"gpu": 50}, [], {}, {"node has no gpu": Code.UNRESOLVABLE}, id="no-gpu"),
        pytest.param(
            {CORE: 10, RATIO: 50},
            [(100, 40, 32 * GI, 80 * GI)],
            {},
            {"insufficient gpu-memory on any single GPU": Code.UNSCHEDULABLE},
            id="memory-single",
        ),
        # 90 core on a 100-core card is possible when it empties -> unschedulable, 200 never -> unresolvable
        pytest.param(
            {CORE: 200, MEM: "1Gi"},
            [(100, 100, 80 * GI, 80 * GI)],
            {},
            {"insufficient gpu-core on any single GPU": Code.UNRESOLVABLE},
            id="core-never",
        ),
        pytest.param(
            {"nvidia.com/gpu": 2},
            [(100, 100, 80 * GI, 80 * GI), (50, 50, 40 * GI, 80 * GI)],
            {},
            {"insufficient free GPUs": Code.UNSCHEDULABLE},
            id="free-gpus",
        ),
        pytest.param(
            {"nvidia.com/gpu": 3},
            [(100, 100, 80 * GI, 80 * GI), (100, 100, 80 * GI, 80 * GI)],
            {},
            {"insufficient free GPUs": Code.UNRESOLVABLE},
            id="too-few-gpus-ever",
        ),
        pytest.param(
            {"gpu": 50},
            [(100, 100, 80 * GI, 80 * GI)],
            {"healthy": [False]},
            {"gpu device unhealthy": Code.UNSCHEDULABLE},
            id="unhealthy-only",
        ),
        pytest.param(
            {"gpu": 50},
            [(100, 100, 0, 0)],
            {},
            {"GPUs report no gpu-memory (a gpu-memory-ratio share needs it)": Code.UNRESOLVABLE},
            id="ratio-without-memory-figure",
        ),
    ],
)
def test_explain_type(request_, devices, kw, want):
    assert explain(request_, *devices, **kw) == want


# Huawei NPU names (Koordinator deviceshare/utils.go) ------------------------------------------------------

NPU = "huawei.com/npu-core"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        # npu-core alone says nothing about device memory: invalid, like gpu-core alone
        pytest.param({NPU: 8}, "invalid resource device requests: [huawei.com/npu-core]", id="npu-core-alone"),
        pytest.param(
            {NPU: 8, MEM: "4Gi"},
            "invalid resource device requests: [huawei.com/npu-core koordinator.sh/gpu-memory]",
            id="npu-core-with-bytes",
        ),
        pytest.param(
            {NPU: 8, CORE: 50, RATIO: 50},
            "invalid resource device requests: "
            "[huawei.com/npu-core koordinator.sh/gpu-core koordinator.sh/gpu-memory-ratio]",
            id="npu-core-with-gpu-core",
        ),
        pytest.param(
            {NPU: 8, RATIO: 150}, "invalid resource unit koordinator.sh/gpu-memory-ratio: 150", id="ratio-150"
        ),
    ],
)
def test_invalid_npu_requests(request_, message):
    with pytest.raises(InvalidDeviceRequest) as exc:
        normalize_device_request(request_)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("request_", "count", "per_device", "shared"),
    [
        pytest.param({NPU: 8, RATIO: 50}, 1, {NPU: 8, RATIO: 50}, True, id="npu-share"),
        # ratio 200 -> two NPUs, each with half the AI cores
        pytest.param({NPU: 16, "koordinator.sh/gpu-memory-ratio": 200}, 2, {NPU: 8, RATIO: 100}, False, id="npu-2"),
    ],
)
def test_npu_core_with_ratio_is_a_gpu_type_request(request_, count, per_device, shared):
    assert device_resource(NPU) == ("gpu", NPU)
    r = gpu(request_)
    assert (r.count, dict(r.per_device), r.shared) == (count, per_device, shared)


def test_bytes_share_on_cards_without_memory_figure_names_a_gpu_memory_share():
    dims = (CORE, RATIO)  # no card in the cluster reports gpu-memory
    free = total = np.full((2, 1, 1), 100, dtype=np.int64)
    ones = np.ones((1, 1), bool)
    reasons = {}
    for request_ in ({CORE: 10, MEM: "4Gi"}, {CORE: 10, RATIO: 50}):
        r = gpu(request_)
        reasons.update(explain_type("gpu", compile_rule(r, dims), r.count, dims, free, total, ones, ones))
    assert sorted(reasons) == [
        "GPUs report no gpu-memory (a gpu-memory share needs it)",
        "GPUs report no gpu-memory (a gpu-memory-ratio share needs it)",
    ]
