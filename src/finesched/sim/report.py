"""Write experiment results: CSV, JSON, PNG plots and a self-contained HTML report.

Fill plots: allocation rate and fragmentation amount against arrived demand, one line per policy
(the median over seeds) with a band from the 25th to the 75th percentile of the seeds (the FGD
reference's median and 50 % band), full range and a zoom on 88-130 %. Replay plots: GPU allocation
and queue length over time, and the queueing-delay CDF; with the defragmenter (`sim replay
--defragment`) each policy's run with it is a dashed line beside the one without, and a table puts
their waiting and moves side by side. The HTML embeds the PNGs (base64), so the
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
        entry["failed_reasons"] = mean_reasons(rows, "failed_reasons")
        entry["wall_s_mean"] = round(float(np.mean([r["wall_s"] for r in rows])), 3)
        if policy in published:
            entry["published_130"] = published[policy]
        out[policy] = entry
    return out


def mean_reasons(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    """Per reason, the mean over the rows (seeds) of how many pods it held back, most first: why pods
    failed, as the scheduler counts reasons (a pod under each of its reasons; rows without `key`: none)."""
    totals: dict[str, int] = {}
    for row in rows:
        for reason, count in (row.get(key) or {}).items():
            totals[reason] = totals.get(reason, 0) + int(count)
    means = {reason: round(total / max(len(rows), 1), 1) for reason, total in totals.items()}
    return dict(sorted(means.items(), key=lambda kv: (-kv[1], kv[0])))


def json_view(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `-o json` shape: results rows (with why pods failed) and {policy: {mean_130, std_130}}."""
    keys = ("policy", "seed", "alloc", "unallocated_130", "frag_amount", "failed", "failed_reasons", "wall_s")
    extra = ("evictions", "evicted_by_priority", "alloc_by_priority")  # runs with a priority mix only
    summary = fill_summary(records)
    return {
        "results": [{k: r.get(k, {}) for k in (*keys, *(e for e in extra if e in r))} for r in records],
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


def _by_label(runs: Sequence[Result]) -> dict[str, list[Result]]:
    """Replay runs by `replay_label` (a policy with and without the defragmenter apart)."""
    out: dict[str, list[Result]] = {}
    for run in runs:
        out.setdefault(replay_label(run["record"]), []).append(run)
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
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
    "td.reason{text-align:left}</style>"
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
    why = reasons_html(summary, "failed_reasons", "Why pods failed: pods held back by each reason (mean over seeds)")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>finesched sim fill</title>{_STYLE}</head><body>"
        f"<h1>Fill protocol: allocation rate by arrived GPU demand</h1>{_meta_html(meta)}"
        f"<h2>Mean over seeds</h2>{table}{why}{lp_html}<h2>Plots</h2>{''.join(_img(p) for p in images)}"
        "<p>Trace: Alibaba cluster-trace-gpu-v2023 (Weng et al., USENIX ATC 2023, FGD).</p></body></html>\n"
    )


# Replay ---------------------------------------------------------------------------------------------------
def replay_label(record: Mapping[str, Any]) -> str:
    """A replay run's name in tables and plots: its policy, `+defrag` with the defragmenter on."""
    return f"{record['policy']} +defrag" if record.get("defragmentation") is not None else str(record["policy"])


def _mean(rows: Sequence[Mapping[str, Any]], get: Any, digits: int = 3) -> float:
    return round(float(np.mean([get(r) for r in rows])), digits)


