# Two commands for a fresh machine: `make run` and `make test`. Everything else is set up on the way.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs, two stamps: `make run` installs what running needs (no root, no browser, no dev tools); `make test`
# adds the dev extras (pytest, mypy, ruff, playwright, scipy...) on top.
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup setup-run setup-test chromium test-tools run test test-fast bench calibrate clean-db image image-base \
	image-local image-test compose-config

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: this CPU build comes from the machine's wheel folder; an unpinned torch pulls CUDA (GBs).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(TEST_STAMP)

# The admin page's browser test drives Debian's chromium (Playwright with executable_path; never `playwright install`).
# Installed only by `make test`, only as root with apt; otherwise one line says how, and that test reports itself
# skipped (pytest's summary) while the rest runs.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update && apt-get install -y chromium chromium-driver; \
	else echo "note: no chromium, so the admin page's browser test is skipped; to run it: sudo apt-get install chromium"; fi

setup-run: $(RUN_STAMP)
setup-test: $(TEST_STAMP) chromium
setup: setup-test

# --- Tools only the tests use (issue 43): PgBouncer for tests/test_pooler.py. Installed when root with apt; without
# it those tests skip with a one-line reason. (The standby tests need nothing more: the embedded server's binaries.)
test-tools:
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y pgbouncer; } || \
		echo "pgbouncer not installed (needs root and apt): tests/test_pooler.py will skip"

run: setup-run
	$(BIN)/ragbot db upgrade
	$(BIN)/ragbot ingest examples/handbook --source handbook
	$(BIN)/ragbot run

# Tests run in TEST_WORKERS processes (pytest-xdist) sharing one embedded Postgres (a database per worker) and a
# file stays in one process (--dist loadfile), so module fixtures are built once. Three workers on two cores: the
# tests mostly wait (servers, subprocesses, leases). The migrated template and the ingested handbook are built once
# per run and cloned by every worker; sentence-transformers' vectors are cached on disk across tests and runs
# (~/.cache/ragbot-tests/embeddings; docs/development.md). Measured (issue 41 item 10), CPU seconds user + sys of
# `/usr/bin/time -v nice -n 10 .venv/bin/python -m pytest -n 3 --dist loadfile -q -p no:cacheprovider -p
# tests.cpu_report` (2 cores, 2026-11-28; wall clock follows the machine's load, CPU is what a loaded machine pays):
#   before: 784 s (13.1 CPU-min) + 170 s in Postgres, 33 min 36 s wall at load 11-14 (other suites running);
#   after, cold embedding cache: 601 s (10.0 CPU-min) + 200 s in Postgres, 11 min 03 s wall at load 2-7.
# A warm cache saves most of the rest of the model time: tests/test_first_run.py took 109 s in the suite before, 80 s
# after (cold); alone with a warm cache, the server's start and the handbook's build included, 35 s. Per file:
# `-p tests.cpu_report` prints CPU and wall seconds per test file.
# Whole `make test` (ruff, mypy, pytest; warm caches; `/usr/bin/time -v`; a busy loop holding one of the two cores for
# the whole run, the machine otherwise idle): c4958a0, 687 tests, 10 min 1 s wall; d232a9e, 693 tests, 7 min 31 s wall
# (334 s user + 42 s sys). Between them: a `ragbot run` that cannot start no longer loads the model, in-process CLI
# commands parse in a thread, and one torch/BLAS thread per test process (tests/conftest.py: on a loaded machine the
# thread pools spin; test_retrieval.py + test_insights_clustering.py at load 5 went from 62 to 20 CPU-s).
TEST_WORKERS ?= 3

