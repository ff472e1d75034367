"""Small readers for sysfs-style files, rooted anywhere so tests can build a fake tree.

Every reader returns None when the file is missing or unreadable: discovery treats each source
as optional and reports what it could not read instead of failing.
"""

from __future__ import annotations

from pathlib import Path

from finesched.cpuset import CPUSet


def read_text(path: Path) -> str | None:
    """The file's text without surrounding whitespace, or None if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    """The file's integer (e.g. ``physical_package_id``), or None if missing or not an integer."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0], 0) if text else None
    except ValueError:
        return None


def read_cpulist(path: Path) -> CPUSet | None:
    """A Linux cpulist file (``0-3,8``) as a CPUSet, or None if missing or malformed."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return CPUSet.parse(text)
    except ValueError:
        return None


def numbered(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """Entries ``<prefix><N>`` of `directory` (cpu0, node1, ...) as (N, path), in N order."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        suffix = entry.name[len(prefix) :]
        if entry.name.startswith(prefix) and suffix.isdigit():
            out.append((int(suffix), entry))
    return sorted(out)


def pci_numa(root: Path, bus_id: str) -> int | None:
    """The NUMA node of PCI device `bus_id` (``0000:3b:00.0``), None when unknown (-1) or absent."""
    value = read_int(root / "sys/bus/pci/devices" / bus_id / "numa_node")
    return value if value is not None and value >= 0 else None


def pci_root(root: Path, bus_id: str) -> str | None:
    """The PCI root complex (``pci0000:3a``) above device `bus_id`, from its resolved sysfs path.

    Devices under one root share a host bridge; finesched's ``pcie`` field groups them (S1.8).
    """
    return pci_root_of(root, root / "sys/bus/pci/devices" / bus_id)


def pci_root_of(root: Path, link: Path) -> str | None:
    """The ``pciDDDD:BB`` component of `link`'s resolved path below `root`, or None."""
    try:
        resolved = link.resolve(strict=True)
        parts = resolved.relative_to(root.resolve()).parts
    except (OSError, ValueError):
        return None
    for part in parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs writes it: ``0000:3b:00.0`` (4-hex domain, lower case)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"
