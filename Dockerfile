# syntax=docker/dockerfile:1
# ragbot's image: the bots (`ragbot run`: Slack/Discord, /healthz, /metrics on PORT) and every CLI command.
#
#   make image                       # docker or podman, FROM python:3.11-slim
#   make image-local                 # FROM a Debian base built here from Debian's packages (no image registry)
#
# Where pip gets its packages (a company index, a TLS-intercepting proxy): two optional build secrets, read only
# during the RUN steps that install, never stored in a layer:
#   --secret id=pip_conf,src=pip.conf      a pip.conf ([global] index-url / extra-index-url / find-links / trusted-host)
#   --secret id=ca_bundle,src=ca.pem       the CA bundle pip must trust (your proxy's root CA included)
# A pip.conf naming file:// indexes needs those folders in the build: `podman build --volume /opt/pypi:/opt/pypi:ro`
# (docker: serve them over http instead). scripts/build_image.sh passes all of this from the host's own pip setup.
#
# torch: pinned (TORCH_VERSION), installed first, from the configured index, so that nothing pulls the multi-GB CUDA
# build on its own. PyPI's Linux x86_64 torch IS that CUDA build: point TORCH_INDEX_URL at a CPU wheel index
# (your mirror of one, or e.g. https://download.pytorch.org/whl/cpu) to get the ~200 MB CPU wheel instead.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    RAGBOT_HOME=/data HOME=/data HF_HOME=/data/.cache/huggingface \
    PATH=/opt/ragbot/bin:$PATH

# tini as PID 1 (signals reach ragbot, zombies are reaped). The Debian base built by scripts/build_base_image.sh
# has it already; python:3.11-slim gets it from Debian's packages.
RUN set -eu; \
    if ! command -v tini >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), "ragbot needs Python 3.11+"'; \
    python3 -m venv /opt/ragbot; \
    useradd --system --uid 10001 --user-group --home-dir /data --no-create-home --shell /usr/sbin/nologin ragbot; \
    mkdir -p /data && chown ragbot:ragbot /data && chmod 0750 /data

# Uses the pip.conf and CA bundle secrets when given (see the top of this file).
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=ca_bundle set -eu; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi; \
    pip install torch==${TORCH_VERSION} ${TORCH_INDEX_URL:+--index-url ${TORCH_INDEX_URL}}

# The dependencies as their own layer (changes to the code don't reinstall them); torch stays at the pinned version.
WORKDIR /app
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=ca_bundle set -eu; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi; \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt; \
    echo "torch==${TORCH_VERSION}" > /tmp/constraints.txt; \
    pip install -r /tmp/requirements.txt -c /tmp/constraints.txt; \
    rm /tmp/requirements.txt /tmp/constraints.txt

COPY README.md alembic.ini ./
COPY alembic ./alembic
COPY db ./db
COPY knowledge ./knowledge
COPY bot ./bot
COPY examples ./examples
COPY scripts/container_entrypoint.sh /usr/local/bin/ragbot-entrypoint
# Editable: the migrations are read from /app/alembic next to the code. No dependency is fetched here.
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=ca_bundle set -eu; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi; \
    pip install --no-deps -e . && ragbot --help >/dev/null

# Everything ragbot writes (the embedded database, the ONNX question encoder, caches) is under /data: the root file
# system can be mounted read-only (docker run --read-only --tmpfs /tmp; podman run --read-only).
# No chat token set: `ragbot run` serves /healthz, /metrics and the scheduler (no terminal chat on a closed stdin).
ENV TERMINAL_CHAT=false
USER ragbot
VOLUME /data
# Slack events (HTTP mode), /healthz and /metrics.
EXPOSE 3000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '3000'), timeout=4)"]

ENTRYPOINT ["/usr/bin/tini", "--", "ragbot-entrypoint"]
CMD ["run"]
