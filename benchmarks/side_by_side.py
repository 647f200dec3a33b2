"""One shape of a side-by-side benchmark: every candidate through the correctness gate (against the
reference, kdispatch.tuner.gate), then timed in a CUDA graph and eagerly (kdispatch.tuner.timing)."""
from __future__ import annotations

from kdispatch.tuner import gate, timing


def gated_times(definition: str, cands: dict, args) -> dict[str, dict]:
    """{label: {"graph_us", "eager_us"} or {"status", "reason"} where the gate failed} for `cands`
    ({label: callable}) on the call `args`."""
    trials = [(args, gate.reference(definition, args))]
    row = {}
    for label, fn in cands.items():
        verdict = gate.run_gate(definition, fn, trials)
        if not verdict.passed:
            row[label] = {"status": verdict.status, "reason": verdict.reason}
            continue
        t = timing.measure(definition, fn, args)
        row[label] = {"graph_us": t.median_us, "eager_us": t.eager_us}
    return row
