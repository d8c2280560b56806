"""The floating-point types graphfix commands compute in, one enum for all of them.

`graphfix precision --to`, `locate --precision` and the reports spell them long ("float16");
`validate --precision`, TensorRT's flags and the tolerance table spell them short ("fp16").  Both
spellings are accepted wherever a precision is given; inside, it is a `FloatType`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from graphfix.errors import UsageError


class FloatType(str, Enum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"

    @property
    def short(self) -> str:
        """TensorRT's and validate's spelling: fp32, fp16, bf16."""
        return _SHORT[self]

    @classmethod
    def parse(
        cls,
        value: str | FloatType,
        *,
        allowed: Iterable[FloatType] | None = None,
        option: str = "precision",
        error: type[UsageError] = UsageError,
    ) -> FloatType:
        """`value` in either spelling, or `error` listing what `option` allows."""
        choices = tuple(cls) if allowed is None else tuple(allowed)
        found = _BY_SPELLING.get(value.value if isinstance(value, FloatType) else str(value))
        if found is None or found not in choices:
            raise error(
                f"{option} {value!r} is not one of {', '.join(spellings(choices))}; leave it "
                "unset for the default"
            )
        return found


def spellings(types: Iterable[FloatType]) -> tuple[str, ...]:
    """Every accepted spelling of `types`, long ones first (a CLI option's choices)."""
    types = tuple(types)
    return (*(t.value for t in types), *(t.short for t in types))


_SHORT = {FloatType.FLOAT32: "fp32", FloatType.FLOAT16: "fp16", FloatType.BFLOAT16: "bf16"}
_BY_SPELLING = {**{t.value: t for t in FloatType}, **{s: t for t, s in _SHORT.items()}}
LOW_PRECISIONS = (FloatType.FLOAT16, FloatType.BFLOAT16)
