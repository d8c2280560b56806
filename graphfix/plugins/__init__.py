"""The TensorRT plugins seen from Python: their node contracts, build, and reference lowering."""
