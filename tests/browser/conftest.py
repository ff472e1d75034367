"""Real-browser fixtures: Debian's chromium, headless, driven by Playwright for Python.

Playwright is pointed at the system chromium (`executable_path`); it never downloads a browser.
Without chromium (apt-get install chromium) the browser tests are skipped with that reason, unless
FINESCHED_REQUIRE_BROWSER=1 (`.ci/run`, which installs it), where a missing chromium is a failure.
Root needs --no-sandbox; the other flags keep chromium off the network.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

for helpers in ("server", "agent"):  # server_harness and manifests; agent_cluster (a real node agent)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / helpers))

CHROMIUM = os.environ.get("FINESCHED_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).is_file():
        why = f"no chromium at {CHROMIUM} (Debian: apt-get install chromium; .ci/run installs it)"
        if os.environ.get("FINESCHED_REQUIRE_BROWSER") == "1":
            pytest.fail(f"FINESCHED_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    if os.environ.get("FINESCHED_REQUIRE_BROWSER") == "1":
        from playwright import sync_api  # required: a missing dev extra is a failure, not a skip
    else:
        sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()
