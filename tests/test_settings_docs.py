"""Every setting the documentation names is one the code reads, and every setting the code reads is documented in
.env.example (issue 41: the README's `ABSTAIN_BELOW_SIMILARITY` did nothing; the working one is
`ANSWER_DECLINE_BELOW_SIMILARITY`, since replaced by `ANSWER_CALIBRATION`). A misspelt or retired setting in `.env`
gets a warning naming the closest real one, or the one that replaced it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app
from bot.settings import GOOGLE_SETTINGS, known_settings, settings_of

REPO = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = REPO / ".env.example"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Upper-case names with an underscore the pages mention that are not ragbot settings, and why.
NOT_SETTINGS = {
    "NO_ANSWER": "what Claude replies to decline (docs/answers.md)",
    "HF_HUB_OFFLINE": "Hugging Face's own variable (the Makefile and tests set it)",
    "TRANSFORMERS_OFFLINE": "Hugging Face's own variable",
    "SSL_CERT_FILE": "OpenSSL's CA bundle variable (docs/operations.md, image builds)",
    "REQUESTS_CA_BUNDLE": "requests' CA bundle variable",
    "HTTPS_PROXY": "the standard proxy variable the Teams SDK honours (docs/teams.md)",
    "PERSON_COLUMNS": "a constant of bot/chat/retention.py: the columns forget-user handles (docs/security.md)",
    "PIP_CERT": "pip's CA bundle variable (image builds)",
    "TORCH_VERSION": "a Dockerfile build argument",
    "TORCH_INDEX_URL": "a Dockerfile build argument",
    "BASE_IMAGE": "scripts/build_image.sh's variable",
    "HOST_PIP": "scripts/build_image.sh's variable",
    "PG_IMAGE": "tests/image/smoke.sh's variable",
    "DOCS_DIR": "compose.yaml's variable: the folder mounted at /docs",
    "TEST_WORKERS": "the Makefile's variable: pytest-xdist processes",
    "OMP_NUM_THREADS": "OpenMP's thread count, which tests/conftest.py sets to 1 per test process (docs/development.md)",
    "OPENBLAS_NUM_THREADS": "OpenBLAS's thread count (tests/conftest.py)",
    "MKL_NUM_THREADS": "MKL's thread count (tests/conftest.py)",
    "PYTEST_XDIST_TESTRUNUID": "pytest-xdist's variable (docs/development.md: the shared test server)",
    "SLOW_MODULES": "a constant of tests/conftest.py (docs/development.md)",
    "TEST_SERVER_SETTINGS": "a constant of tests/conftest.py (docs/development.md)",
    "RAGBOT_TEST_EMBEDDING_CACHE": "the test suite's embedding cache folder, or off (tests/embedding_cache.py)",
    "RAGBOT_SCALE_SMOKE": "opts into the podman smoke test of compose.scale.yaml (docs/operations.md)",
    "CONTAINERS_CONF": "podman's own configuration file variable, set by that smoke test (docs/operations.md)",
    "THREAD_PAGE_SIZE": "a constant of bot/slack (docs/connectors.md)",
    "THREAD_MAX_PAGES": "a constant of bot/slack (docs/connectors.md)",
    "PRIOR_MESSAGES_LIMIT": "a constant of bot/slack (docs/connectors.md)",
}

_CODE = re.compile(r"`([A-Z][A-Z0-9_]*)(?:=[^`]*)?`")
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)=")
_ENV_LINE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.MULTILINE)


def named_settings(text: str, known: set[str]) -> set[str]:
    """What a page names as a setting: `NAME` or `NAME=value` in code, and NAME=… anywhere (commands, examples).
    One-word names count only when they are settings (`PORT`); others are words (`WARNING`, `RUN`)."""
    names = {m.group(1) for m in _CODE.finditer(text)} | {m.group(1) for m in _ASSIGNMENT.finditer(text)}
    return {name for name in names if "_" in name or name in known}


def unread(text: str) -> set[str]:
    known = known_settings()
    return named_settings(text, known) - known - set(NOT_SETTINGS)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_setting_a_page_names_is_read_by_the_code(path: Path) -> None:
    assert unread(path.read_text(encoding="utf-8")) == set()


def test_every_setting_in_env_example_is_read_by_the_code() -> None:
    listed = {m.group(1) for m in _ENV_LINE.finditer(ENV_EXAMPLE.read_text(encoding="utf-8"))}
    assert len(listed) > 50, "almost nothing found in .env.example: is the pattern still right?"
    assert listed - known_settings() == set()


def test_every_setting_the_code_reads_is_in_env_example() -> None:
    listed = {m.group(1) for m in _ENV_LINE.finditer(ENV_EXAMPLE.read_text(encoding="utf-8"))}
    # DISCORD_BOT_TOKEN is DISCORD_TOKEN's other spelling; .env.example shows the one the README uses.
    assert known_settings() - listed - {"DISCORD_BOT_TOKEN"} == set()


def test_the_google_settings_named_for_a_fast_start_are_their_models_fields() -> None:
    from knowledge.sources.gdrive import GoogleDriveSettings
    from knowledge.sources.google_directory import GoogleDirectorySettings

    assert set(GOOGLE_SETTINGS) == settings_of(GoogleDriveSettings) | settings_of(GoogleDirectorySettings)


def test_the_checker_catches_a_setting_that_does_nothing() -> None:
    page = ("| `ABSTAIN_BELOW_SIMILARITY` | 0.20 | decline below this |\n"
            "`PORT` and `WARNING`; run `FUSION=rrf ragbot ask …`, `LOG_LEVEL=DEBUG`, `HF_HUB_OFFLINE=1`.\n")
    assert unread(page) == {"ABSTAIN_BELOW_SIMILARITY"}


def test_a_misspelt_setting_in_dotenv_is_warned_about_with_the_closest_real_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("ANSWER_CALIBRATON=fit.json\nANSWER_DECLINE_BELOW_SIMILARITY=0.3\nWIKI_PAT=secret\n"
                                   "PORT=3001\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@127.0.0.1:9/x")  # `db stop` refuses at once: no server
    result = CliRunner().invoke(app, ["db", "stop"])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 2, result.stderr
    assert "ANSWER_CALIBRATON" in warnings[0] and "did you mean ANSWER_CALIBRATION?" in warnings[0]
    # a threshold the fitted decision replaced does nothing any more: the warning names its replacement
    assert "ANSWER_DECLINE_BELOW_SIMILARITY" in warnings[1] and "did you mean ANSWER_CALIBRATION?" in warnings[1]
    assert "secret" not in result.stderr  # a token variable a source names is nobody's business, nor its value
