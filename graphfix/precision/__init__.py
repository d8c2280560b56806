"""Precision surgery: float16/bfloat16 conversion with float32 islands, norm fusion."""
