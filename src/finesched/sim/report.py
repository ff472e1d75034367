"""Write experiment results: CSV, JSON, PNG plots and a self-contained HTML report.

Fill plots: allocation rate and fragmentation amount against arrived demand, one line per policy
(the median over seeds) with a band from the 25th to the 75th percentile of the seeds (the FGD
reference's median and 50 % band), full range and a zoom on 88-130 %. Replay plots: GPU allocation
and queue length over time, and the queueing-delay CDF. The HTML embeds the PNGs (base64), so the
report is one file to share.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import platform
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt

from finesched.sim import metrics
from finesched.sim.policies import PUBLISHED_130

Result = dict[str, Any]
FloatArray = npt.NDArray[np.float64]
#: The zoomed panel starts at this arrived demand (percent).
ZOOM_FROM = 88


#: The trace the published figures are for (FGD-PROTOCOL.md; Weng et al. Fig. 9a).
PUBLISHED_TRACE = "openb_pod_list_default.csv"


def is_published_trace(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every record ran the default pod list (so the published means apply)."""
    return bool(records) and all(Path(str(r.get("trace", ""))).name == PUBLISHED_TRACE for r in records)


def _frag_ratio(record: Mapping[str, Any], point: int) -> float:
    """The record's F / Σ R_n (percent) at `point`; NaN for records written before it was kept."""
    value = record.get("frag_ratio", {}).get(str(point))
    return float("nan") if value is None else float(value)