test: setup-test test-tools
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The quick tier for development: the flow and unit tests, no servers or subprocesses (tests marked `slow` are left
# out; see docs/development.md). One process: 199 tests, 27 s CPU, 35 s wall (`/usr/bin/time`, d232a9e,
# idle; 2 min 08 s at load 6-7 with a whole suite running beside it).
test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The quick set (< 5 minutes on 2 cores): search at 10k chunks, a small ingest, the Slack bot's overhead, ack and
# RSS (about a minute); then BENCHMARKS.md from the results.
# Larger sizes by flag: $(BIN)/python bench/search.py --chunks 10k,100k,1M (see BENCHMARKS.md).
bench: setup-test
	$(BIN)/python bench/search.py --chunks 10k --queries 100 --recall-queries 30
	$(BIN)/python bench/ingest.py --store-repeats 3
	$(BIN)/python bench/bot_bench.py
	$(BIN)/python bench/report.py

# Fit the answer / `uncertain` / decline decision on SQuAD 2.0 articles and report it on held-out ones
# (docs/answers.md); writes knowledge/answer/calibration.json. The evidence is cached in .ragbot/calibration
# (delete it, or pass ARGS=--refresh, after changing how evidence is computed). About 15 minutes on 2 cores.
CALIBRATION_DATA ?= ../shared/data/squad2-calibration
calibrate: setup-run
	$(BIN)/python scripts/calibrate.py --data $(CALIBRATION_DATA) $(ARGS)

clean-db:
	-$(BIN)/ragbot db stop

# --- Container images (docs/operations.md). Not part of `make test`. -----------------------------------------------
# `make image`: ./Dockerfile with docker or podman, FROM python:3.11-slim (BASE_IMAGE=... for another base).
image:
	scripts/build_image.sh

# No image registry (this machine): a Debian base from Debian's packages (mmdebstrap), then both images on it, pip
# inside the builds using this machine's package index and CA bundle (build secrets; HOST_PIP=1).
LOCAL_BASE ?= localhost/ragbot-base:bookworm
image-base:
	scripts/build_base_image.sh

image-local: image-base
	BASE_IMAGE=$(LOCAL_BASE) HOST_PIP=1 TAG=ragbot:local scripts/build_image.sh
	BASE_IMAGE=$(LOCAL_BASE) HOST_PIP=1 TAG=ragbot-postgres:local DOCKERFILE=Dockerfile.postgres scripts/build_image.sh

# The images' smoke test (embedded database; external Postgres; backup and restore). Build them first.
image-test:
	tests/image/smoke.sh

compose-config:
	@if command -v podman-compose >/dev/null; then podman-compose -f compose.yaml -f compose.local.yaml config >/dev/null \
		&& podman-compose -f compose.scale.yaml config >/dev/null; \
	elif docker compose version >/dev/null 2>&1; then docker compose -f compose.yaml -f compose.local.yaml config -q \
		&& docker compose -f compose.scale.yaml config -q; \
	else echo "error: install podman-compose (pip install podman-compose) or Docker's compose plugin" >&2; exit 1; fi
	@echo "compose.yaml + compose.local.yaml: valid"

# --- Microsoft Teams (teams) ---------------------------------------------------------------------------------------
# `make teams-app`: the app package to side-load in Teams (docs/teams.md): teams-manifest/ with TEAMS_APP_ID (the
# Azure Bot's Microsoft App ID, from the environment or .env) filled in, zipped into build/ragbot-teams.zip.
# Redraw the icons with `python scripts/teams_icons.py`.
.PHONY: teams-app
TEAMS_APP_ID ?= $(shell sed -n 's/^TEAMS_APP_ID=//p' .env 2>/dev/null)
TEAMS_APP_ZIP := build/ragbot-teams.zip

teams-app:
	@test -n "$(TEAMS_APP_ID)" || { echo "error: set TEAMS_APP_ID (the Azure Bot's Microsoft App ID) in .env or the environment" >&2; exit 1; }
	@rm -rf build/teams-app && mkdir -p build/teams-app
	sed 's/{{TEAMS_APP_ID}}/$(TEAMS_APP_ID)/g' teams-manifest/manifest.json > build/teams-app/manifest.json
	cp teams-manifest/color.png teams-manifest/outline.png build/teams-app/
	rm -f $(TEAMS_APP_ZIP) && cd build/teams-app && $(PYTHON) -m zipfile -c ../ragbot-teams.zip manifest.json color.png outline.png
	@echo "$(TEAMS_APP_ZIP): upload it in Teams (Apps → Manage your apps → Upload an app)"
