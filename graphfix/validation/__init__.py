"""Validation: inputs, running backends (onnxruntime, TensorRT), comparison statistics, plots."""
