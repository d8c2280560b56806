"""TensorRT-era fused attention nodes: ONNX `Attention` (opset 23/24), `TRT_Attention`,
`TRT_QuantizedAttention` (and `TRT_KVCacheUpdate`, listed only): reading them (forms.py) and
lowering them to the explicit chain of standard ops (lowering.py, decompose.py)."""
