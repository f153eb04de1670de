"""A pytest plugin that reports CPU seconds (user + sys) and wall seconds per test file, for measuring the suite.

Not loaded by default: `python -m pytest -p tests.cpu_report ...` (with PYTHONPATH at the repository). Each test's
protocol (setup, call, teardown, so module fixtures count in their file) is timed with os.times() in the process that
runs it, subprocesses it waited for included; session fixtures count in the first file that used them. The shared
embedded Postgres is a daemon, not a child: the controller samples its postmaster's CPU (its own and its reaped
backends') from /proc and reports it on its own line. Written because wall time on a machine shared with other work
says little; CPU seconds are what the suite costs (docs/development.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

_RESULTS_ROOT = Path(os.environ.get("CPU_REPORT_DIR", tempfile.gettempdir())) / "ragbot-cpu-report"
_per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # type: ignore[arg-type]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    cpu, wall = _cpu(), time.monotonic()
    yield
    entry = _per_file[item.nodeid.split("::")[0]]
    entry[0] += _cpu() - cpu
    entry[1] += time.monotonic() - wall
    entry[2] += 1


def _results(config: pytest.Config) -> Path:
    """This run's own folder (named after xdist's run id, which the workers share): two runs at once, by two people
    on one machine, never mix or delete each other's figures."""
    run = getattr(config, "workerinput", {}).get("testrunuid") or config.option.testrunuid
    return _RESULTS_ROOT / str(run)[:16]


class _Sampler:
    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()

    def sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                argv0 = cmdline.split(b"\0")[0]
                if not argv0.endswith(b"postgres") or self.marker not in cmdline:
                    continue
                if b"-D" not in cmdline:  # postmasters only: their cutime holds every backend they reaped
                    continue
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                self.seen[int(proc.name)] = sum(float(x) for x in stat[11:15]) / tick
            except (OSError, ValueError, IndexError):
                continue


_sampler: _Sampler | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _sampler
    if not hasattr(config, "workerinput"):
        # the shared server's folder is named after xdist's run id (tests/conftest.py): fix it to find the server
        if getattr(config.option, "testrunuid", None) is None:
            config.option.testrunuid = uuid.uuid4().hex
        _results(config).mkdir(parents=True, exist_ok=True)
        _sampler = _Sampler(f"ragbot-tests-server-{config.option.testrunuid[:16]}".encode())
        _sampler.thread.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    results = _results(session.config)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{worker}.json").write_text(json.dumps(dict(_per_file)))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    merged: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # type: ignore[arg-type]
    results = _results(config)
    for path in results.glob("*.json"):
        for name, (cpu, wall, n) in json.loads(path.read_text()).items():
            merged[name][0] += cpu
            merged[name][1] += wall
            merged[name][2] += n
        path.unlink()
    with contextlib.suppress(OSError):
        results.rmdir()
    write = terminalreporter.write_line
    write("CPU per file (user+sys s, this process and its waited children) / wall s / tests:")
    for name, (cpu, wall, n) in sorted(merged.items(), key=lambda kv: -kv[1][0]):
        write(f"  {cpu:8.1f} {wall:8.1f} {int(n):4d}  {name}")
    write(f"  {sum(v[0] for v in merged.values()):8.1f} {sum(v[1] for v in merged.values()):8.1f}  total in tests")
    if _sampler is not None:
        _sampler.stop.set()
        _sampler.sample()
        write(f"  {sum(_sampler.seen.values()):8.1f}  postgres postmasters (last sample; backends they reaped included)")
