"""Scheduling profiles the tests give servers as YAML files (`serve --profile`, LoopConfig.profile)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from finesched.sched.profile import BUILTIN_PROFILES


def defrag_profile(directory: Path, **settings: Any) -> Path:
    """The default profile with the defragmenter on (`settings`: its camelCase fields, e.g.
    maxMovesPerMinute=1), written to `directory`/defrag.yaml."""
    doc = BUILTIN_PROFILES["default"].model_dump(mode="json", by_alias=True, exclude_defaults=True)
    doc |= {"name": "defrag", "defragmentation": settings}
    path = directory / "defrag.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
