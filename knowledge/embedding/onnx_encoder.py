"""The question encoder in ONNX Runtime: the configured model exported once to ONNX (optionally int8), cached.

A question is about a dozen tokens, and the NumPy encoder (`knowledge.embedding.numpy_encoder`) spends ~25 ms on it with one
core: the matrix products are too small for BLAS to run at full speed. ONNX Runtime runs the same BERT graph with
fused kernels about 2.5× faster with the same vectors (fp32, the default); its int8 kernels (integer dot products,
AVX-512 VNNI here) take another ~1.3–1.6× off, at the cost of slightly different vectors. The README's "Speed"
section has the measured figures and the retrieval and answer quality of each.

The ONNX file is made from the local weights with `torch.onnx.export`, so building it needs torch. That happens
only at a moment torch is loaded anyway (after an ingest or a sync, or when `ragbot run` starts), never because a
question was asked: until the file exists, questions go through the NumPy encoder. The files live under
RAGBOT_HOME/models/<model>-<weights hash>/, are written under a temporary name and renamed, and each carries a check
vector: a file that fails to load or no longer gives its check vector is rebuilt.

`onnxruntime`, `onnx` and torch are imported only inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from knowledge.embedding.numpy_encoder import BertTextEncoder, mean_pooled
from knowledge.errors import OnnxBuildError

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8")

# Encoded when a file is built, stored beside it, and encoded again when it is opened: a file that was damaged on
# disk, or built from other weights, gives a different vector.
CHECK_TEXT = "How many PTO days do I get in my first year?"
CHECK_MIN_COSINE = 0.9999
OPSET = 17


@dataclass(frozen=True)
class OnnxFiles:
    """Where the ONNX files of one model (identified by its weights) live."""

    folder: Path

    def model(self, precision: Precision) -> Path:
        return self.folder / ("model.onnx" if precision == "fp32" else "model.int8.onnx")

    def check(self, precision: Precision) -> Path:
        return self.model(precision).with_suffix(".check.json")


def files_for(model_path: str | Path, model_name: str, cache_root: Path) -> OnnxFiles:
    """The cache folder: the model's name plus a hash of its weights, so new weights never reuse an old export."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name).strip("_")[-60:] or "model"
    return OnnxFiles(cache_root / f"{slug}-{weights_hash(Path(model_path) / 'model.safetensors', cache_root)[:16]}")


def weights_hash(weights: Path, cache_root: Path) -> str:
    """SHA-256 of the weights file, remembered per (path, size, mtime) in cache_root so a process that asks one
    question does not read 90 MB to find its cache folder."""
    stat = weights.stat()
    key = f"{weights.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_path = cache_root / "weights-sha256.json"
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
        known = memo.get(key) if isinstance(memo, dict) else None
        if isinstance(known, str):
            return known
    except (OSError, ValueError):
        memo = {}
    digest = hashlib.sha256()
    with weights.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    value = digest.hexdigest()
    try:
        _write_atomically(memo_path, json.dumps({**memo, key: value}, indent=1).encode("utf-8"))
    except OSError:
        pass  # a read-only home only costs the hash again next time
    return value


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class OnnxBertEncoder(BertTextEncoder):
    """`NumpyBertEncoder`'s tokenizer and batching (their shared base class); the transformer runs in ONNX Runtime
    and the mean pooling + normalisation in NumPy."""

    def __init__(self, model_path: str | Path, onnx_file: Path, precision: Precision) -> None:
        import onnxruntime  # lazy for start-up speed: only when questions use ONNX
        onnxruntime.disable_telemetry_events()  # ONNX Runtime would report usage to Microsoft: nothing leaves

        super().__init__(model_path)
        self.precision = precision
        self.file = onnx_file
        options = onnxruntime.SessionOptions()
        # One thread: a question is too little work to share out, and on a busy machine extra threads spin waiting
        # for a core (see Embedder.embed).
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])

    def _embed_batch(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (hidden,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask})
        return mean_pooled(hidden, mask)


def open_encoder(model_path: str | Path, files: OnnxFiles, precision: Precision) -> OnnxBertEncoder | None:
    """The encoder from the cached file, or None when there is no file or it is damaged (then it is removed, so
    the next build replaces it). Never builds anything."""
    model_file, check_file = files.model(precision), files.check(precision)
    if not model_file.is_file():
        return None
    try:
        expected = np.asarray(json.loads(check_file.read_text(encoding="utf-8"))["vector"], dtype=np.float32)
        encoder = OnnxBertEncoder(model_path, model_file, precision)
        cosine = float(encoder.encode([CHECK_TEXT])[0] @ expected / max(float(np.linalg.norm(expected)), 1e-12))
        if cosine >= CHECK_MIN_COSINE:
            return encoder
        reason = f"its check vector differs (cosine {cosine:.5f})"
    except Exception as exc:  # a truncated or overwritten protobuf, a missing check file, an ORT error
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
    logger.warning("The cached ONNX question encoder %s is damaged (%s); it will be rebuilt", model_file, reason)
    for path in (model_file, check_file):
        path.unlink(missing_ok=True)
    return None


