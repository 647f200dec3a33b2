"""Small statistics shared by timing, fitting, bench tables and benchmarks: percentiles, geometric
means, a row's time in each call mode, and the one noise margin by which a variant must beat the
baseline."""
from __future__ import annotations

import math
from dataclasses import dataclass


MODES = ("graph", "eager")  # how a call is made: replayed in a captured CUDA graph, or launched eagerly


@dataclass(frozen=True)
class Timed:
    """One row's time in one call mode (what `beats` / `slower` compare)."""

    median_us: float
    p10_us: float | None
    p90_us: float | None


def timed(r, mode: str, guarded: bool = False):
    """Row r's time in `mode`: graph = the routing latency (graph replay, or events where the row could
    not be captured); eager = host + device time of a synchronised eager call. None: not timed so.
    `guarded`: for a guarded library baseline (its row times the engine's own call), the guarded
    call's times, which the tuner records beside them (metrics "guarded"); other rows as they are."""
    if r is None or not r.passed:
        return None
    g = (r.metrics or {}).get("guarded") if guarded else None
    if g is not None:
        if mode == "graph":
            return Timed(g["median_us"], g["p10_us"], g["p90_us"])
        return None if g.get("eager_us") is None else Timed(g["eager_us"], g["eager_p10_us"], g["eager_p90_us"])
    if mode == "graph":
        return r
    if r.eager_us is None:
        return None
    return Timed(r.eager_us, r.eager_p10_us, r.eager_p90_us)


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated q-quantile (q in [0, 1]); NaN for no data."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def geomean(xs) -> float | None:
    """Geometric mean of positive numbers; None for none."""
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def half_width(r) -> float:
    """Half the 10-90 percentile spread of a timed row (p10_us, p90_us), 0 when unknown."""
    if r.p10_us is None or r.p90_us is None:
        return 0.0
    return max(0.0, (r.p90_us - r.p10_us) / 2)


def noise_margin(r, b, min_gain: float) -> float:
    """How much faster than baseline row b a row r must be to count as faster: the two rows'
    half spreads, and at least `min_gain` of the baseline's time (run-to-run drift that one
    measurement's spread does not show)."""
    return max(half_width(r) + half_width(b), min_gain * b.median_us)


def separated(fast, slow) -> bool:
    """Do the two rows' 10-90 ranges not overlap, `fast` entirely below `slow`? (A long tail on one
    side, e.g. a host-synchronising reference timed eagerly, widens the spread without making the
    comparison any less clear.)"""
    return None not in (fast.p90_us, slow.p10_us) and fast.p90_us < slow.p10_us


def beats(r, b, min_gain: float) -> bool:
    """Is row r faster than baseline row b beyond the noise margin, or with the two 10-90 ranges
    apart (and by `min_gain`)?"""
    return (r.median_us + noise_margin(r, b, min_gain) < b.median_us
            or (separated(r, b) and r.median_us + min_gain * b.median_us < b.median_us))


def slower(r, b, min_gain: float) -> bool:
    """Is row r slower than baseline row b beyond the noise margin, or with the two 10-90 ranges
    apart (and by `min_gain`)?"""
    return (r.median_us > b.median_us + noise_margin(r, b, min_gain)
            or (separated(b, r) and r.median_us > b.median_us * (1 + min_gain)))
