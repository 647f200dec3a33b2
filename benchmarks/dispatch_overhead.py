"""Host time that dispatch adds to a call, per operator, next to flashinfer_bench.apply.

For each operator the router is pointed at a no-op variant on meta tensors (shapes and dtypes,
no data), so the only time measured is dispatch itself:
    kdispatch   = time(kdispatch.ops.<op>(*args)) - time(noop(*args))
    fib.apply   = time(flashinfer_bench.apply(<definition>, args=args, fallback=noop)) - time(noop(*args))
    two modes   = the same with a router whose eager choice differs from its graph choice, so every
                  call asks whether the stream is capturing (dispatch.capturing) before choosing
    custom op   = time(torch.ops.kdispatch.<op>(*args)) - time(noop(*args)) on valid CPU inputs (the
                  noop returns preallocated outputs), the path of a compiled graph and of code that
                  calls the registered op itself (kdispatch.custom_ops)
    new shape   = a call whose shapes the dispatcher has not seen (validation, routing of both modes,
                  the guard), each call another size of NEW_SHAPE_AXIS: what an engine pays on most
                  prefill calls, whose token count changes from call to call
    hinted      = for an op with call-time hints (prefill's max_seq_len, which the engine plugins
                  pass): a call passing them, on a seen signature and on new shapes
FlashInfer-Bench is timed on its cheapest path (the dataset holds no solution, so it builds the
lookup key, misses and calls the fallback). Medians over repeated timing rounds, one process.

    python benchmarks/dispatch_overhead.py [--rounds 21] [--calls 2000] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import kdispatch
from kdispatch import custom_ops, definitions, registry
from kdispatch.registry import Variant
from kdispatch.workloads import SimpleWorkload, materialize, meta_arguments

SMALL = {
    "moe_fp8": {"seq_len": 4},
    "dsa_topk_indexer": {"batch_size": 4, "max_num_pages": 40, "num_pages": 4096},
    "dsa_sparse_attention": {"num_tokens": 4, "num_pages": 8462},
    "gdn_decode": {"batch_size": 8},
    "gdn_prefill": {"total_seq_len": 128, "num_seqs": 2, "len_cu_seqlens": 3},
}


NEW_SHAPE_AXIS = {"moe_fp8": "seq_len", "dsa_topk_indexer": "batch_size", "dsa_sparse_attention": "num_tokens",
                  "gdn_decode": "batch_size", "gdn_prefill": "total_seq_len"}


def new_shape_us(op_fn, op: str, calls: int) -> float:
    """Mean time of calls that each bring a shape the dispatcher has not seen."""
    axis = NEW_SHAPE_AXIS[op]
    argsets = [meta_arguments(op, {**SMALL[op], axis: SMALL[op][axis] + 1 + i}) for i in range(calls)]
    t0 = time.perf_counter()
    for args in argsets:
        op_fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def per_call_us(fn, args, calls: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def custom_op_added_us(d, axes, opts) -> float:
    """Host time torch.ops.kdispatch.<op> adds over a no-op variant (on CPU tensors: a custom op
    called with meta tensors runs its fake implementation instead)."""
    args = materialize(d.definition, SimpleWorkload(axes, uuid="overhead"), "cpu")
    defn = definitions.get(d.definition)
    made = iter(custom_ops.fake_outputs(defn)(*args) if len(custom_ops.returned_outputs(defn)) > 1
                else (custom_ops.fake_outputs(defn)(*args),))
    outs = tuple(args[defn.inputs.index(defn.spec.in_place[o])] if o in defn.spec.in_place else next(made)
                 for o in defn.outputs)
    noop = lambda *a: outs if len(outs) > 1 else outs[0]  # noqa: E731 - outputs no input aliases
    registry.register(Variant(d.definition, "noop_cpu", noop, "torch", ("cpu",)))
    d.set_router("cpu", lambda **axes: "noop_cpu")
    op = getattr(torch.ops.kdispatch, d.short)
    op(*args)
    try:
        return per_call_us(op, args, opts.calls, opts.rounds) - per_call_us(noop, args, opts.calls, opts.rounds)
    finally:
        d.set_router("cpu", None)
        registry.unregister(d.definition, "noop_cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()

    registry.discover()
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
              "date": datetime.date.today().isoformat(),
              "host": platform.processor() or platform.machine(), "python": platform.python_version(),
              "torch": torch.__version__, "ops": {}}
    try:
        from flashinfer_bench import apply as fib_apply
        from flashinfer_bench.apply import enable_apply

        tmp = Path(tempfile.mkdtemp())
        shutil.copytree(Path(definitions.__file__).parent, tmp / "definitions",
                        ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        fib_rt = enable_apply(str(tmp))
    except ImportError:
        fib_apply = fib_rt = None

    from kdispatch.dispatch import capturing

    result["capturing_call_us"] = per_call_us(capturing, (), opts.calls, opts.rounds)
    print(f"dispatch.capturing() alone: {result['capturing_call_us']:.3f} us")
    print(f"{'operator':<22}{'direct us':>10}{'kdispatch +us':>15}{'two modes +us':>15}{'custom op +us':>15}"
          f"{'new shape +us':>15}{'fib.apply +us':>15}{'ratio':>8}")
    for op in SMALL:
        d = kdispatch.ops.DISPATCHERS[op]
        args = meta_arguments(op, SMALL[op])
        noop = lambda *a: a[0]  # noqa: E731 - the cheapest possible "kernel"
        registry.register(Variant(d.definition, "noop", noop, "torch", ("meta",)))
        d.set_router("meta", lambda **axes: "noop")
        op_fn = getattr(kdispatch.ops, op)
        op_fn(*args)  # first call: validation, routing, guard creation
        assert d.choose("meta", d.checker.check(args)).name == "noop"
        direct = per_call_us(noop, args, opts.calls, opts.rounds)
        kd = per_call_us(op_fn, args, opts.calls, opts.rounds) - direct
        registry.register(Variant(d.definition, "noop_eager", lambda *a: a[0], "torch", ("meta",)))
        d.set_router("meta", lambda **axes: "noop", lambda **axes: "noop_eager")
        op_fn(*args)
        two = per_call_us(op_fn, args, opts.calls, opts.rounds) - direct
        d.set_router("meta", lambda **axes: "noop")
        registry.unregister(d.definition, "noop_eager")
        row = {"direct_us": direct, "kdispatch_added_us": kd, "two_modes_added_us": two,
               "custom_op_added_us": custom_op_added_us(d, SMALL[op], opts),
               "new_shape_added_us": new_shape_us(op_fn, op, max(opts.calls // 10, 50)) - direct}
        if d.hints:
            d.set_router("meta", lambda **axes: "noop", route_hinted=lambda **axes: "noop")
            kw = {h: 1 for h in d.hints}
            hinted_fn = lambda *a: op_fn(*a, **kw)  # noqa: E731
            hinted_fn(*args)
            row["hinted_added_us"] = per_call_us(hinted_fn, args, opts.calls, opts.rounds) - direct
            row["new_shape_hinted_added_us"] = new_shape_us(hinted_fn, op, max(opts.calls // 10, 50)) - direct
            print(f"{op}: passing {', '.join(d.hints)}: +{row['hinted_added_us']:.2f} us, new shape "
                  f"+{row['new_shape_hinted_added_us']:.2f} us")
        if fib_apply is not None:
            fib_call = lambda *a, _n=d.definition: fib_apply(_n, args=a, fallback=noop)  # noqa: E731
            fib_call(*args)
            row["fib_apply_added_us"] = per_call_us(fib_call, args, max(opts.calls // 10, 50), opts.rounds) - direct
            row["ratio"] = row["fib_apply_added_us"] / kd
        result["ops"][op] = row
        fib_s = f"{row['fib_apply_added_us']:>15.2f}{row['ratio']:>7.1f}x" if "ratio" in row else f"{'n/a':>15}"
        print(f"{op:<22}{direct:>10.3f}{kd:>15.3f}{two:>15.3f}{row['custom_op_added_us']:>15.3f}"
              f"{row['new_shape_added_us']:>15.2f}{fib_s}")
        d.set_router("meta", None)
        registry.unregister(d.definition, "noop")
    if fib_rt is not None:
        fib_rt.stop()
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
