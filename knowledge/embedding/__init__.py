"""The sentence encoder: documents in batches (sentence-transformers), questions one at a time (NumPy or ONNX)."""
