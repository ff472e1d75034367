"""`finesched sim`: replay the Alibaba GPU trace (v2023) through the scheduler core.

* ``sim fill``: the FGD paper's protocol (shuffle, inflate to ``--inflation`` x capacity, place one
  pod at a time, never depart) for each policy and seed; prints the allocation rate at 90-130 %
  arrived demand (table or ``-o json``) and with ``--out DIR`` writes CSV, JSON, PNG plots and an
  HTML report. With ``--mig SHARE`` it compares software sharing, static MIG and dynamic MIG on a
  cluster where that share of the GPU nodes are MIG nodes (sim/mig.py).
* ``sim replay``: pods arrive and leave by their trace timestamps (``--time-scale`` compresses
  arrivals), waiting in the scheduler's DRF queue; reports utilization and queueing delay. Like
  ``fill``, ``--priorities`` gives pods seeded priority classes and ``--preemption`` lets a waiting
  pod evict lower-priority running ones (the victims queue again); evictions per class are reported.
  ``--defragment`` runs each policy without and with the defragmenter (every pod movable) and
  reports them side by side: waiting, moves and the work the moves restarted.
* ``sim topology``: gangs of 2-64 GPUs in a cluster cut into racks and blocks, beside the trace's
  pods, placed topology-unaware, by BestFit and by KeepDomainsWhole (sim/topology.py).

Errors are one line on stderr: exit 1 for unusable input files or ``--out`` directory, 2 for bad
options. Inputs and the ``--out`` directory are checked before the first run starts.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from finesched.commands.common import fail
from finesched.commands.tables import Columns, col, print_table, simple_table
from finesched.sim import metrics
from finesched.sim.policies import BASELINES, BEST, POLICIES, resolve_policy
from finesched.sim.trace import TraceError

_DATA = Path("data") / "alibaba-gpu-v2023"
_REPO_DATA = Path(__file__).resolve().parents[3] / _DATA
DATA_DIR = _REPO_DATA if _REPO_DATA.is_dir() else _DATA
DEFAULT_NODES = DATA_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv"
OUTPUTS = ("table", "wide", "json")

sim_app = typer.Typer(
    name="sim",
    help="Replay the Alibaba GPU trace (v2023) under the FGD protocol; compare placement policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
#: `fill` and `replay` alike: a pod that fits nowhere may evict lower-priority ones, and seeded priority classes.
PreemptionFlag = Annotated[
    bool, typer.Option("--preemption", help="A pod that fits nowhere may evict lower-priority running pods.")
]
PriorityMix = Annotated[
    str, typer.Option("--priorities", help="Priority mix: weights of classes 0,1,... (e.g. 60,30,10).")
]
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class _Fail(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def parse_policies(text: str) -> list[str]:
    """``FGD,BestFit``, ``best`` (ours), ``baselines`` (the paper's six) or ``all``; ValueError when unknown."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.lower() == "all":
            names += [*BASELINES, BEST]
        elif part.lower() == "baselines":
            names += list(BASELINES)
        else:
            names.append(resolve_policy(part))
    if not names:
        raise ValueError(f"no policy given; valid: {', '.join(POLICIES)}, best, baselines, all")
    return list(dict.fromkeys(names))


def _check_file(path: Path, what: str) -> str:
    if not path.is_file():
        raise _Fail(f"{what} file not found: {path}", 1)
    return str(path)


def _runs_wanted(output: str, jobs: int, policy: str, seeds: str) -> tuple[list[str], list[int]]:
    """The options `fill` and `replay` share, checked: the policies and seeds to run (usage errors exit 2)."""
    if output not in OUTPUTS:
        raise _Fail(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}", 2)
    if jobs < 1:
        raise _Fail(f"--jobs must be >= 1, got {jobs}", 2)
    try:
        return parse_policies(policy), _seeds(seeds)
    except ValueError as exc:
        raise _Fail(str(exc), 2) from None


def _preflight(nodes: Path, pods: Path, need_times: bool = False) -> tuple[str, str]:
    """Load both files once in this process so a bad CSV fails here, with its line, before any worker runs."""
    from finesched.sim.runner import _nodes, _pods

    node_path, pod_path = _check_file(nodes, "--nodes"), _check_file(pods, "--pods")
    try:
        _nodes(node_path)
        table = _pods(pod_path)
    except TraceError as exc:
        raise _Fail(str(exc), 1) from None
    if need_times and not table.has_times:
        raise _Fail(f"{pods} has no creation/deletion times, which replay needs", 1)
    return node_path, pod_path


def _prepare_out(out_dir: Path | None) -> None:
    """Create ``--out`` and prove it takes files now, before any run: the report is written only after
    every run has finished, so an unusable directory found then would throw all the results away."""
    if out_dir is None:
        return
    if out_dir.exists() and not out_dir.is_dir():
        raise _Fail(f"--out {out_dir}: exists and is not a directory", 1)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise _Fail(f"--out {out_dir}: cannot write there: {exc.strerror or exc}", 1) from None


def _run_with_progress(specs: list[Any], jobs: int, label: str) -> list[dict[str, Any]]:
    from finesched.sim.runner import run_all

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.1f}/{task.total:.0f} runs"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    progress = Progress(*columns, console=err, transient=True, disable=not err.is_terminal)
    task = progress.add_task(label, total=len(specs))
    try:  # the bar's refresh thread starts only after the worker processes are forked
        return run_all(specs, jobs, lambda done: progress.update(task, completed=done), progress.start)
    finally:
        progress.stop()


