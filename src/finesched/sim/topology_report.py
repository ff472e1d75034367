"""`sim topology --out DIR`: topology.json, two plots (GPU allocation and whole free racks over time,
one line per policy, first seed) and a self-contained HTML report, in the style of `sim replay`'s."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from finesched.sim.report import _STYLE, _img, _meta_html

Result = dict[str, Any]
#: The summary's columns: (key, header) — means over seeds of the record's values.
SUMMARY_FIELDS = (
    ("gangs", "gangs"),
    ("in_one_rack_pct", "in one rack %"),
    ("in_one_block_pct", "in one block %"),
    ("gang_wait_mean_s", "gang wait mean s"),
    ("gang_wait_p99_s", "gang wait p99 s"),
    ("never_placed", "never placed"),
    ("pod_wait_mean_s", "pod wait mean s"),
    ("alloc_mean", "GPU alloc mean %"),
    ("free_racks_mean", "whole racks free (mean)"),
    ("free_racks_min", "whole racks free (min)"),
    ("level_violations", "level violations"),
)


def summary(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per policy, in run order: the mean over seeds of every `SUMMARY_FIELDS` value, and the seed count."""
    out: dict[str, dict[str, float]] = {}
    for policy in dict.fromkeys(r["policy"] for r in records):
        rows = [_flat(r) for r in records if r["policy"] == policy]
        out[policy] = {"seeds": len(rows), **{k: round(fmean(r[k] for r in rows), 2) for k, _ in SUMMARY_FIELDS}}
    return out


def _flat(record: Mapping[str, Any]) -> dict[str, float]:
    wait = record["gang_wait_s"]
    return {**record, "gang_wait_mean_s": wait["mean"], "gang_wait_p99_s": wait["p99"]}


def write_topology(out: Path, runs: Sequence[Result], meta: Mapping[str, Any]) -> list[Path]:
    """topology.json, alloc.png, racks.png and report.html in `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    records = [r["record"] for r in runs]
    table = summary(records)
    paths = [out / "topology.json", out / "alloc.png", out / "racks.png", out / "report.html"]
    series = [{"policy": r["record"]["policy"], "seed": r["record"]["seed"], **r["series"]} for r in runs]
    payload = {"meta": dict(meta), "summary": table, "results": records, "series": series}
    paths[0].write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    _plot(paths[1], runs, "alloc", "GPU allocation (%)")
    _plot(paths[2], runs, "free_racks", "whole racks free (every GPU idle)")
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in SUMMARY_FIELDS)
    rows = "".join(
        f"<tr><th>{html.escape(p)}</th>" + "".join(f"<td>{s[k]:g}</td>" for k, _ in SUMMARY_FIELDS) + "</tr>"
        for p, s in table.items()
    )
    paths[3].write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>finesched sim topology</title>{_STYLE}</head>"
        f"<body><h1>Topology-aware gangs: placement, waits and whole racks</h1>{_meta_html(meta)}"
        f"<p>Means over seeds; gang wait in simulated seconds; racks over the arrival window.</p>"
        f"<table><tr><th>policy</th>{head}</tr>{rows}</table>{_img(paths[1])}{_img(paths[2])}</body></html>\n",
        encoding="utf-8",
    )
    return paths


def _plot(path: Path, runs: Sequence[Result], key: str, ylabel: str) -> None:
    """One line per policy (its first seed) of series `key` over simulated hours."""
    fig, ax = plt.subplots(figsize=(11, 4))
    seen: set[str] = set()
    for run in runs:
        policy = run["record"]["policy"]
        if policy in seen:
            continue
        seen.add(policy)
        hours = [t / 3600.0 for t in run["series"]["t"]]
        ax.step(hours, run["series"][key], where="post", label=f"{policy} (seed {run['record']['seed']})")
    ax.set_ylabel(ylabel)
    ax.set_xlabel("simulated time (h)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
