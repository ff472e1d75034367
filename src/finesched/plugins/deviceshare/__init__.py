"""Device scheduling (seeds S0.2-S0.5, S1.1-S1.8): fractional GPUs, RDMA, FPGA and any device type.

`normalize_device_request` (request.py) turns a workload's requests into a `DeviceRequest`,
`allocate_devices` (allocator.py) chooses devices on one node, `DeviceShare` (plugin.py) runs both
in the scheduling cycle over `DeviceAccounts` (state/devices.py), `DeviceScore` (scoring.py)
scores nodes by device use, and annotations.py reads and writes Koordinator's annotation.
hints.py and hint_filter.py apply a workload's deviceAllocateHint (selector, allocateStrategy,
requiredTopologyScope, exclusivePolicy) in the filter and the allocator alike.
"""

from finesched.model.device_allocated import (
    DEVICE_ALLOCATED,
    AnnotationError,
    format_device_allocated,
    parse_device_allocated,
)
from finesched.plugins.deviceshare.allocator import DeviceAllocation, InsufficientDevices, allocate_devices
from finesched.plugins.deviceshare.plugin import DEVICE_OFFERS, DEVICE_REQUEST, DeviceOffers, DeviceShare
from finesched.plugins.deviceshare.request import (
    DeviceRequest,
    InvalidDeviceRequest,
    JointSpec,
    TypeRequest,
    normalize_device_request,
)
from finesched.plugins.deviceshare.scoring import DEVICE_SHARES, DeviceScore, DeviceShares

__all__ = [
    "DEVICE_ALLOCATED",
    "DEVICE_OFFERS",
    "DEVICE_REQUEST",
    "DEVICE_SHARES",
    "AnnotationError",
    "DeviceAllocation",
    "DeviceOffers",
    "DeviceRequest",
    "DeviceScore",
    "DeviceShare",
    "DeviceShares",
    "InsufficientDevices",
    "InvalidDeviceRequest",
    "JointSpec",
    "TypeRequest",
    "allocate_devices",
    "format_device_allocated",
    "normalize_device_request",
    "parse_device_allocated",
]
