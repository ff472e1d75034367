"""The one table of amounts as every human view shows them: (amount, kind, text). The Python
formatter (`finesched.quantity.human_quantity`) and the console's (`quantity()` in
server/console/static/dom.js) are both checked against it (tests/test_quantity_views.py,
tests/browser/test_console_quantities.py)."""

from __future__ import annotations

GI = 2**30

CASES: list[tuple[int, str, str]] = [
    (0, "bytes", "0"),
    (1, "bytes", "1"),
    (1023, "bytes", "1023"),
    (1024, "bytes", "1Ki"),
    (1025, "bytes", "1.0Ki"),  # not exact: a decimal, never a bare "1Ki"
    (1536, "bytes", "1.5Ki"),
    (3 * GI // 2, "bytes", "1.5Gi"),
    (5 * GI // 4, "bytes", "1.3Gi"),  # 1.25: halves round up, in both languages
    (16 * GI, "bytes", "16Gi"),
    (10307921510, "bytes", "9.6Gi"),  # the plan table vs console
    (10 * GI - 1, "bytes", "10.0Gi"),
    (2**20 - 1, "bytes", "1.0Mi"),  # rounds to 1024Ki: the next suffix instead
    (268435456, "bytes", "256Mi"),
    (7879217152, "bytes", "7.3Gi"),
    (3 * 2**40, "bytes", "3Ti"),
    (2**63 - 1, "bytes", "8.0Ei"),
    (-1536, "bytes", "-1.5Ki"),
    (0, "cpu", "0"),
    (1, "cpu", "1m"),
    (500, "cpu", "500m"),
    (1000, "cpu", "1"),
    (1500, "cpu", "1500m"),
    (4000, "cpu", "4"),
    (2_000_000, "cpu", "2000"),
    (0, "count", "0"),
    (110, "count", "110"),
    (1000, "count", "1000"),
]

#: (resource name, amount as the API writes it, text): names pick the kind, text is read exactly.
NAMED: list[tuple[str, int | str, str]] = [
    ("memory", "10307921510", "9.6Gi"),
    ("memory", "4Gi", "4Gi"),
    ("memory", "1M", "976.6Ki"),
    ("cpu", "2k", "2000"),
    ("cpu", "500m", "500m"),
    ("cpu", 1500, "1500m"),
    ("koordinator.sh/gpu-memory", "8Gi", "8Gi"),
    ("gpu-core", 50, "50"),
    ("hugepages-2Mi", "4Mi", "4Mi"),
    ("pods", "110", "110"),
    ("memory", "9007199254740993", "8.0Pi"),  # 2^53 + 1: exact as text, not 8Pi
    ("memory", "lots", "lots"),  # no quantity: shown as it is
]
