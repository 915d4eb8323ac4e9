"""How the bench report writes numbers, durations and sampling rows: "-" for what was not measured (None,
NaN), fixed digits otherwise."""

from __future__ import annotations

import math
from typing import Any

from exactspec.bench.methods import SamplingRow
from exactspec.bench.summary_records import SettingRow
from exactspec.bench.theory import Spread


def is_nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def nan_to(x: Any, default: float = 0.0) -> float:
    return default if is_nan(x) else float(x)


def num(x: Any, digits: int = 2) -> str:
    return "-" if is_nan(x) else f"{x:.{digits}f}"


def percent(x: Any) -> str:
    return "-" if is_nan(x) else f"{100 * x:.1f}%"


def millis(seconds: Any) -> str:
    return "-" if is_nan(seconds) else f"{1000 * seconds:.1f} ms"


def overhead_text(row: SettingRow) -> str:
    """`3.5% (45 ms/round)`: share of engine time outside the forwards' callers, and its cost per round."""
    per_round = row.overhead_ms_per_round
    suffix = "" if is_nan(per_round) else f" ({per_round:.0f} ms/round)"
    return percent(row.overhead_fraction) + suffix


def spread_text(spread: Spread) -> str:
    if is_nan(spread.median):
        return "-"
    return f"{spread.median:.2f} [{spread.low:.2f}, {spread.high:.2f}]"


def count_text(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def duration_text(seconds: Any) -> str:
    if is_nan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def setting_title(sampling: SamplingRow) -> str:
    """`T=0`, `T=0.7`, or a named row with its settings: `realistic (T=0.7 top_k=20 top_p=0.8 rep=1.05)`."""
    name = sampling.name
    if name == f"{sampling.settings.temperature:g}":
        return f"T={name}"
    return f"{name} ({sampling.settings.describe()})"


def name_title(name: str) -> str:
    """A sampling row's name as a reader wants it: `T=0` for a temperature, the name otherwise."""
    try:
        float(name)
    except ValueError:
        return name
    return f"T={name}"