def _meta(command: str, nodes: str, pods: str, **extra: Any) -> dict[str, Any]:
    return {
        "command": command,
        "nodes": nodes,
        "pods": pods,
        **extra,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


@sim_app.command()
def fill(
    nodes: Annotated[Path, typer.Option("--nodes", help="Node list CSV.")] = DEFAULT_NODES,
    pods: Annotated[Path, typer.Option("--pods", help="Pod list CSV.")] = DEFAULT_PODS,
    policy: Annotated[
        str, typer.Option("--policy", help=f"NAME[,NAME...]: {', '.join(POLICIES)}, best, baselines, all.")
    ] = "FGD",
    inflation: Annotated[float, typer.Option("--inflation", help="Arrivals up to this x GPU capacity.")] = 1.3,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: N, N-M or a comma list.")] = "42-51",
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel worker processes.")] = 1,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write CSV, JSON, PNG and HTML here.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide or json.")] = "table",
    lp: Annotated[
        bool | None, typer.Option("--lp-bound/--no-lp-bound", help="Compute the LP upper bound (default: with --out).")
    ] = None,
    preemption: PreemptionFlag = False,
    priorities: PriorityMix = "",
    mig: Annotated[
        float | None,
        typer.Option("--mig", help="Share (0-1] of GPU nodes in MIG mode: compare share, static and dynamic MIG."),
    ] = None,
    mig_product: Annotated[str, typer.Option("--mig-product", help="MIG product of those nodes.")] = "A100-80GB",
    gpu_partitions: Annotated[
        str,
        typer.Option("--gpu-partitions", help="Honor or Prefer: GPU nodes get a partition table of aligned blocks."),
    ] = "",
) -> None:
    """Fill protocol of the FGD paper: allocation rate at 90-130 % arrived GPU demand, per policy and seed."""
    if mig is not None:
        _mig_fill(nodes, pods, policy, inflation, seeds, jobs, output, out_dir, mig, mig_product)
        return
    try:
        mix = _fill_options(inflation, priorities, gpu_partitions)
        names, seed_list = _runs_wanted(output, jobs, policy, seeds)
        node_path, pod_path = _preflight(nodes, pods)
        _prepare_out(out_dir)
        from finesched.sim.runner import RunSpec, bounds

        specs = [
            RunSpec(
                "fill",
                node_path,
                pod_path,
                p,
                s,
                inflation,
                preemption=preemption,
                priorities=mix,
                gpu_partitions=gpu_partitions,
            )
            for p in names
            for s in seed_list
        ]
        started = time.perf_counter()
        runs = _run_with_progress(specs, jobs, "sim fill")
        wall = time.perf_counter() - started
        want_lp = lp if lp is not None else out_dir is not None
        bound = bounds(node_path, pod_path, seed_list, inflation) if want_lp else None
        records = [r["record"] for r in runs]
        if out_dir is not None:
            _write_fill_report(out_dir, runs, node_path, pod_path, bound, inflation=inflation, jobs=jobs, wall=wall)
    except _Fail as exc:
        raise fail(str(exc), exc.code) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc}", 1) from None
    _print_fill(records, bound, output, lp=lp, wall=wall, jobs=jobs, mix=bool(mix))


def _fill_options(inflation: float, priorities: str, gpu_partitions: str) -> tuple[float, ...]:
    """`sim fill`'s --inflation and --gpu-partitions checked, and its priority mix (raises _Fail, exit 2)."""
    if not 0 < inflation <= 10:
        raise _Fail(f"--inflation must be in (0, 10], got {inflation}", 2)
    mix = _priority_mix(priorities)
    if gpu_partitions not in ("", "Honor", "Prefer"):
        raise _Fail(f"--gpu-partitions must be Honor or Prefer, got {gpu_partitions!r}", 2)
    return mix


