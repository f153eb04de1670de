# Two commands for a fresh machine: `make run` and `make test`. Everything else is set up on the way.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup chromium run test bench clean-db

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

test: setup
	$(BIN)/python -m pytest -q

# The quick set (< 5 minutes on 2 cores): search at 10k chunks, a small ingest, the Slack bot's overhead, ack and
# RSS (about a minute); then BENCHMARKS.md from the results.
# Larger sizes by flag: $(BIN)/python bench/search.py --chunks 10k,100k,1M (see BENCHMARKS.md).
bench: setup
	$(BIN)/python bench/search.py --chunks 10k --queries 100 --recall-queries 30
	$(BIN)/python bench/ingest.py --store-repeats 3
	$(BIN)/python bench/bot.py
	$(BIN)/python bench/report.py

clean-db:
	-$(BIN)/ragbot db stop
