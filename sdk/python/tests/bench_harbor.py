"""How many trials of the hello task one atoll node runs at once.

Each trial is what Harbor does with the oracle agent: start the
environment (the template is cached), upload and run the solution, upload
and run the verifier, download its reward, delete the sandbox. For each
level of parallelism N (argv, default 1 8 16 32 64), N trials start
together and all hold a sandbox at the same time (a barrier after start);
the output is a JSON line per level: trials that passed, wall time,
trials per second and the p50/p99 of a trial's time and of its start.

    ATOLL_URL=... ATOLL_API_KEY=... python3 -m tests.bench_harbor 8 32
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import atoll
from atoll import harbor

TASK = Path(__file__).parent / "tasks" / "hello"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else 0.0


def trial(c: atoll.Client, i: int, barrier: threading.Barrier, out: list) -> None:
    e = harbor.AtollEnvironment(TASK / "environment", "hello", f"hello__{i}", client=c)
    t0 = time.monotonic()
    ok, started = False, None
    try:
        asyncio.run(e.start())
        started = time.monotonic() - t0
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            pass
        asyncio.run(e.upload_file(TASK / "solution" / "solve.sh", "/solution/solve.sh"))
        asyncio.run(e.exec("bash /solution/solve.sh"))
        asyncio.run(e.upload_dir(TASK / "tests", "/tests"))
        asyncio.run(e.exec("bash /tests/test.sh", timeout_sec=60))
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(e.download_file("/logs/verifier/reward.txt", Path(d) / "r"))
            ok = (Path(d) / "r").read_text().strip() == "1"
    except Exception as err:  # a failed trial is counted, not raised
        out.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
        barrier.abort()
        return
    finally:
        e.stop_sync(True)
    out.append({"ok": ok, "s": time.monotonic() - t0, "start_s": started})


def level(c: atoll.Client, n: int) -> dict:
    barrier = threading.Barrier(n)
    out: list = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=trial, args=(c, i, barrier, out)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    good = [r for r in out if r["ok"]]
    errs = sorted({r["error"] for r in out if "error" in r})
    return {"parallel": n, "passed": len(good), "wall_s": round(wall, 2),
            "trials_per_s": round(len(good) / wall, 2),
            "trial_p50_s": round(pct([r["s"] for r in good], 50), 2),
            "trial_p99_s": round(pct([r["s"] for r in good], 99), 2),
            "start_p50_s": round(pct([r["start_s"] for r in good], 50), 3),
            "start_p99_s": round(pct([r["start_s"] for r in good], 99), 3),
            "errors": errs[:3]}


def main(argv):
    levels = [int(a) for a in argv] or [1, 8, 16, 32, 64]
    c = atoll.Client()
    # The first trial builds the template; the levels measure trials.
    level(c, 1)
    for n in levels:
        print(json.dumps(level(c, n)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