def replay_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per run name (`replay_label`): means over seeds. Runs with the defragmenter add its moves."""
    out: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(replay_label(r) for r in records):
        rows = [r for r in records if replay_label(r) == label]
        out[label] = {
            "seeds": len(rows),
            "alloc_mean": round(float(np.mean([r["alloc_mean"] for r in rows])), 4),
            "alloc_peak": round(float(np.mean([r["alloc_peak"] for r in rows])), 4),
            "delay_mean_s": round(float(np.mean([r["delay_s"]["mean"] for r in rows])), 3),
            "delay_p95_s": round(float(np.mean([r["delay_s"]["p95"] for r in rows])), 3),
            "delay_max_s": round(float(np.mean([r["delay_s"]["max"] for r in rows])), 3),
            "waited": round(float(np.mean([r.get("waited", 0) for r in rows])), 1),
            "queue_peak": round(float(np.mean([r["queue_peak"] for r in rows])), 1),
            "unplaced": round(float(np.mean([r["unplaced"] for r in rows])), 1),
            "unplaced_reasons": mean_reasons(rows, "unplaced_reasons"),
        }
        if all("evictions" in r for r in rows):  # runs with a priority mix
            out[label]["evictions"] = round(float(np.mean([r["evictions"] for r in rows])), 1)
        if all("whole_gpu" in r for r in rows):
            out[label].update(
                waited_gpu_s=_mean(rows, lambda r: r["waited_gpu_s"]),
                whole_waited=_mean(rows, lambda r: r["whole_gpu"]["waited"], 1),
                whole_delay_mean_s=_mean(rows, lambda r: r["whole_gpu"]["delay_mean_s"]),
                whole_delay_p99_s=_mean(rows, lambda r: r["whole_gpu"]["delay_p99_s"]),
            )
        if all("moves" in r for r in rows):  # runs with the defragmenter
            out[label].update(
                moves=_mean(rows, lambda r: r["moves"]["moves"], 1),
                moves_pct=_mean(rows, lambda r: r["moves"]["moves_pct_of_pods"], 4),
                moved_pods=_mean(rows, lambda r: r["moves"]["moved_pods"], 1),
                restarted_gpu_s=_mean(rows, lambda r: r["moves"]["restarted_gpu_s"]),
            )
    return out


#: `defrag_rows`' figures of a run with the defragmenter off (it moves nothing).
_NO_MOVES = {"moves": 0.0, "moves_pct": 0.0, "moved_pods": 0.0, "restarted_gpu_s": 0.0}


def defrag_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`sim replay --defragment`'s comparison: per policy its run without the defragmenter, then with
    it (means over seeds): allocation, pods that waited and their GPU-seconds of waiting, the waiting
    time of whole-GPU pods, pods never placed, and the moves with the work they restarted."""
    summary = replay_summary(records)
    rows = []
    for policy in dict.fromkeys(str(r["policy"]) for r in records):
        for label, on in ((policy, "off"), (f"{policy} +defrag", "on")):
            if label in summary:
                rows.append({"policy": policy, "defrag": on, **_NO_MOVES, **summary[label]})
    return rows


def planner_answers(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per policy with the defragmenter: what the planner answered (summed over seeds), most first."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        for why, count in (r.get("moves") or {}).get("planner_answers", {}).items():
            mine = out.setdefault(replay_label(r), {})
            mine[why] = mine.get(why, 0) + int(count)
    return {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in out.items()}


_DEFRAG_HEAD = (
    ("alloc_mean", "GPU alloc mean %", 2), ("waited", "pods waited", 0), ("waited_gpu_s", "their GPU·s waiting", 1),
    ("whole_delay_mean_s", "whole-GPU wait mean s", 3), ("whole_delay_p99_s", "whole-GPU wait p99 s", 2),
    ("unplaced", "never placed", 0), ("moves", "moves", 0), ("moves_pct", "moves % of pods", 2),
    ("moved_pods", "pods moved", 0), ("restarted_gpu_s", "GPU·s of work restarted", 0),
)  # fmt: skip


def _defrag_html(records: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table and the planner's answers (empty without defragmenter runs)."""
    rows = defrag_rows(records)
    if not any(r["defrag"] == "on" for r in rows):
        return ""
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in _DEFRAG_HEAD)
    body = "".join(
        f"<tr><th>{html.escape(r['policy'])}</th><td>{r['defrag']}</td>"
        + "".join(f"<td>{r[key]:.{digits}f}</td>" for key, _, digits in _DEFRAG_HEAD)
        + "</tr>"
        for r in rows
    )
    answers = "".join(
        f"<tr><th>{html.escape(label)}</th><td class='reason'>{html.escape(why)}</td><td>{n}</td></tr>"
        for label, whys in planner_answers(records).items()
        for why, n in whys.items()
    )
    return (
        "<h2>Without and with the defragmenter</h2><p>Every pod is movable: the trace has no opt-in "
        "(<code>spec.migration</code>). A moved pod restarts on its target and runs its whole duration again. "
        "Means over seeds; waiting counts every pod placed after a wait, its GPU·s are GPUs × wait.</p>"
        f"<table><tr><th>policy</th><th>defrag</th>{head}</tr>{body}</table>"
        "<h2>What the planner answered</h2><p>Each time a pod fit nowhere (names and numbers blanked).</p>"
        f"<table><tr><th>run</th><th>answer</th><th>times</th></tr>{answers}</table>"
    )


def reasons_html(summary: Mapping[str, Mapping[str, Any]], key: str, title: str) -> str:
    """An HTML table of policy, reason and pods (empty when no pod of any policy failed)."""
    rows = "".join(
        f"<tr><th>{html.escape(policy)}</th><td class='reason'>{html.escape(reason)}</td><td>{count:g}</td></tr>"
        for policy, s in summary.items()
        for reason, count in (s.get(key) or {}).items()
    )
    if not rows:
        return ""
    return f"<h2>{html.escape(title)}</h2><table><tr><th>policy</th><th>reason</th><th>pods</th></tr>{rows}</table>"


#: The replay CSV's last columns: the defragmenter on/off, waiting GPU-seconds, moves, work restarted.
_CSV_DEFRAG = ("defrag", "waited_gpu_s", "moves", "restarted_gpu_s")


def _queue_window(runs: Sequence[Result]) -> tuple[float, float] | None:
    """The trace-time span in which any run had pods waiting (with a margin); None: nobody waited."""
    spans = [
        (t[q > 0].min(), t[q > 0].max())
        for t, q in ((np.asarray(r["series"]["t"], dtype=float), np.asarray(r["series"]["queued"])) for r in runs)
        if (q > 0).any()
    ]
    if not spans:
        return None
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    margin = max(0.1 * (hi - lo), 1.0)
    return lo - margin, hi + margin


def _over_time_plot(path: Path, runs: Sequence[Result]) -> None:
    """GPU allocation and pods waiting over trace time, one line per run (dashed: with the
    defragmenter, in its policy's colour); with queues, a right-hand zoom on when pods waited."""
    window = _queue_window(runs)
    fig, grid = plt.subplots(2, 2 if window else 1, figsize=(14 if window else 11, 6), sharex="col", squeeze=False)
    colors: dict[str, Any] = {}
    for label, group in _by_label(runs).items():
        first, record = group[0]["series"], group[0]["record"]
        style: dict[str, Any] = {"linestyle": "--" if record.get("defragmentation") is not None else "-"}
        if record["policy"] in colors:
            style["color"] = colors[record["policy"]]
        for column in range(grid.shape[1]):
            (line,) = grid[0, column].plot(
                first["t"], first["alloc"], label=f"{label} (seed {record['seed']})", **style
            )
            style["color"] = line.get_color()
            grid[1, column].plot(first["t"], first["queued"], **style)
        colors.setdefault(record["policy"], style["color"])
    if window:
        grid[1, 1].set_xlim(*window)
        grid[0, 1].set_title("zoom: while pods waited", fontsize=9)
    for column in range(grid.shape[1]):
        grid[0, column].set_ylabel("GPU allocation (%)")
        grid[1, column].set_ylabel("pods waiting")
        grid[1, column].set_xlabel("trace time (s, after time scaling)")
    grid[0, 0].legend(fontsize=8)
    for ax in grid.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_replay(out: Path, runs: Sequence[Result], meta: Mapping[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    records = [r["record"] for r in runs]
    summary = replay_summary(records)
    paths = [out / "results.csv", out / "results.json", out / "utilization.png", out / "delay.png", out / "report.html"]
    keys = ["policy", "seed", "time_scale", "alloc_mean", "alloc_peak", "queue_peak", "placed", "waited", "unplaced"]
    keys.append("wall_s")
    with paths[0].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*keys, "delay_mean_s", "delay_p50_s", "delay_p95_s", "delay_max_s", *_CSV_DEFRAG])
        for r in records:
            d, moves = r["delay_s"], r.get("moves") or {}
            writer.writerow(
                [r[k] for k in keys]
                + [d["mean"], d["p50"], d["p95"], d["max"]]
                + ["on" if r.get("defragmentation") is not None else "off", r.get("waited_gpu_s", "")]
                + [moves.get("moves", 0), moves.get("restarted_gpu_s", 0)]
            )
    payload = {"meta": dict(meta), "summary": summary, "results": records}
    paths[1].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    _over_time_plot(paths[2], runs)
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, group in _by_label(runs).items():
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
        f"<tr><th>{html.escape(p)}</th>"
        + "".join(f"<td>{v}</td>" for k, v in s.items() if k != "unplaced_reasons")
        + "</tr>"
        for p, s in summary.items()
    )
    first = next(iter(summary.values()), {})
    head = "".join(f"<th>{html.escape(k)}</th>" for k in first if k != "unplaced_reasons")
    why = reasons_html(summary, "unplaced_reasons", "Why pods were never placed: pods per reason (mean over seeds)")
    paths[4].write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>finesched sim replay</title>{_STYLE}</head><body>"
        f"<h1>Replay: utilization and queueing delay</h1>{_meta_html(meta)}"
        f"<table><tr><th>policy</th>{head}</tr>{rows}</table>{_defrag_html(records)}{why}"
        f"{_img(paths[2])}{_img(paths[3])}</body></html>\n",
        encoding="utf-8",
    )
    return paths