def _write_fill_report(
    out_dir: Path, runs: list[Any], node_path: str, pod_path: str, bound: Any, *, inflation: float, jobs: int,
    wall: float,
) -> None:  # fmt: skip
    """`sim fill --out DIR`: the CSV, JSON, plots and HTML report, with how they were made."""
    from finesched.sim.report import write_fill

    meta = _meta(
        "finesched sim " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["sim"] else "finesched sim fill",
        node_path,
        pod_path,
        inflation=inflation,
        jobs=jobs,
        wall_s=round(wall, 1),
    )
    written = write_fill(out_dir, runs, meta, bound)
    err.print(f"wrote {', '.join(str(p) for p in written)}", soft_wrap=True)


def _print_fill(
    records: list[Any], bound: Any, output: str, *, lp: bool | None, wall: float, jobs: int, mix: bool
) -> None:
    """`sim fill`'s answer on stdout: JSON (`-o json`), else the allocation table, why pods failed, and
    the per-class table when pods had priorities."""
    if output == "json":
        from finesched.sim.report import json_view

        payload = json_view(records)
        if lp and bound is not None:  # only when asked for: the default shape is exactly results + summary
            payload["lp_bound"] = bound
        out.print_json(json.dumps(payload))
        return
    _fill_table(records, bound, wall, jobs, wide=output == "wide")
    _reasons_table(records, "failed_reasons", "Why pods failed: pods held back by each reason (mean over seeds)")
    if mix:
        _priority_table(records)


def _mig_fill(
    nodes: Path, pods: Path, policy: str, inflation: float, seeds: str, jobs: int, output: str,
    out_dir: Path | None, share: float, product: str,
) -> None:  # fmt: skip
    """`sim fill --mig`: the three-way table (sim/mig.py), per policy, mean over seeds."""
    from finesched.model.mig import PRODUCTS
    from finesched.sim.mig import MODES, summarize

    try:
        if not 0 < share <= 1:
            raise _Fail(f"--mig must be in (0, 1], got {share}", 2)
        if product not in PRODUCTS:
            raise _Fail(f"--mig-product must be one of {', '.join(PRODUCTS)}, got {product!r}", 2)
        if not 0 < inflation <= 10:
            raise _Fail(f"--inflation must be in (0, 10], got {inflation}", 2)
        names, seed_list = _runs_wanted(output, jobs, policy, seeds)
        node_path, pod_path = _preflight(nodes, pods)
        _prepare_out(out_dir)
        from finesched.sim.runner import RunSpec

        specs = [
            RunSpec("mig", node_path, pod_path, p, s, inflation, mig_share=share, mig_product=product, mig_mode=m)
            for p in names
            for s in seed_list
            for m in MODES
        ]
        started = time.perf_counter()
        records = [r["record"] for r in _run_with_progress(specs, jobs, "sim fill --mig")]
        wall = time.perf_counter() - started
        summary = {p: summarize([r for r in records if r["policy"] == p]) for p in names}
        meta = _meta(
            "finesched sim fill --mig", node_path, pod_path, share=share, product=product, wall_s=round(wall, 1)
        )
        payload = {"results": records, "summary": summary, "meta": meta}
        if out_dir is not None:
            (out_dir / "mig.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
            err.print(f"wrote {out_dir / 'mig.json'}", soft_wrap=True)
    except _Fail as exc:
        raise fail(str(exc), exc.code) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc}", 1) from None
    if output == "json":
        out.print_json(json.dumps({"results": records, "summary": summary}))
        return
    title = (
        f"{share:.0%} of GPU nodes as {product} MIG nodes: GPU allocation, held and fragmentation (% of capacity), "
        f"mean over {len(seed_list)} seed(s) ({wall:.1f} s, {jobs} job(s))"
    )
    table = Table(title=title)
    for column in ("policy", "mode", "alloc @100", f"alloc @{inflation * 100:.0f}", "held", "frag", "failed",
                   "on MIG nodes"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("policy", "mode") else "right")
    for p, modes in summary.items():
        for mode, s in modes.items():
            table.add_row(
                p, mode, f"{s['alloc_100']:.2f}", f"{s['alloc_end']:.2f}", f"{s['held_end']:.2f}",
                f"{s['frag_end']:.2f}", f"{s['failed']:.0f}", f"{s['on_mig']:.0f}",
            )  # fmt: skip
    print_table(out, table)


def _priority_mix(text: str) -> tuple[float, ...]:
    """``60,30,10`` -> weights of priority classes 0, 1, 2 (empty: no priorities)."""
    if not text.strip():
        return ()
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise _Fail(f"--priorities: {text!r} is not a comma list of weights (e.g. 60,30,10)", 2) from None
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise _Fail(f"--priorities: weights must be >= 0 with a positive sum, got {text!r}", 2)
    return weights


