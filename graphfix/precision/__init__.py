"""Precision surgery: norm fusion (norms.py); float16/bfloat16 conversion lives beside it."""
