"""`graphfix locate`: where a model diverges in lower precision, and the cheapest graph fix."""

from graphfix.precision.locate.api import locate
from graphfix.precision.locate.localise import Suspect, TensorError
from graphfix.precision.locate.remedies import Remedy, RemedyKind, Trial
from graphfix.precision.locate.report import FixedModel, LocateReport

__all__ = [
    "FixedModel",
    "LocateReport",
    "Remedy",
    "RemedyKind",
    "Suspect",
    "TensorError",
    "Trial",
    "locate",
]
