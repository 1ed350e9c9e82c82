"""A given value and where it came from: what every source produces and `from_settings` reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One given value and where it came from (`--policy-arg fast_weight`, `FAIRWAY_PROTECT`)."""

    key: str
    value: Any
    source: str


def parse_value(raw: str) -> Any:
    """A value given as text (flag or variable): a JSON scalar (4, 0.5, true, null) or the text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw
