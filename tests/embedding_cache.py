"""Test-only: sentence-transformers' vectors kept on disk, so that a text the suite embedded once costs no model time.

The tests ingest the same example corpora many times over, each into a fresh database (whose own `embedding_cache`
table starts empty), and every pytest worker paid torch's import and the model's load for it. `install()` (called
by tests/conftest.py) replaces `Embedder.model` in the tests' own process with `CachedModel`, which answers
`encode(texts, normalize_embeddings=True)` from files under the cache folder, one per text, and loads the real model
only for the texts it has not seen (the vectors stored are that model's own output, so tests see the model's
vectors; batch-to-batch float noise of about 1e-7 aside). Everything else (tokenizer, max_seq_length...) is the real
model's, loaded on first use. `ragbot` subprocesses are untouched. The key is the model's name, its folder, its
weights' size and modification time, and the text, so another model or new weights never reuse a vector.

RAGBOT_TEST_EMBEDDING_CACHE picks the folder (default: ~/.cache/ragbot-tests/embeddings, kept between runs);
"off" turns the cache off (the suite then loads the model as the product does).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from knowledge.embedding.encoder import Embedder

SETTING = "RAGBOT_TEST_EMBEDDING_CACHE"
_REAL_MODEL = Embedder.__dict__["model"]  # the product's cached_property


def cache_folder() -> Path | None:
    value = os.environ.get(SETTING, "")
    if value.lower() == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "ragbot-tests" / "embeddings"


def _weights_fingerprint(path: str) -> str:
    folder = Path(path)
    parts = []
    for name in ("model.safetensors", "pytorch_model.bin", "config.json"):
        file = folder / name
        if file.exists():
            stat = file.stat()
            parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
    return ";".join(parts)


class CachedModel:
    """Stands in for the SentenceTransformer an Embedder holds: `encode` through the on-disk cache, the rest the
    real model's."""

    def __init__(self, embedder: Embedder, folder: Path) -> None:
        self._embedder = embedder
        self._folder = folder
        self._prefix = f"{embedder.name}\0{embedder.path}\0{_weights_fingerprint(embedder.path)}\0"
        # What loading the real model resolves on the Embedder (its device: torch's import) is resolved now, so that
        # the Embedder looks the same whether a cache miss loads the weights later or never: tests check that
        # nothing is left to load once `model` was asked for (tests/test_bot_core.py).
        _ = embedder.device
        self.misses = 0

    @cached_property
    def _real(self) -> Any:
        return _REAL_MODEL.func(self._embedder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _file(self, text: str) -> Path:
        key = hashlib.sha256((self._prefix + text).encode("utf-8")).hexdigest()
        return self._folder / key[:2] / f"{key}.npy"

    def encode(self, sentences: Sequence[str] | str, *args: Any, normalize_embeddings: bool = False,
               **kwargs: Any) -> Any:
        if isinstance(sentences, str) or not normalize_embeddings or args or kwargs.get("convert_to_tensor"):
            return self._real.encode(sentences, *args, normalize_embeddings=normalize_embeddings, **kwargs)
        texts = list(sentences)
        found: dict[int, np.ndarray] = {}
        for i, text in enumerate(texts):
            try:
                found[i] = np.load(self._file(text))
            except (OSError, ValueError):
                pass
        missing = [i for i in range(len(texts)) if i not in found]
        if missing:
            self.misses += len(missing)
            vectors = self._real.encode([texts[i] for i in missing], normalize_embeddings=True, **kwargs)
            for i, vector in zip(missing, vectors, strict=True):
                found[i] = vector
                self._store(texts[i], vector)
        if not texts:
            return self._real.encode(texts, normalize_embeddings=True, **kwargs)
        return np.stack([found[i] for i in range(len(texts))])

    def _store(self, text: str, vector: np.ndarray) -> None:
        """Written under a temporary name and renamed: a worker reading at the same time sees all or nothing."""
        path = self._file(text)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            np.save(out, np.asarray(vector, dtype=np.float32))
        os.replace(temporary, path)


def install() -> Path | None:
    """Route Embedder.model through the cache in this process (unless RAGBOT_TEST_EMBEDDING_CACHE=off)."""
    folder = cache_folder()
    if folder is None:
        return None

    def model(self: Embedder) -> Any:
        return CachedModel(self, folder)

    cached = cached_property(model)
    cached.__set_name__(Embedder, "model")
    Embedder.model = cached  # type: ignore[assignment,method-assign]
    return folder