_build_lock = threading.Lock()


def build(model_path: str | Path, files: OnnxFiles, precision: Precision) -> Path:
    """Export the model to ONNX (fp32) and, for int8, quantise it; a no-op when a sound file is already there.

    Needs torch (only called where it is loaded anyway). Files are written under temporary names and renamed, so
    an interrupted build leaves no half file behind."""
    with _build_lock:
        if open_encoder(model_path, files, precision) is not None:
            return files.model(precision)
        started = time.perf_counter()
        logger.info("Building the ONNX %s question encoder in %s (once; a few seconds)", precision, files.folder)
        files.folder.mkdir(parents=True, exist_ok=True)
        fp32 = files.model("fp32")
        if open_encoder(model_path, files, "fp32") is None:
            temporary = _temporary(fp32)
            try:
                _export(model_path, temporary)
                _finish(model_path, files, "fp32", temporary)
            finally:
                temporary.unlink(missing_ok=True)
        if precision == "int8":
            temporary = _temporary(files.model("int8"))
            try:
                _quantize(fp32, temporary)
                _finish(model_path, files, "int8", temporary)
            finally:
                temporary.unlink(missing_ok=True)
        logger.info("ONNX %s question encoder ready in %.1f s", precision, time.perf_counter() - started)
        return files.model(precision)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp.onnx")


def _finish(model_path: str | Path, files: OnnxFiles, precision: Precision, temporary: Path) -> None:
    """Record the new file's check vector, then move the file into place (check first: a model file never sits
    there without its check)."""
    vector = OnnxBertEncoder(model_path, temporary, precision).encode([CHECK_TEXT])[0]
    _write_atomically(files.check(precision), json.dumps({"text": CHECK_TEXT, "vector": vector.tolist()}).encode())
    os.replace(temporary, files.model(precision))


def _export(model_path: str | Path, target: Path) -> None:
    """torch.onnx.export of the Hugging Face model: token ids and attention mask in, last hidden state out, batch
    and sequence length dynamic. The TorchScript exporter builds it in ~3 s on this machine against ~25 s for the
    torch.export-based one (same outputs); the latter is used when the former is unavailable."""
    import torch  # lazy: only to build the file, once
    from transformers import AutoModel  # lazy, as torch

    model = AutoModel.from_pretrained(str(model_path)).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden: torch.Tensor = self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return hidden

    wrapper = LastHiddenState(model).eval()
    example = (torch.ones(1, 8, dtype=torch.int64), torch.ones(1, 8, dtype=torch.int64))
    outputs = ["last_hidden_state"]
    inputs = ["input_ids", "attention_mask"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notices
        try:
            torch.onnx.export(
                wrapper, example, str(target), opset_version=OPSET, dynamo=False, input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: "batch", 1: "tokens"} for name in ("input_ids", "attention_mask", *outputs)},
            )
        except Exception as legacy_error:
            logger.info("TorchScript ONNX export failed (%s); trying the torch.export-based exporter", legacy_error)
            batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens", max=512)
            try:
                torch.onnx.export(
                    wrapper, example, str(target), dynamo=True, external_data=False, input_names=inputs,
                    output_names=outputs,
                    dynamic_shapes={"input_ids": {0: batch, 1: tokens}, "attention_mask": {0: batch, 1: tokens}},
                )
            except Exception as exc:
                raise OnnxBuildError(
                    f"Could not export {model_path} to ONNX ({exc}); set QUERY_ENCODER=numpy to skip ONNX"
                ) from exc


def _quantize(fp32: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the weight matrix products (signed int8 weights, one scale per output channel;
    activations quantised per product at run time). The feed-forward output products (the ones reading GELU
    outputs, whose outliers per-tensor activation scales handle worst) stay in fp32: on the handbook questions that
    lifts the cosine to fp32 vectors from a mean of 0.994 (min 0.987) to 0.997 (min 0.991) for ~1.3× the time."""
    import onnx  # lazy: only to build the file, once
    from onnxruntime.quantization import QuantType, quantize_dynamic  # lazy, as onnx

    model = onnx.load(str(fp32))
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    weighted = [n for n in model.graph.node if n.op_type == "MatMul" and len(shapes.get(n.input[1], [])) == 2]
    widest = max((shapes[node.input[1]][0] for node in weighted), default=0)  # the intermediate size, e.g. 1536
    keep_fp32 = [node.name for node in weighted if shapes[node.input[1]][0] == widest]
    del model
    root = logging.getLogger()
    quiet = _DropOnnxRuntimeRootRecords()
    root.addFilter(quiet)  # the quantiser logs a line per tensor through the root logger
    try:
        quantize_dynamic(
            str(fp32), str(target), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
            nodes_to_exclude=keep_fp32,
        )
    finally:
        root.removeFilter(quiet)


class _DropOnnxRuntimeRootRecords(logging.Filter):
    """Drops records that onnxruntime's quantiser logs straight to the root logger (logger filters apply only to
    records created on that logger, so everything else logged through the root is untouched)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname
