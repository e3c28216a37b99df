"""Where the test suite's time goes: a pytest plugin and its summary.

    PYTHONPATH=benchmarks python -m pytest -q -n 2 -p suite_compile
    python benchmarks/suite_compile.py            # the summary

Each test (setup, call and teardown) appends one JSON line to
$SUITE_COMPILE (default suite_compile.jsonl; workers append to the same
file): its wall time and the seconds jax.monitoring reported during it,
per event (tracing, lowering to MLIR, XLA's compilation, the persistent
cache). The summary gives the totals, the time per test file and the
slowest tests with their shares.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

import pytest

PATH = os.environ.get("SUITE_COMPILE", "suite_compile.jsonl")
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
XLA = "/jax/core/compile/backend_compile_duration"

_events: collections.Counter = collections.Counter()
_listening = False


def _listen(name: str, seconds: float, **_) -> None:
    _events[name] += seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _listening
    if not _listening:
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(_listen)
        _listening = True
    _events.clear()
    start = time.perf_counter()
    yield
    row = {"id": item.nodeid, "total": time.perf_counter() - start, **_events}
    with open(PATH, "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(path: str = PATH, top: int = 30) -> None:
    rows = [json.loads(line) for line in open(path)]
    total = sum(r["total"] for r in rows)
    parts = {k: sum(r.get(k, 0.0) for r in rows) for k in (TRACE, LOWER, XLA)}
    print(f"{len(rows)} tests, {total:.0f} s of worker time: tracing {parts[TRACE]:.0f} s, "
          f"lowering {parts[LOWER]:.0f} s, XLA {parts[XLA]:.0f} s, "
          f"the rest {total - sum(parts.values()):.0f} s")
    files = collections.Counter()
    for r in rows:
        files[r["id"].split("::")[0]] += r["total"]
    print("\n| file | s |\n|---|---|")
    for name, t in files.most_common():
        print(f"| {name} | {t:.1f} |")
    print("\n| test | s | tracing | lowering | XLA |\n|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["total"])[:top]:
        print(f"| {r['id']} | {r['total']:.1f} | {r.get(TRACE, 0):.1f} | "
              f"{r.get(LOWER, 0):.1f} | {r.get(XLA, 0):.1f} |")


if __name__ == "__main__":
    summary(*sys.argv[1:2])
