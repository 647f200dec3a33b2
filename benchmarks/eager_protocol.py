"""The eager-time protocols side by side, on the GPU machine: for each shape, the routed op, the
variant its eager router picks (called directly) and every other registered variant of the
definition, timed (a) one after another, 50 single synchronised calls each on rotated input sets
(the tuner's protocol before 2026-11-29), (b) in turns (`timing.eager_rounds_us`, the tuner's now),
and (c) in turns with Python's garbage collector off; three alternating repetitions, medians of
each. The routed op's eager time over its choice's direct call is what dispatch costs an eager
call; (a) against (b) says what each protocol makes of it, (c) whether collections landing on the
next call explain the rest; `--parts` adds the op's dispatch alone (up to the variant call) and an
empty call (the protocol's floor: two synchronisations and a Python call).

    python benchmarks/eager_protocol.py gdn_decode --shape batch_size=12 --shape batch_size=40 \\
        [--only VARIANT ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import arch, definitions, registry  # noqa: E402
from kdispatch.tuner import timing  # noqa: E402
from kdispatch.tuner.job import resolve_fn  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

CALLS = 50
REPEATS = 3


def _shape(text: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}


def _sequential(fns: dict, sets: list) -> dict:
    return {n: statistics.median(timing.eager_times_us(fn, sets, CALLS)) for n, fn in fns.items()}


def _turns(fns: dict, sets: list, gc_off: bool = False) -> dict:
    if gc_off:
        gc.disable()
    try:
        times = timing.eager_rounds_us(fns, sets, CALLS)
    finally:
        gc.enable()
    return {n: statistics.median(x) for n, x in times.items()}


def _dispatch_only(op):
    """What `Dispatcher.__call__` does on a cached signature before it calls the variant."""
    from kdispatch.dispatch import _is_compiling, capturing

    def run(*args):
        _is_compiling()
        if op._per_call is not None:
            op._per_call(args)
        ts = op._tensors(args)
        e = op._last
        if e is None or not e.guard(*ts):
            raise RuntimeError("the signature is not the cached one")
        return e.eager_fn is None or capturing()
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("definition")
    ap.add_argument("--shape", action="append", required=True, help="axis=value,... (the definition's variable axes)")
    ap.add_argument("--only", nargs="*", help="variants beside the routed op and its choice (default: all runnable)")
    ap.add_argument("--parts", action="store_true", help="also the op's dispatch without the variant call, and an empty call")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    name = definitions.resolve_name(opts.definition)
    registry.discover()
    here = arch.arch_of(torch.device("cuda"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    op = resolve_fn(name, "routed")
    out = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
           "definition": name, "calls": CALLS, "repeats": REPEATS, "rows": []}
    print(f"# benchmarks/eager_protocol.py on {out['device']}, {out['date']}: eager us per call (median of "
          f"{REPEATS} repetitions of {CALLS} calls each); seq = one variant after another, turns = call by call, "
          "turns-gc = turns with the garbage collector off")
    for text in opts.shape:
        axes = _shape(text)
        args = list(materialize(name, SimpleWorkload(axes, uuid=f"protocol-{text}"), device="cuda", seed=0))
        sets = timing.input_sets(name, args, l2)
        check = op.checker.check(args)
        choice = op.choose(here, check, "eager").name
        names = ([v.name for v in registry.variants(name) if v.why_not(here) is None and v.name != registry.REFERENCE
                  and v.declines(check) is None] if opts.only is None else opts.only)
        fns = {"routed": op, f"{choice} (direct)": registry.get(name, choice).fn}
        if opts.parts:  # the op's hot path up to the variant call, and an empty call: the floor of the protocol
            fns["op without the variant call"] = _dispatch_only(op)
            fns["empty call"] = lambda *a: None
        fns.update({v: registry.get(name, v).fn for v in names if v != choice})
        op(*sets[0])  # a first tensor's shape seen once is a one-off decision; seen again, cached
        for fn in fns.values():  # first calls (compiles) outside every timer
            fn(*sets[0])
        torch.cuda.synchronize()
        runs = {"seq": [], "turns": [], "turns-gc": []}
        for _ in range(REPEATS):
            runs["seq"].append(_sequential(fns, sets))
            runs["turns"].append(_turns(fns, sets))
            runs["turns-gc"].append(_turns(fns, sets, gc_off=True))
        table = {p: {n: round(statistics.median(r[n] for r in rs), 2) for n in fns} for p, rs in runs.items()}
        out["rows"].append({"axes": axes, "eager_choice": choice, "us": table})
        print(f"\n{name} {text}: eager router -> {choice}")
        print(f"  {'':40s} " + " ".join(f"{p:>9s}" for p in runs))
        for n in fns:
            print(f"  {n:40s} " + " ".join(f"{table[p][n]:9.2f}" for p in runs))
        for p in runs:
            print(f"  dispatch over the direct call, {p}: {table[p]['routed'] - table[p][f'{choice} (direct)']:+.2f} us")
    if opts.json:
        opts.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