def _reasons_table(records: list[dict[str, Any]], key: str, title: str) -> None:
    """Why pods failed (or were never placed), per policy: each reason and the mean pods it kept out."""
    from finesched.sim.report import mean_reasons

    rows = [
        (policy, reason, f"{count:g}")
        for policy in dict.fromkeys(r["policy"] for r in records)
        for reason, count in mean_reasons([r for r in records if r["policy"] == policy], key).items()
    ]
    if rows:
        out.print(simple_table(title, [col("policy"), col("reason"), col("pods", right=True)], rows))


def _priority_table(records: list[dict[str, Any]]) -> None:
    """Evictions and final GPU allocation per priority class, mean over seeds, per policy."""
    table = Table(title="Preemption by priority class: evictions (victims' class) and final GPU allocation %")
    for column in ("policy", "evictions", "evicted by class", "alloc % by class"):
        table.add_column(column)
    for policy in dict.fromkeys(r["policy"] for r in records):
        rows = [r for r in records if r["policy"] == policy]
        classes = sorted({k for r in rows for k in r["alloc_by_priority"]}, key=int)
        evicted = " / ".join(f"{fmean([r['evicted_by_priority'].get(k, 0) for r in rows]):.0f}" for k in classes)
        alloc = " / ".join(f"{fmean([r['alloc_by_priority'][k] for r in rows]):.2f}" for k in classes)
        table.add_row(policy, f"{fmean([r['evictions'] for r in rows]):.0f}", evicted, alloc)
    out.print(table)


def _seeds(text: str) -> list[int]:
    from finesched.sim.runner import parse_seeds

    return parse_seeds(text)


def _fill_table(
    records: list[dict[str, Any]], bound: dict[str, dict[str, float]] | None, wall: float, jobs: int, *, wide: bool
) -> None:
    """The allocation table: in 80 columns the rate at 100 % and 130 % arrived, and at 130 % the spread,
    the published mean, the fragmentation ratio and failed pods; `-o wide` adds every report point,
    unallocated, fragmentation amount and wall time."""
    from finesched.sim.report import fill_summary

    summary = fill_summary(records)
    points = metrics.REPORT_POINTS
    extra = ("± std", "paper", "unalloc", "frag", "frag ratio", "failed", "wall s")
    narrow = {"@100", "@130", "± std", "paper", "frag ratio", "failed"}
    columns = Columns(
        col("policy", keep=True), col("seeds", right=True),
        *(col(c, right=True, wide=c not in narrow) for c in (*(f"@{p}" for p in points), *extra)),
    )  # fmt: skip
    title = (
        f"GPU allocation rate (%) by arrived demand, mean over seeds ({wall:.1f} s); the columns after @130 "
        "are at 130 % (paper: the published mean)"
    )
    table = columns.table(title, wide=wide)
    for policy, s in summary.items():
        published = s.get("published_130")
        columns.add_row(
            table,
            policy,
            str(s["seeds"]),
            *(f"{s[f'mean_{p}']:.2f}" for p in points),
            f"{s['std_130']:.2f}",
            "" if published is None else f"{published:.2f}",
            f"{100 - s['mean_130']:.2f}",
            f"{s['frag_amount_130']:.2f}",
            f"{s['frag_ratio_130']:.2f}",
            f"{s['failed_mean']:.0f}",
            f"{s['wall_s_mean']:.1f}",
            wide=wide,
        )
    if bound:
        values = [[v[str(p)] for v in bound.values() if str(p) in v] for p in points]
        cells = [f"{sum(v) / len(v):.2f}" if v else "" for v in values]
        columns.add_row(table, "LP bound", str(len(bound)), *cells, *[""] * 7, style="dim", wide=wide)
    print_table(out, table, wide=wide)


