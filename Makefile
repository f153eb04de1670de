# Two commands for a fresh machine: `make run` and `make test`. Everything else is set up on the way.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup chromium run test bench calibrate clean-db image image-base image-local image-test compose-config

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: this CPU build comes from the machine's wheel folder; an unpinned torch pulls CUDA (GBs).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The admin page's browser test drives Debian's chromium (Playwright with executable_path; never `playwright install`).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium chromium-driver)

setup: $(STAMP) chromium

run: setup
	$(BIN)/ragbot db upgrade
	$(BIN)/ragbot ingest examples/handbook --source handbook
	$(BIN)/ragbot run

# Tests run in TEST_WORKERS processes (pytest-xdist), each with its own embedded Postgres and model; a test file
# stays in one process (--dist loadfile), so module fixtures are built once. On 2 cores: about 9 minutes, against
# 15 in one process (much of a test's time is waiting on subprocesses, servers and Postgres, not on the CPU).
TEST_WORKERS ?= 2

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The quick set (< 5 minutes on 2 cores): search at 10k chunks, a small ingest, the Slack bot's overhead, ack and
# RSS (about a minute); then BENCHMARKS.md from the results.
# Larger sizes by flag: $(BIN)/python bench/search.py --chunks 10k,100k,1M (see BENCHMARKS.md).
bench: setup
	$(BIN)/python bench/search.py --chunks 10k --queries 100 --recall-queries 30
	$(BIN)/python bench/ingest.py --store-repeats 3
	$(BIN)/python bench/bot_bench.py
	$(BIN)/python bench/report.py

# Fit the answer / `uncertain` / decline decision on SQuAD 2.0 articles and report it on held-out ones
# (docs/answers.md); writes knowledge/answer/calibration.json. The evidence is cached in .ragbot/calibration
# (delete it, or pass ARGS=--refresh, after changing how evidence is computed). About 15 minutes on 2 cores.
CALIBRATION_DATA ?= ../shared/data/squad2-calibration
calibrate: setup
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
	@if command -v podman-compose >/dev/null; then podman-compose -f compose.yaml -f compose.local.yaml config >/dev/null; \
	elif docker compose version >/dev/null 2>&1; then docker compose -f compose.yaml -f compose.local.yaml config -q; \
	else echo "error: install podman-compose (pip install podman-compose) or Docker's compose plugin" >&2; exit 1; fi
	@echo "compose.yaml + compose.local.yaml: valid"
