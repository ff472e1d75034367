"""Where a benchmark's time goes: py-spy samples a command and this prints the top frames.

    python bench/profile.py [--rate 500] [--under FRAME] [--top 20] -- python bench/throughput.py --child ...

py-spy (a sampling profiler, dev dependency) records the command's stacks in its raw ("collapsed")
format; the table lists the frames with the most samples of their own ("self", where the CPU is) and
with the most samples at or below them ("total", the flame graph's widest bars). `--under FRAME`
keeps only the stacks that pass through a frame whose text contains FRAME (e.g.
`Scheduler.schedule_one`), so set-up and checks outside the measured loop do not crowd the table;
shares are then of those stacks. `--svg FILE` also writes py-spy's flame graph. Needs the right to
trace the child (root, or ptrace allowed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable


def read_stacks(path: str) -> list[tuple[list[str], int]]:
    """The collapsed stacks of a py-spy raw file: (frames root first, samples)."""
    stacks = []
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack:
                stacks.append((stack.split(";"), int(count)))
    return stacks


def top_frames(stacks: Iterable[tuple[list[str], int]], under: str | None, top: int) -> str:
    """A table of the `top` frames by self and by total samples (of the stacks through `under`)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for frames, count in stacks:
        if under is not None:
            at = next((i for i, f in enumerate(frames) if under in f), None)
            if at is None:
                continue
            frames = frames[at:]
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    if samples == 0:
        return f"no samples{f' under {under!r}' if under else ''}"
    lines = [f"{samples} samples{f' under {under!r}' if under else ''}", "self %  frame"]
    lines += [f"{100 * n / samples:6.1f}  {frame}" for frame, n in own.most_common(top)]
    lines += ["total %  frame"]
    lines += [f"{100 * n / samples:7.1f}  {frame}" for frame, n in total.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=500, help="samples per second")
    parser.add_argument("--under", help="keep only stacks through a frame containing this text")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--svg", help="also write py-spy's flame graph here")
    parser.add_argument("--subprocesses", action="store_true", help="also sample the command's children")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to profile")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to profile after --")
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    options = ["--rate", str(args.rate)] + (["--subprocesses"] if args.subprocesses else [])
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "stacks.txt")
        subprocess.run([py_spy, "record", *options, "-f", "raw", "-o", raw, "--", *command], check=True)
        if args.svg:
            subprocess.run([py_spy, "record", *options, "-o", args.svg, "--", *command], check=True)
        print(top_frames(read_stacks(raw), args.under, args.top))


if __name__ == "__main__":
    main()
