"""The console's amount formatter (`quantity()`, `resourceAmount()` in static/dom.js) run in chromium
against the same table as the Python one (tests/quantity_table.py): every view, CLI or console, writes
an amount the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import finesched.server.console as console_package
from quantity_table import CASES, NAMED

DOM_JS = Path(console_package.__file__).with_name("static") / "dom.js"


def test_the_console_formats_the_table_as_python_does(browser: Any) -> None:
    page = browser.new_page()
    page.goto("about:blank")
    # The module's functions as plain script globals (about:blank cannot import an ES module from disk).
    page.add_script_tag(content=re.sub(r"^export ", "", DOM_JS.read_text(), flags=re.MULTILINE))
    # Amounts as the API sends them: JSON numbers within 2^53, decimal text beyond.
    sent = [v if abs(v) <= 2**53 - 1 else str(v) for v, _, _ in CASES]
    shown = page.evaluate("([values, kinds]) => values.map((v, i) => quantity(v, kinds[i]))",
                          [sent, [k for _, k, _ in CASES]])  # fmt: skip
    assert shown == [text for _, _, text in CASES]
    named = page.evaluate("(cases) => cases.map(([name, v]) => resourceAmount(name, v))",
                          [[n, v] for n, v, _ in NAMED])  # fmt: skip
    assert named == [text for _, _, text in NAMED]
    page.close()


def test_the_console_names_a_mig_grants_instance(browser: Any) -> None:
    page = browser.new_page()
    page.goto("about:blank")
    page.add_script_tag(content=re.sub(r"^export ", "", DOM_JS.read_text(), flags=re.MULTILINE))
    shown = page.evaluate(
        """() => [
            grantText("gpu", 0, {}, {profile: "1g.10gb", start: 4, uuid: "MIG-x"}),
            grantText("gpu", 1, {"gpu-core": "50", "gpu-memory": "8589934592"}, undefined),
        ]"""
    )
    assert shown == ["gpu 0: MIG 1g.10gb at start 4", "gpu 1: 50% core, 8Gi"]
    page.close()
