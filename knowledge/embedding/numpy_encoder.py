"""A BERT sentence encoder in NumPy, so a CLI command can embed a question in milliseconds instead of seconds.

Importing sentence-transformers pulls in torch, transformers, scikit-learn and SciPy: about eight seconds on this
project's 2-core machine, against 7 ms for the search itself. For the plain BERT models sentence-transformers
serves with mean pooling and normalisation (all-MiniLM-L6-v2, the default, is one), the forward pass is a few
matrix products, so this module runs it with NumPy, the Rust `tokenizers` library and `safetensors`, loading the
same weights and tokenizer files. Its vectors match sentence-transformers' to float32 rounding (a test holds
them to a cosine of 0.99999); any other model goes through sentence-transformers as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

_EXPECTED_MODULES = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]


def supports(path: str | Path) -> bool:
    """True for a local sentence-transformers folder holding a BERT encoder with mean pooling + normalisation."""
    folder = Path(path)
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    )
    return (
        [m.get("type") for m in modules] == _EXPECTED_MODULES
        and config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and bool(mean_only)
        and (folder / "tokenizer.json").is_file()
        and (folder / "model.safetensors").is_file()
    )


def _gelu(h: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, in place: h·Φ(h). erf comes from Abramowitz & Stegun 7.1.26 (error below 1.5e-7, under
    float32 resolution), so no SciPy import is needed."""
    a = np.abs(h)
    a *= np.float32(1.0 / np.sqrt(2.0))
    t = a * np.float32(0.3275911)
    t += 1.0
    np.reciprocal(t, out=t)
    y = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        y += np.float32(coefficient)
        y *= t
    a *= a
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a  # 1 - erf(|h|/√2)
    y *= 0.5
    phi = np.where(h >= 0, 1.0 - y, y)  # Φ(h)
    h *= phi
    return h


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    normed: np.ndarray = (x - mean) / np.sqrt(var + eps) * weight + bias
    return normed


class BertTextEncoder:
    """What the two question encoders share (this one and `knowledge.embedding.onnx_encoder`): the model's tokenizer, token
    counts, and texts of similar length batched and padded together. A subclass runs the transformer on a batch
    (`_embed_batch`: token ids and attention mask → unit-length vectors)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer  # lazy: only once an encoder is built

        folder = Path(path)
        self.config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        st_config_path = folder / "sentence_bert_config.json"
        st_config = json.loads(st_config_path.read_text(encoding="utf-8")) if st_config_path.is_file() else {}
        self.max_seq_length = int(st_config.get("max_seq_length") or self.config.get("max_position_embeddings", 512))
        self.dimension = int(self.config["hidden_size"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._truncating = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._truncating.no_padding()
        self._truncating.enable_truncation(self.max_seq_length)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text without special tokens or truncation (how chunk sizes are measured)."""
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Unit-length embeddings, one row per text. Texts of similar length are batched together."""
        encodings = self._truncating.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            length = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), length), dtype=np.int64)
            mask = np.zeros((len(batch), length), dtype=np.int64)
            for row, i in enumerate(batch):
                tokens = encodings[i].ids
                ids[row, : len(tokens)] = tokens
                mask[row, : len(tokens)] = 1
            out[batch] = self._embed_batch(ids, mask)
        return out

    def _embed_batch(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, normalised to unit length (sentence-transformers' Pooling + Normalize)."""
    weights = mask[:, :, None].astype(np.float32)
    pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    unit: np.ndarray = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return unit


class NumpyBertEncoder(BertTextEncoder):
    """Tokenise, run the BERT layers, mean-pool over real tokens, normalise: what sentence-transformers does."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.heads = int(self.config["num_attention_heads"])
        self.layers = int(self.config["num_hidden_layers"])
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))
        self._weights_file = Path(path) / "model.safetensors"

    @cached_property
    def weights(self) -> dict[str, np.ndarray]:
        """Loaded on the first encode: a process whose questions go through ONNX Runtime only counts tokens here."""
        from safetensors.numpy import load_file  # lazy: see the docstring

        weights = {}
        for key, value in load_file(str(self._weights_file)).items():
            value = value.astype(np.float32)
            # Dense weights transposed once, contiguous, so every product is a plain BLAS call.
            weights[key.removeprefix("bert.")] = np.ascontiguousarray(value.T) if key.endswith("dense.weight") or ".self." in key and key.endswith(".weight") else value
        return weights

    def _embed_batch(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._forward(ids, mask.astype(np.float32))

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self.weights
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][0][None, None, :]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        head_dim = self.dimension // self.heads
        # Padding positions get a large negative score, so softmax gives them no weight.
        attention_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(head_dim))

        def split(t: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(t.reshape(batch, length, self.heads, head_dim).transpose(0, 2, 1, 3))

        for n in range(self.layers):
            p = f"encoder.layer.{n}."

            def dense(t: np.ndarray, name: str) -> np.ndarray:
                flat = t.reshape(-1, t.shape[-1]) @ w[p + name + ".weight"] + w[p + name + ".bias"]  # noqa: B023 (the closure runs within this iteration)
                shaped: np.ndarray = flat.reshape(batch, length, -1)
                return shaped

            q = split(dense(x, "attention.self.query"))
            k = split(dense(x, "attention.self.key"))
            v = split(dense(x, "attention.self.value"))
            scores = np.matmul(q, np.ascontiguousarray(k.transpose(0, 1, 3, 2))) * scale + attention_bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dimension)
            x = _layer_norm(
                x + dense(context, "attention.output.dense"),
                w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], self.eps,
            )
            hidden = dense(x, "intermediate.dense")
            hidden = _gelu(hidden)
            x = _layer_norm(
                x + dense(hidden, "output.dense"),
                w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps,
            )
        return mean_pooled(x, mask)