def fill_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: mean and std over seeds at every report point, plus failed pods and wall time.

    Fragmentation is the mean over seeds of both the amount (F / capacity, ``frag_amount_*``) and the
    ratio (F / Σ R_n, the share of the idle GPU milli that is fragmented, ``frag_ratio_*``).

    ``published_130`` (the paper's mean) is added only when the records ran the default pod list.
    """
    published = PUBLISHED_130 if is_published_trace(records) else {}
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in records):
        rows = [r for r in records if r["policy"] == policy]
        entry: dict[str, Any] = {"seeds": len(rows)}
        for point in metrics.REPORT_POINTS:
            mean, std = metrics.mean_std([r["alloc"][str(point)] for r in rows])
            entry[f"mean_{point}"], entry[f"std_{point}"] = round(mean, 4), round(std, 4)
            frag, _ = metrics.mean_std([r["frag_amount"][str(point)] for r in rows])
            entry[f"frag_amount_{point}"] = round(frag, 4)
            ratio, _ = metrics.mean_std([_frag_ratio(r, point) for r in rows])
            entry[f"frag_ratio_{point}"] = round(ratio, 4)
        entry["failed_mean"] = round(float(np.mean([r["failed"] for r in rows])), 1)
        entry["wall_s_mean"] = round(float(np.mean([r["wall_s"] for r in rows])), 3)
        if policy in published:
            entry["published_130"] = published[policy]
        out[policy] = entry
    return out


def json_view(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `-o json` shape: results rows and {policy: {mean_130, std_130}}."""
    keys = ("policy", "seed", "alloc", "unallocated_130", "frag_amount", "failed", "wall_s")
    extra = ("evictions", "evicted_by_priority", "alloc_by_priority")  # runs with a priority mix only
    summary = fill_summary(records)
    return {
        "results": [{k: r[k] for k in (*keys, *(e for e in extra if e in r))} for r in records],
        "summary": {p: {"mean_130": s["mean_130"], "std_130": s["std_130"]} for p, s in summary.items()},
    }


# Fill -----------------------------------------------------------------------------------------------------
def write_fill(out: Path, runs: Sequence[Result], meta: Mapping[str, Any], lp: Mapping[str, Any] | None) -> list[Path]:
    """results.csv, results.json, alloc.png, frag.png and report.html in `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    records = [r["record"] for r in runs]
    summary = fill_summary(records)
    paths = [out / "results.csv", out / "results.json", out / "alloc.png", out / "frag.png", out / "report.html"]
    _write_fill_csv(paths[0], records)
    curves = [{"policy": r["record"]["policy"], "seed": r["record"]["seed"], **_rounded(r["curves"])} for r in runs]
    payload = {"meta": dict(meta), "summary": summary, "lp_bound": lp or {}, "results": records, "curves": curves}
    paths[1].write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    _curve_plot(paths[2], runs, "alloc", "GPU allocation rate (%)")
    _curve_plot(paths[3], runs, "frag_amount", "fragmentation amount (% of GPU capacity)")
    paths[4].write_text(_fill_html(summary, meta, lp, paths[2], paths[3]), encoding="utf-8")
    return paths


def _rounded(curves: Mapping[str, Sequence[float]]) -> dict[str, list[float | None]]:
    return {k: [None if v != v else round(float(v), 4) for v in values] for k, values in curves.items()}


def _write_fill_csv(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    points = [str(p) for p in metrics.REPORT_POINTS]
    header = ["policy", "seed", "trace", "pods", *(f"alloc_{p}" for p in points), "unallocated_130"]
    header += [f"frag_amount_{p}" for p in points] + [f"frag_ratio_{p}" for p in points] + ["failed", "wall_s"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for r in records:
            writer.writerow(
                [r["policy"], r["seed"], r.get("trace", ""), r.get("pods", "")]
                + [r["alloc"][p] for p in points]
                + [r["unallocated_130"]]
                + [r["frag_amount"][p] for p in points]
                + [r.get("frag_ratio", {}).get(p) for p in points]
                + [r["failed"], r["wall_s"]]
            )


def _by_policy(runs: Sequence[Result]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for run in runs:
        out.setdefault(run["record"]["policy"], []).append(run)
    return out


def seed_band(ys: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per column of `ys` (seeds x points): median, 25th and 75th percentile, NaNs ignored.

    The FGD reference plots the median with a 50 % band; a lowest-to-highest band would widen with
    every added seed and let one outlier seed set it. Columns without any value (demand points no
    arrival rounded to) stay NaN, which matplotlib leaves as a gap.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice" for the empty columns
        median = np.nanmedian(ys, axis=0)
        lo, hi = np.nanpercentile(ys, [25, 75], axis=0)
    return median, lo, hi


def _curve_plot(path: Path, runs: Sequence[Result], key: str, ylabel: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    floor = np.inf
    for policy, group in _by_policy(runs).items():
        x = np.asarray(group[0]["curves"]["x"], dtype=float)
        median, lo, hi = seed_band(np.asarray([g["curves"][key] for g in group], dtype=float))
        for ax in axes:
            (line,) = ax.plot(x, median, label=policy, linewidth=1.4)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        tail = lo[x >= ZOOM_FROM + 7]
        if tail.size and np.isfinite(tail).any():
            floor = min(floor, float(np.nanmin(tail)))
    axes[0].set_title("all arrivals")
    axes[1].set_title(f"zoom: {ZOOM_FROM}-130 % arrived")
    axes[1].set_xlim(ZOOM_FROM, 130)
    if key == "alloc" and np.isfinite(floor):
        axes[1].set_ylim(max(0.0, floor - 1.0), min(100.0, axes[1].get_ylim()[1]))
    for ax in axes:
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(loc="best", fontsize=8)
    fig.suptitle("line: median over seeds; band: 25th to 75th percentile of seeds (middle 50 %)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}" style="max-width:100%">'


def _meta_html(meta: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in meta.items())
    machine = f"{platform.machine()}, Python {platform.python_version()}"
    return f"<table>{rows}<tr><th>machine</th><td>{html.escape(machine)}</td></tr></table>"


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}</style>"
)


def _fill_html(
    summary: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any], lp: Mapping[str, Any] | None, *images: Path
) -> str:
    points = metrics.REPORT_POINTS
    head = "".join(f"<th>alloc @{p} %</th>" for p in points)
    rows = []
    for policy, s in summary.items():
        cells = "".join(f"<td>{s[f'mean_{p}']:.2f}</td>" for p in points)
        published = s.get("published_130")
        rows.append(
            f"<tr><th>{html.escape(policy)}</th><td>{s['seeds']}</td>{cells}<td>{s['std_130']:.2f}</td>"
            f"<td>{'' if published is None else f'{published:.2f}'}</td><td>{100 - s['mean_130']:.2f}</td>"
            f"<td>{s['frag_amount_130']:.2f}</td><td>{s['frag_ratio_130']:.2f}</td>"
            f"<td>{s['failed_mean']:.0f}</td><td>{s['wall_s_mean']:.1f}</td></tr>"
        )
    table = (
        f"<table><tr><th>policy</th><th>seeds</th>{head}<th>std @130</th><th>published @130</th>"
        "<th>unallocated @130</th><th>frag amount @130</th><th>frag ratio @130</th><th>failed pods</th>"
        "<th>wall s</th></tr>"
        f"{''.join(rows)}</table>"
    )
    lp_html = ""
    if lp:
        per_point = {p: [v[str(p)] for v in lp.values() if str(p) in v] for p in points}
        cells = "".join(f"<td>{np.mean(v):.2f}</td>" if v else "<td></td>" for v in per_point.values())
        lp_html = (
            "<h2>LP upper bound</h2><p>Offline relaxation over the pods arrived up to each demand point "
            f"(mean over {len(lp)} seeds; sim/lp_bound.py).</p><table><tr>{head}</tr><tr>{cells}</tr></table>"
        )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>finesched sim fill</title>{_STYLE}</head><body>"
        f"<h1>Fill protocol: allocation rate by arrived GPU demand</h1>{_meta_html(meta)}"
        f"<h2>Mean over seeds</h2>{table}{lp_html}<h2>Plots</h2>{''.join(_img(p) for p in images)}"
        "<p>Trace: Alibaba cluster-trace-gpu-v2023 (Weng et al., USENIX ATC 2023, FGD).</p></body></html>\n"
    )


# Replay ---------------------------------------------------------------------------------------------------
def replay_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in records):
        rows = [r for r in records if r["policy"] == policy]
        out[policy] = {
            "seeds": len(rows),
            "alloc_mean": round(float(np.mean([r["alloc_mean"] for r in rows])), 4),
            "alloc_peak": round(float(np.mean([r["alloc_peak"] for r in rows])), 4),
            "delay_mean_s": round(float(np.mean([r["delay_s"]["mean"] for r in rows])), 3),
            "delay_p95_s": round(float(np.mean([r["delay_s"]["p95"] for r in rows])), 3),
            "delay_max_s": round(float(np.mean([r["delay_s"]["max"] for r in rows])), 3),
            "waited": round(float(np.mean([r.get("waited", 0) for r in rows])), 1),
            "queue_peak": round(float(np.mean([r["queue_peak"] for r in rows])), 1),
            "unplaced": round(float(np.mean([r["unplaced"] for r in rows])), 1),
        }
        if all("evictions" in r for r in rows):  # runs with a priority mix
            out[policy]["evictions"] = round(float(np.mean([r["evictions"] for r in rows])), 1)
    return out


def write_replay(out: Path, runs: Sequence[Result], meta: Mapping[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    records = [r["record"] for r in runs]
    summary = replay_summary(records)
    paths = [out / "results.csv", out / "results.json", out / "utilization.png", out / "delay.png", out / "report.html"]
    keys = ["policy", "seed", "time_scale", "alloc_mean", "alloc_peak", "queue_peak", "placed", "waited", "unplaced"]
    keys.append("wall_s")
    with paths[0].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*keys, "delay_mean_s", "delay_p50_s", "delay_p95_s", "delay_max_s"])
        for r in records:
            d = r["delay_s"]
            writer.writerow([r[k] for k in keys] + [d["mean"], d["p50"], d["p95"], d["max"]])
    payload = {"meta": dict(meta), "summary": summary, "results": records}
    paths[1].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for policy, group in _by_policy(runs).items():
        first = group[0]["series"]
        (line,) = axes[0].plot(first["t"], first["alloc"], label=f"{policy} (seed {group[0]['record']['seed']})")
        axes[1].plot(first["t"], first["queued"], color=line.get_color())
    axes[0].set_ylabel("GPU allocation (%)")
    axes[1].set_ylabel("pods waiting")
    axes[1].set_xlabel("trace time (s, after time scaling)")
    axes[0].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, group in _by_policy(runs).items():
        delays = np.sort(np.concatenate([np.asarray(g["delays"], dtype=float) for g in group]))
        if delays.size:
            ax.plot(delays, np.arange(1, delays.size + 1) / delays.size, label=policy)
    ax.set_xscale("symlog")
    ax.set_xlabel("queueing delay (s)")
    ax.set_ylabel("fraction of placed pods")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[3], dpi=110)
    plt.close(fig)
    rows = "".join(
        f"<tr><th>{html.escape(p)}</th>" + "".join(f"<td>{v}</td>" for v in s.values()) + "</tr>"
        for p, s in summary.items()
    )
    first = next(iter(summary.values()), {})
    head = "".join(f"<th>{html.escape(k)}</th>" for k in first)
    paths[4].write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>finesched sim replay</title>{_STYLE}</head><body>"
        f"<h1>Replay: utilization and queueing delay</h1>{_meta_html(meta)}"
        f"<table><tr><th>policy</th>{head}</tr>{rows}</table>{_img(paths[2])}{_img(paths[3])}</body></html>\n",
        encoding="utf-8",
    )
    return paths
