"""CLI options declared once, each mapped onto the API keyword it sets."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One command-line flag and the API keyword argument it feeds."""

    flags: tuple[str, ...]
    api: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    convert: Callable[[Any], Any] | None = None


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for option in options:
        parser.add_argument(*option.flags, dest=option.api, help=option.help, **option.kwargs)


def api_kwargs(args: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    """The API keyword arguments the parsed options stand for (None means default)."""
    result: dict[str, Any] = {}
    for option in options:
        value = getattr(args, option.api)
        if value is not None and option.convert is not None:
            value = option.convert(value)
        result[option.api] = value
    return result


def print_json(report: Any, **fields: object) -> None:
    """`--json`'s one document on stdout: `report.to_dict()` with `fields` added (a path as its
    text, None as null)."""
    document = report.to_dict()
    document.update({k: None if v is None else str(v) for k, v in fields.items()})
    print(json.dumps(document, indent=2))
