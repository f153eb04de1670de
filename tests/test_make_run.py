"""`make run` on a fresh clone as a user without root and without a browser (issue 41, item 1): its recipe installs
only what running needs (no dev extras, no chromium, no apt-get or sudo) and goes on to the chat.

The real Makefile runs in a copy of the repository's top level, as an unprivileged user (`setpriv` to nobody when
the tests run as root, as CI does; as is otherwise), with stand-ins for pip and ragbot that record their arguments
(a real install takes minutes and the network) and for apt-get and sudo that record any call and fail. What is
checked is the Makefile's own recipe: which commands `make run` runs, in which order, and that it succeeds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
{tail}
"""


def _script(path: Path, log: Path, tail: str = "exit 0") -> None:
    path.write_text(RECORDER.format(log=log, tail=tail), encoding="utf-8")
    path.chmod(0o755)


@pytest.fixture
def clone() -> Iterator[Path]:
    """A copy of the repository's Makefile and pyproject.toml with an empty .venv holding the stand-ins, owned by
    the unprivileged user, in a folder that user can reach (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="ragbot-make-run-"))
    root.chmod(0o755)
    try:
        for name in ("Makefile", "pyproject.toml"):
            shutil.copy(REPO / name, root / name)
        log = root / "calls.log"
        log.touch()
        bin_dir = root / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        for tool in ("python", "pip", "ragbot"):
            _script(bin_dir / tool, log)
        shims = root / "shims"  # the whole PATH: the few tools the recipes use, no browser; apt and sudo recorded
        shims.mkdir()
        for tool in ("apt-get", "sudo", "apt"):
            _script(shims / tool, log, "exit 100")
        for tool in ("make", "sh", "id", "touch", "test", "basename"):
            found = shutil.which(tool)
            assert found, f"{tool} is needed to run the Makefile"
            (shims / tool).symlink_to(found)
        if os.geteuid() == 0:
            for path in [root, *root.rglob("*")]:
                os.chown(path, NOBODY, NOBODY)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_as_unprivileged(root: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(root / "shims"), "HOME": str(root), "LANG": "C.UTF-8"}
    command = [str(shutil.which("make")), "-C", str(root), *targets]
    if os.geteuid() == 0:
        command = [str(shutil.which("setpriv")), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_only_what_running_needs_without_root_and_reaches_the_chat(clone: Path) -> None:
    done = make_as_unprivileged(clone, "run")
    calls = (clone / "calls.log").read_text(encoding="utf-8").splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [c for c in calls if c.split()[0] in ("apt-get", "apt", "sudo")], calls
    assert calls == [
        "pip install --quiet torch==2.13.0",
        "pip install --quiet -e .",  # no [dev]: pytest, mypy, ruff, playwright, scipy are `make test`'s
        "ragbot db upgrade",
        "ragbot ingest examples/handbook --source handbook",
        "ragbot run",
    ]
    assert (clone / ".venv" / ".run-stamp").exists() and not (clone / ".venv" / ".test-stamp").exists()
    assert (clone / ".venv" / ".run-stamp").stat().st_uid == (NOBODY if os.geteuid() == 0 else os.geteuid())

    # Installed once: a second `make run` goes straight to the chat.
    (clone / "calls.log").write_text("", encoding="utf-8")
    assert make_as_unprivileged(clone, "run").returncode == 0
    assert [c.split()[1] for c in (clone / "calls.log").read_text(encoding="utf-8").splitlines()] == [
        "db", "ingest", "run"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_setup_without_root_or_browser_says_how_to_get_it_in_one_line(clone: Path) -> None:
    done = make_as_unprivileged(clone, "setup-test")
    calls = (clone / "calls.log").read_text(encoding="utf-8").splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'pip install --quiet -e .[dev]' in calls and not [c for c in calls if c.startswith(("apt", "sudo"))]
    notes = [line for line in done.stdout.splitlines() if "chromium" in line and not line.startswith(("if ", "\t"))]
    assert notes == ["note: no chromium, so the admin page's browser test is skipped; to run it: "
                     "sudo apt-get install chromium"]
    assert (clone / ".venv" / ".test-stamp").exists() and (clone / ".venv" / ".run-stamp").exists()
