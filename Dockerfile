# ragbot against an external Postgres with pgvector: docker run -e DATABASE_URL=postgresql://... -it ragbot
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1 RAGBOT_HOME=/data

WORKDIR /app
# The CPU build of torch, pinned, before anything that depends on it (an unpinned torch pulls CUDA wheels).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md alembic.ini ./
COPY alembic ./alembic
COPY db ./db
COPY knowledge ./knowledge
COPY bot ./bot
COPY examples ./examples
RUN pip install -e . && useradd --create-home ragbot && mkdir -p /data && chown ragbot /data
USER ragbot
VOLUME /data
# Slack events (HTTP mode), /healthz and /metrics.
EXPOSE 3000

ENTRYPOINT ["ragbot"]
CMD ["run"]