@sim_app.command()
def replay(
    nodes: Annotated[Path, typer.Option("--nodes", help="Node list CSV.")] = DEFAULT_NODES,
    pods: Annotated[Path, typer.Option("--pods", help="Pod list CSV (with creation/deletion times).")] = DEFAULT_PODS,
    policy: Annotated[str, typer.Option("--policy", help=f"NAME[,NAME...]: {', '.join(POLICIES)}, best.")] = "FGD",
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Divide arrival times by this (> 1 raises the load).")
    ] = 1.0,
    seeds: Annotated[str, typer.Option("--seeds", help="Tie-break seeds: N, N-M or a comma list.")] = "42",
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel worker processes.")] = 1,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write CSV, JSON, PNG and HTML here.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide or json.")] = "table",
    preemption: PreemptionFlag = False,
    priorities: PriorityMix = "",
    defragment: Annotated[
        bool,
        typer.Option(
            "--defragment", help="Run each policy without and with the defragmenter (every pod movable); side by side."
        ),
    ] = False,
    max_moves_per_plan: Annotated[
        int | None, typer.Option("--max-moves-per-plan", help="With --defragment: moves one waiting pod may cost (4).")
    ] = None,
    max_moves_per_minute: Annotated[
        int | None, typer.Option("--max-moves-per-minute", help="With --defragment: moves per trace minute (20).")
    ] = None,
    max_moves_per_tenant_per_minute: Annotated[
        int | None,
        typer.Option(
            "--max-moves-per-tenant-per-minute", help="With --defragment: a tenant's moves per trace minute (10)."
        ),
    ] = None,
    cooldown: Annotated[
        float | None,
        typer.Option("--cooldown", help="With --defragment: trace seconds before a pod moves again (600)."),
    ] = None,
    candidate_nodes: Annotated[
        int | None,
        typer.Option("--candidate-nodes", help="With --defragment: nodes tried as a waiting pod's target (16)."),
    ] = None,
) -> None:
    """Replay pods by their timestamps (arrive, run, leave; waiting pods queue with DRF by QoS class)."""
    try:
        if time_scale <= 0:
            raise _Fail(f"--time-scale must be > 0, got {time_scale}", 2)
        given = {
            "--max-moves-per-plan": max_moves_per_plan,
            "--max-moves-per-minute": max_moves_per_minute,
            "--max-moves-per-tenant-per-minute": max_moves_per_tenant_per_minute,
            "--cooldown": cooldown,
            "--candidate-nodes": candidate_nodes,
        }
        defrag = _defragmentation(defragment, {k: v for k, v in given.items() if v is not None})
        mix = _priority_mix(priorities)
        names, seed_list = _runs_wanted(output, jobs, policy, seeds)
        node_path, pod_path = _preflight(nodes, pods, need_times=True)
        _prepare_out(out_dir)
        from finesched.sim.runner import RunSpec

        specs = [
            RunSpec(
                "replay",
                node_path,
                pod_path,
                p,
                s,
                time_scale=time_scale,
                preemption=preemption,
                priorities=mix,
                defragmentation=d,
            )
            for p in names
            for d in ([None, defrag] if defrag is not None else [None])
            for s in seed_list
        ]
        started = time.perf_counter()
        runs = _run_with_progress(specs, jobs, "sim replay")
        wall = time.perf_counter() - started
        records = [r["record"] for r in runs]
        if out_dir is not None:
            meta = _meta("finesched sim replay", node_path, pod_path, time_scale=time_scale, preemption=preemption,
                         priorities=list(mix), wall_s=round(wall, 1))  # fmt: skip
            if defrag is not None:
                meta["defragmentation"] = (
                    f"{dict(defrag) or 'profile defaults'}; every pod movable (no opt-in in the trace)"
                )
            _write_replay_report(out_dir, runs, meta)
    except _Fail as exc:
        raise fail(str(exc), exc.code) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc}", 1) from None
    _print_replay(records, output, time_scale=time_scale, wall=wall, mix=bool(mix))
    if defrag is not None and output != "json":
        _defrag_table(records, wide=output == "wide")


#: `--max-moves-per-plan` etc.: the profile's `defragmentation` field each option sets.
_DEFRAG_FIELDS = {
    "--max-moves-per-plan": "maxMovesPerPlan",
    "--max-moves-per-minute": "maxMovesPerMinute",
    "--max-moves-per-tenant-per-minute": "maxMovesPerTenantPerMinute",
    "--cooldown": "cooldownSeconds",
    "--candidate-nodes": "candidateNodes",
}


