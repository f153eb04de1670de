"""A parsing worker: `python -m knowledge.ingest.parse_worker MEMORY_MB`, started and fed by
`knowledge.ingest.isolation.ParsePool`.

It caps its own address space (RLIMIT_AS), imports the parsers' libraries, says it is ready, then answers requests
on stdin with results on stdout (a `knowledge.ingest.parsing.ParseResult`, or the parse's error), one at a time,
each a length-prefixed pickle. It exits when stdin closes, which is also what happens when the process that
started it dies (nothing else holds that pipe). A plain subprocess rather than multiprocessing: no module of the
parent's (an unguarded script) is ever re-imported here. `knowledge.ingest.isolation` imports this module for the
wire format and `parse_bounded` (the thread mode), never the other way round.
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
from typing import BinaryIO, cast

from knowledge.errors import CorruptDocument, LimitExceeded
from knowledge.ingest.parsing import ParseLimits, ParseResult, parse_document, truncate_blocks

HEADER = struct.Struct("!Q")
READY = b"R"


def parse_bounded(data: bytes, filename: str, limits: ParseLimits, max_chars: int, memory_mb: int) -> ParseResult:
    """Parse and cut to `max_chars` (so no more than that travels back from the worker)."""
    try:
        document = parse_document(data, filename, limits)
        return ParseResult(document, truncate_blocks(document, max_chars))
    except MemoryError:
        raise LimitExceeded(memory_message(memory_mb)) from None


def memory_message(memory_mb: int) -> str:
    """A MemoryError in the parse, or the worker dying on it: both are the memory limit."""
    return f"needs more than {memory_mb:,} MB of memory to parse (setting PARSE_MEMORY_MB)"


def read_message(stream: BinaryIO) -> object | None:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    message: object = pickle.loads(body)
    return message


def write_message(stream: BinaryIO, message: object) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


def main() -> None:
    memory_mb = int(sys.argv[1])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a library printing must not corrupt the replies
    for module in ("bs4", "pypdf", "docx"):  # not openpyxl: it imports numpy, paid only when a workbook comes
        try:
            __import__(module)
        except BaseException:  # noqa: BLE001 - a parser that cannot load shows when a file needs it
            pass
    stdout.write(READY)
    stdout.flush()
    while True:
        request = read_message(stdin)
        if request is None:
            return
        data, filename, limits, max_chars = cast(tuple[bytes, str, ParseLimits, int], request)
        try:
            reply: object = ("ok", parse_bounded(data, filename, limits, max_chars, memory_mb))
        except (ValueError, MemoryError) as exc:  # the parse's own errors (LimitExceeded, CorruptDocument, …)
            reply = ("error", exc)
        except BaseException as exc:  # noqa: BLE001 - anything else is this file's problem, reported as such
            reply = ("error", CorruptDocument(f"could not read the file: {type(exc).__name__}: {exc}"))
        try:
            write_message(stdout, reply)
        except MemoryError:
            os._exit(3)  # the parent reports the memory limit


if __name__ == "__main__":
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    main()
