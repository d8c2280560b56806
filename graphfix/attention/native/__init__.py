"""TensorRT-era fused attention nodes: ONNX `Attention` (opset 23/24), `TRT_Attention`,
`TRT_QuantizedAttention` (and `TRT_KVCacheUpdate`, listed only).

forms.py reads a node into its typed semantics; lowering.py writes them as standard ops (the
reference validate runs and the chain strategies rewrite); to_plugin.py and to_iattention.py
are what fused_plugin and native_attention make of a node without decomposing it; decompose.py
applies one of them, or the lowering, to every node of a model.
"""