def _defragmentation(on: bool, given: dict[str, float]) -> tuple[tuple[str, float], ...] | None:
    """`--defragment`'s settings, checked against the profile's rules (sched/profile.py); None when off.
    Errors name the option, its value and the allowed range (exit 2)."""
    from pydantic import ValidationError

    from finesched.sched.profile import Defragmentation

    if not on:
        if given:
            raise _Fail(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --defragment", 2)
        return None
    settings = {_DEFRAG_FIELDS[option]: value for option, value in given.items()}
    try:
        Defragmentation.model_validate(settings)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        option = next((o for o, f in _DEFRAG_FIELDS.items() if field in (f, _snake(f))), field)
        raise _Fail(f"{option}: {error['msg'].lower()}, got {given.get(option)!r}", 2) from None
    return tuple(settings.items())


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _defrag_table(records: list[dict[str, Any]], wide: bool) -> None:
    """`sim replay --defragment`: per policy, without and with the defragmenter (means over seeds):
    pods that waited and their GPU-seconds, whole-GPU pods' wait, unplaced pods, moves."""
    from finesched.sim.report import defrag_rows

    table = DEFRAG_COLUMNS.table("Without / with the defragmenter (mean over seeds)", wide=wide)
    for r in defrag_rows(records):
        DEFRAG_COLUMNS.add_row(
            table,
            r["policy"],
            r["defrag"],
            f"{r['alloc_mean']:.2f}",
            f"{r['waited']:.0f}",
            f"{r['waited_gpu_s']:.1f}",
            f"{r['whole_delay_mean_s']:.3f}",
            f"{r['whole_delay_p99_s']:.2f}",
            f"{r['unplaced']:.0f}",
            f"{r['moves']:.0f}",
            f"{r['moves_pct']:.2f}",
            f"{r['restarted_gpu_s']:.0f}",
            wide=wide,
        )
    print_table(out, table, wide=wide)


#: `--defragment`'s table; the allocation and the work restarted are `-o wide`'s.
DEFRAG_COLUMNS = Columns(
    col("policy", keep=True), col("defrag"), col("GPU alloc %", right=True, wide=True), col("waited", right=True),
    col("GPU·s", right=True), col("≥1 GPU mean s", right=True), col("p99 s", right=True),
    col("unplaced", right=True), col("moves", right=True), col("% pods", right=True),
    col("restarted GPU·s", right=True, wide=True),
)  # fmt: skip


def _write_replay_report(out_dir: Path, runs: list[Any], meta: dict[str, Any]) -> None:
    """`sim replay --out DIR`: the CSV, JSON, plots and HTML report."""
    from finesched.sim.report import write_replay

    written = write_replay(out_dir, runs, meta)
    err.print(f"wrote {', '.join(str(p) for p in written)}", soft_wrap=True)


def _print_replay(records: list[dict[str, Any]], output: str, *, time_scale: float, wall: float, mix: bool) -> None:
    """`sim replay`'s answer on stdout: JSON (`-o json`), else the per-policy table, why pods were never
    placed, and the per-class table when pods had priorities."""
    from finesched.sim.report import replay_summary

    summary = replay_summary(records)
    if output == "json":
        out.print_json(json.dumps({"results": records, "summary": summary}))
        return
    wide = output == "wide"
    table = REPLAY_COLUMNS.table(f"Replay (time scale {time_scale:g}; {wall:.1f} s)", wide=wide)
    for p, s in summary.items():
        REPLAY_COLUMNS.add_row(
            table,
            p,
            str(s["seeds"]),
            f"{s['alloc_mean']:.2f}",
            f"{s['alloc_peak']:.2f}",
            f"{s['queue_peak']:.0f}",
            f"{s['waited']:.0f}",
            f"{s['delay_mean_s']:.3f}",
            f"{s['delay_max_s']:.1f}",
            f"{s['unplaced']:.0f}",
            wide=wide,
        )
    print_table(out, table, wide=output == "wide")
    _reasons_table(records, "unplaced_reasons", "Why pods were never placed: pods per reason (mean over seeds)")
    if mix:
        _replay_priority_table(records)


#: `sim replay`'s table: the policy's name never shortened; in 80 columns the peaks are `-o wide`'s.
REPLAY_COLUMNS = Columns(
    col("policy", keep=True), col("seeds", right=True), col("GPU alloc mean %", right=True),
    col("peak %", right=True, wide=True), col("queue peak", right=True, wide=True), col("waited", right=True),
    col("delay mean s", right=True), col("max s", right=True), col("unplaced", right=True),
)  # fmt: skip


def _replay_priority_table(records: list[dict[str, Any]]) -> None:
    """Per policy, means over seeds: evictions by the victims' class, and per class the mean queueing
    delay, pods never placed and evicted pods that never ran to their end."""
    table = Table(title="Replay by priority class (class 0 / 1 / ...): evictions, delay and lost pods")
    for column in ("policy", "evictions", "evicted by class", "delay mean s", "unplaced", "evicted, unfinished"):
        table.add_column(column)
    for policy in dict.fromkeys(r["policy"] for r in records):
        rows = [r for r in records if r["policy"] == policy]
        classes = sorted({k for r in rows for k in r["by_priority"]}, key=int)
        table.add_row(
            policy,
            f"{fmean([r['evictions'] for r in rows]):.0f}",
            _class_means(rows, classes, lambda r, k: r["evicted_by_priority"].get(k, 0)),
            _class_means(rows, classes, lambda r, k: r["by_priority"][k]["delay_s"]["mean"], 2),
            _class_means(rows, classes, lambda r, k: r["by_priority"][k]["unplaced"]),
            _class_means(rows, classes, lambda r, k: r["by_priority"][k]["evicted_unfinished"]),
        )
    out.print(table)


def _class_means(
    rows: list[dict[str, Any]], classes: list[str], get: Callable[[dict[str, Any], str], float], digits: int = 0
) -> str:
    """``a / b / c``: per class, the mean over `rows` of `get(row, class)`."""
    return " / ".join(f"{fmean([get(r, k) for r in rows]):.{digits}f}" for k in classes)


@sim_app.command()
def topology(
    nodes: Annotated[Path, typer.Option("--nodes", help="Node list CSV.")] = DEFAULT_NODES,
    generate: Annotated[
        int | None, typer.Option("--generate", help="Use N generated nodes of 8 GPUs instead of --nodes.")
    ] = None,
    pods: Annotated[Path, typer.Option("--pods", help="Pod list CSV: the background pods.")] = DEFAULT_PODS,
    background: Annotated[
        str, typer.Option("--background", help="Trace pods beside the gangs: all, share or none.")
    ] = "all",
    rack_size: Annotated[int, typer.Option("--rack-size", help="Nodes per rack.")] = 8,
    block_size: Annotated[int, typer.Option("--block-size", help="Racks per block.")] = 4,
    gang_mix: Annotated[
        str, typer.Option("--gang-mix", help="Gang sizes (members) and weights, e.g. 2:0.3,8:0.4,16:0.2,64:0.1.")
    ] = "2:0.3,8:0.4,16:0.2,64:0.1",
    fractional_share: Annotated[
        float, typer.Option("--fractional-share", help="Share of gangs whose members ask a GPU share.")
    ] = 0.3,
    share_milli: Annotated[int, typer.Option("--share-milli", help="A fractional member's GPU share (milli).")] = 500,
    gang_rate: Annotated[
        float, typer.Option("--gang-rate", help="Gang arrivals per simulated hour (Poisson).")
    ] = 120.0,
    gang_duration: Annotated[
        float, typer.Option("--gang-duration", help="Mean gang run time (s, exponential).")
    ] = 14400.0,
    hours: Annotated[float, typer.Option("--hours", help="Arrival window (simulated hours).")] = 24.0,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Divide the trace pods' arrival times by this.")
    ] = 25.0,
    rack_limit: Annotated[
        int | None,
        typer.Option(
            "--rack-limit",
            help="Gangs of at most this many GPUs require a rack, larger a block (default: the median rack's GPUs).",
        ),
    ] = None,
    level: Annotated[
        str, typer.Option("--level", help="auto (by --rack-limit), rack or block for every gang.")
    ] = "auto",
    node_policy: Annotated[str, typer.Option("--node-policy", help=f"Node score: {', '.join(POLICIES)}.")] = "BestFit",
    policy: Annotated[
        str, typer.Option("--policy", help="unaware, BestFit, KeepDomainsWhole (comma list).")
    ] = "unaware,BestFit,KeepDomainsWhole",
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: N, N-M or a comma list.")] = "42",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write JSON, PNG and HTML here.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, wide or json.")] = "table",
) -> None:
    """Gangs of 2-64 GPUs in racks and blocks beside the trace's pods: topology-unaware vs BestFit vs
    KeepDomainsWhole (share in one rack/block, gang wait, never placed, GPU allocation, whole racks free)."""
    from finesched.sim.topology_workload import TopologyConfig, parse_gang_mix, resolve_topology_policy

    try:
        if output not in OUTPUTS:
            raise _Fail(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}", 2)
        try:
            config = TopologyConfig(
                rack_size=rack_size, block_size=block_size, gang_mix=parse_gang_mix(gang_mix),
                fractional_share=fractional_share, share_milli=share_milli, gang_rate=gang_rate,
                gang_duration=gang_duration, hours=hours, time_scale=time_scale, rack_limit=rack_limit, level=level,
                background=background, node_policy=node_policy,
            )  # fmt: skip
            names = list(dict.fromkeys(resolve_topology_policy(p) for p in policy.split(",") if p.strip()))
            seed_list = _seeds(seeds)
        except ValueError as exc:
            raise _Fail(str(exc), 2) from None
        problems = config.check()
        if problems:
            raise _Fail("; ".join(problems), 2)
        if not names:
            raise _Fail("--policy: no policy given; valid: unaware, BestFit, KeepDomainsWhole", 2)
        if generate is not None and generate < 1:
            raise _Fail(f"--generate must be >= 1 node, got {generate}", 2)
        table, pod_table, node_path, pod_path = _topology_inputs(nodes, generate, pods, background)
        _prepare_out(out_dir)
        runs, wall = _topology_runs(table, pod_table, names, seed_list, config)
        records = [r["record"] for r in runs]
        if out_dir is not None:
            from finesched.sim.topology_report import write_topology

            meta = _meta("finesched sim " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["sim"] else
                         "finesched sim topology", node_path, pod_path, wall_s=round(wall, 1))  # fmt: skip
            written = write_topology(out_dir, runs, meta)
            err.print(f"wrote {', '.join(str(p) for p in written)}", soft_wrap=True)
    except _Fail as exc:
        raise fail(str(exc), exc.code) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc}", 1) from None
    _print_topology(records, output, config, wall)


