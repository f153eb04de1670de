"""Parse files in worker processes under limits on time and memory, so one file never costs more than itself.

A spreadsheet declaring a million rows or a zip of a 200 MB XML is caught by the per-format caps of
`knowledge.ingest.parsing.ParseLimits`; whatever those miss (a PDF stream bomb, a pathological HTML page) runs into the
worker's address-space limit (RLIMIT_AS, PARSE_MEMORY_MB) or its deadline (PARSE_TIMEOUT_SECONDS), and only that
file is skipped. Workers also let parsing use every core while the model embeds.

Each worker is a plain subprocess (`knowledge.ingest.parse_worker`) parsing one file at a time, so a file that
overruns its deadline or dies is that worker's only file: it is killed and replaced, and nothing else fails. It
imports only the parsers (never torch or the model), so the memory limit measures the parse, not the bot; and it
exits when the process that started it dies (its stdin closes).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from pathlib import Path

from knowledge.errors import CorruptDocument, LimitExceeded
from knowledge.ingest.parse_worker import HEADER, READY, memory_message, parse_bounded
from knowledge.ingest.parsing import ParseLimits, ParseResult

# How long a new worker may take to start (an interpreter and the parsers' imports), outside any file's deadline.
WORKER_START_SECONDS = 120.0


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, memory_mb: int) -> _Worker:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the `knowledge` package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")  # numeric libraries reserve memory per thread at import
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "knowledge.ingest.parse_worker", str(memory_mb),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )
        worker = cls(process)
        assert process.stdout is not None  # a pipe, as asked
        try:
            ready = await asyncio.wait_for(process.stdout.readexactly(1), WORKER_START_SECONDS)
        except (asyncio.IncompleteReadError, TimeoutError):
            worker.kill()
            raise LimitExceeded(
                f"a parsing worker cannot start within {memory_mb:,} MB (setting PARSE_MEMORY_MB)") from None
        assert ready == READY
        return worker

    async def ask(self, request: tuple[object, ...]) -> tuple[str, object]:
        body = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(HEADER.pack(len(body)) + body)
        await self.process.stdin.drain()
        (size,) = HEADER.unpack(await self.process.stdout.readexactly(HEADER.size))
        reply: tuple[str, object] = pickle.loads(await self.process.stdout.readexactly(size))
        return reply

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        """Close its stdin (it exits), then make sure it is gone."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 5)
        except TimeoutError:
            self.kill()
            await self.process.wait()


class ParsePool:
    """`await pool.parse(...)`: the parsed document, or LimitExceeded / CorruptDocument / UnsupportedFormat.

    `workers=0` parses in a thread of this process (no memory limit or deadline: for debugging)."""

    def __init__(self, limits: ParseLimits, *, workers: int, timeout_seconds: float, memory_mb: int) -> None:
        self.limits = limits
        self.workers = workers
        self.timeout_seconds = timeout_seconds
        self.memory_mb = memory_mb
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(max(1, workers))

    async def parse(self, data: bytes, filename: str, max_chars: int) -> ParseResult:
        if self.workers == 0:
            return await asyncio.to_thread(parse_bounded, data, filename, self.limits, max_chars, self.memory_mb)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # subprocess pipes belong to one event loop (the KB outlives loops in tests)
            for worker in self._idle:
                worker.kill()
            self._loop, self._idle, self._slots = loop, [], asyncio.Semaphore(self.workers)
        async with self._slots:  # one file per worker, so a file's deadline never counts time in a queue
            worker = self._idle.pop() if self._idle else await _Worker.start(self.memory_mb)
            try:
                status, value = await asyncio.wait_for(
                    worker.ask((data, filename, self.limits, max_chars)), self.timeout_seconds)
            except TimeoutError:
                worker.kill()
                raise LimitExceeded(
                    f"took longer than {self.timeout_seconds:g} s to parse (setting PARSE_TIMEOUT_SECONDS)"
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError):  # the worker died on this file
                worker.kill()
                raise LimitExceeded(memory_message(self.memory_mb)) from None
            except BaseException:  # cancelled mid-file: the worker's state is unknown
                worker.kill()
                raise
            self._idle.append(worker)
        if status == "ok" and isinstance(value, ParseResult):
            return value
        if isinstance(value, Exception) and isinstance(value, (LimitExceeded, CorruptDocument, ValueError)):
            raise value
        raise CorruptDocument(f"could not read the file: {value}")

    @property
    def idle_worker_pids(self) -> list[int]:
        """The process ids of the workers waiting for a file (for operators and tests)."""
        return [worker.process.pid for worker in self._idle]

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        if self._loop is asyncio.get_running_loop():
            await asyncio.gather(*(worker.close() for worker in idle), return_exceptions=True)
        else:
            for worker in idle:
                worker.kill()
