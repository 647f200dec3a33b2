"""What kdispatch's library-backed variants cost over the library call itself, and every variant's
host time per eager call.

1. Wrapper cost (GPU): each library-backed GDN variant (FlashInfer's and fla-core's decode and
   prefill; FlashInfer's prefill also without its context-parallel path, `.cp_off`, and with its
   compiled kernel called directly, `flashinfer_direct`) against the bare library call on the same
   inputs (gates already activated for the libraries that want them, the final state into a
   preallocated buffer), both timed with the tuner's protocol (tuner/timing.py: CUDA graphs over
   rotated inputs, and synchronised eager calls) in one process. The target is <= 2 us (graph) over
   the library.
2. Host time per eager call (no GPU needed): eager host + device time minus graph time of every
   variant on every workload of a results store, median and max per variant (target: <= 25 us for
   every variant a router routes to).

    python benchmarks/wrapper_overhead.py [--json out.json]          # 1, on a GPU, then 2
    python benchmarks/wrapper_overhead.py --host-only [--store PATH]  # 2 only
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOST_TARGET_US = 25.0
WRAPPER_TARGET_US = 2.0
PREFILL_SHAPES = ({"total_seq_len": 1000, "num_seqs": 1}, {"total_seq_len": 6000, "num_seqs": 60},
                  {"total_seq_len": 960, "num_seqs": 24}, {"total_seq_len": 16384, "num_seqs": 4})
DECODE_SHAPES = ({"batch_size": 1}, {"batch_size": 64}, {"batch_size": 256})


def bare_calls():
    """(definition, variant) -> (make_bare(args) -> fn(*args)): the library call alone."""
    import torch

    from kdispatch.kernels.cuda.gdn import prefill_guard

    def fi_prefill(use_cp):
        def make(args):
            from flashinfer.gdn_prefill import chunk_gated_delta_rule

            q, k, v, state, A_log, a, dt_bias, b, cu, scale = args
            cu64, _, alpha, beta = prefill_guard.guard(cu, q.shape[0], gates=(A_log, a, dt_bias, b))
            final = torch.empty_like(state)
            return lambda q, k, v, state, *_: chunk_gated_delta_rule(
                q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state, output_final_state=True,
                cu_seqlens=cu64, output_state=final, use_cp=use_cp)
        return make

    def fi_decode(args):
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

        return lambda q, k, v, state, A_log, a, dt_bias, b, scale: gated_delta_rule_decode_pretranspose(
            q, k, v, state, A_log, a, dt_bias, b, scale=scale, use_qk_l2norm=False)

    flags = dict(output_final_state=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True)

    def fla_decode(args):
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return lambda q, k, v, state, A_log, a, dt_bias, b, scale: fused_recurrent_gated_delta_rule(
            q, k, v, g=a, beta=b, scale=scale, initial_state=state, A_log=A_log, dt_bias=dt_bias, **flags)

    def fla_prefill(args):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        cu64 = args[8].to(torch.int64)
        return lambda q, k, v, state, A_log, a, dt_bias, b, cu, scale: chunk_gated_delta_rule(
            q[None], k[None], v[None], g=a[None], beta=b[None], scale=scale, initial_state=state, A_log=A_log,
            dt_bias=dt_bias, cu_seqlens=cu64, **flags)

    # `.cp_off` and `flashinfer_direct` make the call without the context-parallel path: against that one
    return {("gdn_prefill", "flashinfer"): fi_prefill("auto"), ("gdn_prefill", "flashinfer.cp_off"): fi_prefill(False),
            ("gdn_prefill", "flashinfer_direct"): fi_prefill(False), ("gdn_decode", "flashinfer"): fi_decode,
            ("gdn_decode", "fla_fused_recurrent"): fla_decode, ("gdn_prefill", "fla_chunk"): fla_prefill}


def wrapper_costs() -> list[dict]:
    from kdispatch import registry
    from kdispatch.tuner.timing import measure
    from kdispatch.workloads import materialize

    rows = []
    for (short, name), make_bare in bare_calls().items():
        v = registry.get(short, name)
        if v.missing:
            print(f"{short} {name}: skipped, {v.why_not('sm90')}")
            continue
        for axes in (PREFILL_SHAPES if short == "gdn_prefill" else DECODE_SHAPES):
            w = {"uuid": f"wrapper-{short}-{'-'.join(map(str, axes.values()))}", "axes": dict(axes), "inputs": {}}
            args = list(materialize(short, w, device="cuda"))
            wrapped, bare = measure(short, v.fn, args), measure(short, make_bare(args), args)
            rows.append({"definition": short, "variant": name, "axes": axes,
                         "graph_us": wrapped.median_us, "bare_graph_us": bare.median_us,
                         "eager_us": wrapped.eager_us, "bare_eager_us": bare.eager_us,
                         "graph_method": wrapped.method, "bare_graph_method": bare.method})
    return rows


def host_times(store_path: str | None) -> list[dict]:
    from kdispatch import definitions as defs
    from kdispatch.tuner import fit
    from kdispatch.tuner.flows import open_stores
    from kdispatch.tuner.store import Store

    store = Store.open(store_path) if store_path else open_stores()
    out = []
    for d in defs.names():
        t = fit.load_table(store, d, "sm90")
        if t is None:
            continue
        for v in t.variants:
            xs = [r.eager_us - r.median_us for (n, _u), r in t.rows.items()
                  if n == v and r.passed and r.eager_us is not None and r.method == "graph"]
            if xs:
                out.append({"definition": defs.get(d).short, "variant": v, "workloads": len(xs),
                            "host_median_us": statistics.median(xs), "host_max_us": max(xs)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host-only", action="store_true")
    ap.add_argument("--store", help="results store (default: every store under tuner/results/)")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    result = {}
    if not opts.host_only:
        import torch

        result["device"] = torch.cuda.get_device_name()
        result["wrapper"] = wrapper_costs()
        print(f"{'definition':<12} {'variant':<20} {'shape':<34} {'graph':>8} {'bare':>8} {'+us':>7}"
              f" {'eager':>8} {'bare':>8} {'+us':>7}")
        for r in result["wrapper"]:
            print(f"{r['definition']:<12} {r['variant']:<20} {json.dumps(r['axes']):<34} {r['graph_us']:8.1f} "
                  f"{r['bare_graph_us']:8.1f} {r['graph_us'] - r['bare_graph_us']:7.1f} {r['eager_us']:8.1f} "
                  f"{r['bare_eager_us']:8.1f} {r['eager_us'] - r['bare_eager_us']:7.1f}"
                  + ("" if r["graph_us"] - r["bare_graph_us"] <= WRAPPER_TARGET_US else "  over 2 us"))
    result["host"] = host_times(opts.store)
    print(f"\n{'definition':<22} {'variant':<30} {'workloads':>9} {'host median us':>15} {'max':>9}")
    for r in result["host"]:
        print(f"{r['definition']:<22} {r['variant']:<30} {r['workloads']:>9} {r['host_median_us']:>15.1f} "
              f"{r['host_max_us']:>9.1f}" + ("  over 25 us" if r["host_median_us"] > HOST_TARGET_US else ""))
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
