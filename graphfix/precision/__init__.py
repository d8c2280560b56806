"""Precision surgery: float16/bfloat16 conversion, norm fusion, and `graphfix locate`."""
