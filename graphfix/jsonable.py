"""`plain`: the JSON-ready copy of a report record that `to_dict` methods return."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from graphfix.graph.index import BoundNode


def plain(value):
    """Dataclasses as dicts of their fields (a record with its own `to_dict`: what that returns),
    a bound graph node as its name, tuples and lists as lists, mappings with text keys, str enums
    as their values, bytes as text, inf/NaN as text (JSON has no such numbers); anything else as is."""
    if isinstance(value, BoundNode):
        return value.name
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return plain(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):  # a STRING attribute: text where it decodes, else escaped
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "value") and isinstance(value.value, str):  # str enums
        return value.value
    return value
