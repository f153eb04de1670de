"""Parse files in worker processes under limits on time and memory, so one file never costs more than itself.

A spreadsheet declaring a million rows or a zip of a 200 MB XML is caught by the per-format caps of
`knowledge.ingest.parsing.ParseLimits`; whatever those miss (a PDF stream bomb, a pathological HTML page) runs into the
worker's address-space limit (RLIMIT_AS, PARSE_MEMORY_MB) or its deadline (PARSE_TIMEOUT_SECONDS), and only that
file is skipped. Workers also let parsing use every core while the model embeds.

Workers are started with "spawn": a clean interpreter that imports only the parsers (never torch or the model),
so the memory limit measures the parse, not the bot. A worker that times out or dies is killed with its pool,
and the files that were in flight on it are parsed again on a fresh pool (once), so a neighbour's bomb does not
fail them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from knowledge.ingest.parsing import LimitExceeded, ParsedDocument, ParseLimits, parse_document, truncate_blocks


@dataclass(frozen=True)
class ParseResult:
    document: ParsedDocument
    truncated: bool  # cut to `max_chars` (reported as MAX_DOCUMENT_CHUNKS)


def _limit_memory(memory_mb: int) -> None:
    """Worker initializer: cap the worker's address space, so an allocation past it raises MemoryError there."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _warm() -> int:
    """Run once on each new worker before any deadline counts: import the parsers, so a file's deadline measures
    its parse, not the interpreter's start."""
    import importlib
    import os

    for module in ("bs4", "pypdf", "docx", "openpyxl"):
        try:
            importlib.import_module(module)
        except ImportError:  # pragma: no cover - an optional parser missing shows when a file needs it
            pass
    return os.getpid()


def parse_bounded(data: bytes, filename: str, limits: ParseLimits, max_chars: int, memory_mb: int) -> ParseResult:
    """Parse and cut to `max_chars` (so no more than that travels back from the worker)."""
    try:
        document = parse_document(data, filename, limits)
        return ParseResult(document, truncate_blocks(document, max_chars))
    except MemoryError:
        raise LimitExceeded(_memory_message(memory_mb)) from None


def _memory_message(memory_mb: int) -> str:
    """A MemoryError in the parse, or the worker dying twice on it (under RLIMIT_AS, even receiving the file can
    fail): both are the memory limit."""
    return f"needs more than {memory_mb:,} MB of memory to parse (setting PARSE_MEMORY_MB)"


class ParsePool:
    """`await pool.parse(...)`: the parsed document, or LimitExceeded / CorruptDocument / UnsupportedFormat.

    `workers=0` parses in a thread of this process (no memory limit or deadline: for debugging)."""

    def __init__(self, limits: ParseLimits, *, workers: int, timeout_seconds: float, memory_mb: int) -> None:
        self.limits = limits
        self.workers = workers
        self.timeout_seconds = timeout_seconds
        self.memory_mb = memory_mb
        self._executor: ProcessPoolExecutor | None = None
        self._generation = 0
        self._warming: asyncio.Future[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(max(1, workers))

    async def _pool(self) -> tuple[ProcessPoolExecutor, int]:
        """The running pool and its generation; a new one is started (and its workers warmed, all of them at once,
        no deadline) when there is none."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_limit_memory, initargs=(self.memory_mb,),
            )
            self._generation += 1
            self._warming = asyncio.ensure_future(asyncio.gather(
                *(asyncio.wrap_future(self._executor.submit(_warm)) for _ in range(self.workers))))
        executor, generation, warming = self._executor, self._generation, self._warming
        try:
            if warming is not None:
                await asyncio.shield(warming)
        except BrokenProcessPool:  # a worker could not even start (a memory limit too low for Python itself)
            self._kill(generation)
            raise LimitExceeded(
                f"a parsing worker cannot start within {self.memory_mb:,} MB (setting PARSE_MEMORY_MB)") from None
        return executor, generation

    async def parse(self, data: bytes, filename: str, max_chars: int) -> ParseResult:
        if self.workers == 0:
            return await asyncio.to_thread(parse_bounded, data, filename, self.limits, max_chars, self.memory_mb)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # one semaphore per event loop (the knowledge base outlives loops in tests)
            self._loop, self._slots = loop, asyncio.Semaphore(self.workers)
            self._warming = None  # the pool's workers are warm already; the future belonged to the old loop
        async with self._slots:  # at most one file per worker, so the deadline never counts time in a queue
            return await self._parse(data, filename, max_chars)

    async def _parse(self, data: bytes, filename: str, max_chars: int) -> ParseResult:
        for attempt in range(2):
            executor, generation = await self._pool()
            try:
                future = executor.submit(parse_bounded, data, filename, self.limits, max_chars, self.memory_mb)
            except BrokenProcessPool:  # broken (a neighbour's deadline) since we got it: take a new one
                self._kill(generation)
                continue
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_seconds)
            except TimeoutError:
                self._kill(generation)
                raise LimitExceeded(
                    f"took longer than {self.timeout_seconds:g} s to parse (setting PARSE_TIMEOUT_SECONDS)"
                ) from None
            except BrokenProcessPool:  # a worker died: this file's, or a neighbour's killed for its deadline
                self._kill(generation)
                if attempt == 1:
                    raise LimitExceeded(_memory_message(self.memory_mb)) from None
        raise LimitExceeded(_memory_message(self.memory_mb))

    def _kill(self, generation: int) -> None:
        """Kill the pool's workers (a stuck parse cannot be interrupted otherwise); the next parse starts a new pool.
        Only the pool of `generation`: another file may already have replaced it."""
        executor = self._executor
        if executor is None or generation != self._generation:
            return
        self._executor = None
        for process in list(getattr(executor, "_processes", {}).values()):
            process.kill()
        executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
