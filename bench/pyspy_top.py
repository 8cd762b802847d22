"""Summarise a ``py-spy record --format raw --threads`` profile: top functions by self and total.

    .venv/bin/py-spy record --rate 300 --threads --format raw -o /tmp/tp.txt -- \\
        .venv/bin/python bench/embedded.py --phase throughput
    .venv/bin/python bench/pyspy_top.py /tmp/tp.txt            # by function
    .venv/bin/python bench/pyspy_top.py /tmp/tp.txt --lines    # by source line

Samples of job submission (``App.schedule``), of module imports and of threads idling in a
pool or in the selector are dropped, so what is left is the node at work. Add ``--gil`` to ``py-spy record``
to keep only samples of the thread holding the GIL (Python work; SQLite runs without the GIL).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence

FRAME = re.compile(r"(?P<fn>.*) \((?P<file>.*?):(?P<line>\d+)\)$")
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py", "EpollSelector.select (selectors.py")


def frame_name(frame: str, lines: bool) -> str:
    m = FRAME.match(frame)
    if m is None:
        return frame
    path = m["file"].split("site-packages/")[-1].split("python3.11/")[-1]
    return f"{m['fn']} ({path}:{m['line']})" if lines else f"{m['fn']} ({path})"


def thread_kind(thread: str) -> str:
    if "asyncio_" in thread:
        return "store calls (asyncio.to_thread pool)"
    if "onbeat-task" in thread:
        return "sync tasks (worker thread pool)"
    return "event loop (main thread)"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("profile", help="py-spy raw (collapsed stacks) output")
    p.add_argument("--lines", action="store_true", help="group by source line, not function")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)

    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    samples = 0
    with open(args.profile) as f:
        for raw in f:
            stack, _, count = raw.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            leaf = frames[-1]
            if "App.schedule" in stack or "_find_and_load" in stack or leaf.startswith(IDLE_LEAVES):
                continue
            n = int(count)
            samples += n
            threads[thread_kind(frames[0])] += n
            names = [frame_name(fr, args.lines) for fr in frames[1:]]
            if names:
                own[names[-1]] += n
            for name in set(names):
                total[name] += n
    if not samples:
        print("no samples")
        return
    print(f"{samples} samples")
    for kind, n in threads.most_common():
        print(f"  {n / samples:6.1%}  {kind}")
    print("self (the frame itself; a store line's time is mostly SQLite's C code):")
    for name, n in own.most_common(args.top):
        print(f"  {n / samples:6.1%}  {name}")
    print("total (the frame and what it called):")
    skip = ("threading.py", "concurrent/futures", "asyncio/", "runners.py", "embedded.py")
    shown = [(name, n) for name, n in total.most_common() if not any(s in name for s in skip)]
    for name, n in shown[: args.top]:
        print(f"  {n / samples:6.1%}  {name}")


if __name__ == "__main__":
    main()
