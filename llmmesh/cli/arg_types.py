"""Value types of the command line's options, shared by its commands."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive_number(what: str = "number") -> Callable[[str], float]:
    """An argparse ``type``: a finite number above 0, else refused as "expected
    a positive ``what``"."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}")
        return value

    return parse