def _topology_inputs(nodes: Path, generate: int | None, pods: Path, background: str) -> tuple[Any, Any, str, str]:
    """`sim topology`'s node table and pod table (None with --background none), read and checked."""
    from finesched.sim.topology_workload import generate_nodes
    from finesched.sim.trace import load_nodes, load_pods

    try:
        if generate is not None:
            table, node_path = generate_nodes(generate), f"generated: {generate} nodes of 8 GPUs"
        else:
            node_path = _check_file(nodes, "--nodes")
            table = load_nodes(node_path)
        if background == "none":
            return table, None, node_path, "none"
        pod_path = _check_file(pods, "--pods")
        pod_table = load_pods(pod_path)
    except TraceError as exc:
        raise _Fail(str(exc), 1) from None
    if not pod_table.has_times:
        raise _Fail(f"{pods} has no creation/deletion times, which the background pods need", 1)
    return table, pod_table, node_path, pod_path


def _topology_runs(table: Any, pods: Any, names: list[str], seeds: list[int], config: Any) -> tuple[list[Any], float]:
    """Every policy x seed in this process: [{record, series}] and the wall time."""
    from finesched.sim.topology import run_topology, series

    started = time.perf_counter()
    runs = []
    with Progress(TextColumn("[bold]sim topology {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:  # fmt: skip
        task = progress.add_task("", total=len(names) * len(seeds))
        for name in names:
            for seed in seeds:
                progress.update(task, description=f"{name} seed {seed}")
                run = run_topology(table, pods, name, seed, config)
                runs.append({"record": run.record(), "series": series(run)})
                progress.advance(task)
    return runs, time.perf_counter() - started


def _print_topology(records: list[dict[str, Any]], output: str, config: Any, wall: float) -> None:
    """`sim topology`'s answer: JSON (`-o json`) or the per-policy table (means over seeds; `-o wide`
    adds gangs, the trace pods' wait, the fewest whole racks free and required-level violations)."""
    from finesched.sim.topology_report import summary

    rows = summary(records)
    if output == "json":
        out.print_json(json.dumps({"results": records, "summary": rows}))
        return
    wide = output == "wide"
    title = (
        f"Topology-aware gangs: {config.rack_size} nodes/rack, {config.block_size} racks/block, "
        f"{config.gang_rate:g} gangs/h over {config.hours:g} h, node score {config.node_policy} ({wall:.1f} s); "
        "% of placed gangs in one rack/block, gang wait (simulated s), whole racks free (mean)"
    )
    table = TOPOLOGY_COLUMNS.table(title, wide=wide)
    for policy, s in rows.items():
        TOPOLOGY_COLUMNS.add_row(table, policy, *(_figure(s[k]) for k in TOPOLOGY_KEYS), wide=wide)
    print_table(out, table, wide=wide)


#: `sim topology`'s table (summary keys in column order); in 80 columns the rest are `-o wide`'s.
TOPOLOGY_KEYS = (
    "gangs", "in_one_rack_pct", "in_one_block_pct", "gang_wait_mean_s", "gang_wait_p99_s", "never_placed",
    "pod_wait_mean_s", "alloc_mean", "free_racks_mean", "free_racks_min", "level_violations",
)  # fmt: skip
TOPOLOGY_COLUMNS = Columns(  # names and figures are never cut (two-line headers keep 80 columns)
    col("policy", keep=True), col("gangs", right=True, wide=True, keep=True), col("rack\n%", right=True, keep=True),
    col("block\n%", right=True, keep=True), col("wait\ns", right=True, keep=True), col("p99\ns", right=True, keep=True),
    col("never\nplaced", right=True, keep=True), col("pod wait\ns", right=True, wide=True, keep=True),
    col("alloc\n%", right=True, keep=True), col("free\nracks", right=True, keep=True),
    col("min free", right=True, wide=True), col("violations", right=True, wide=True),
)  # fmt: skip


def _figure(value: float) -> str:
    """A table figure: whole numbers as they are, others to one decimal (-o json keeps them exact)."""
    return f"{value:.0f}" if float(value).is_integer() or abs(value) >= 1000 else f"{value:.1f}"
