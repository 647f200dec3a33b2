"""Where FlashInfer's GDN prefill spends its host time on sm_90, layer by layer, on the GPU machine.

An eager call of FlashInfer's `chunk_gated_delta_rule` costs ~140 us of host time without its
context-parallel path and ~290 us with it, for 30-100 us of kernel time (H200 rows, eager in turns):
most of an engine's eager prefill call. Its sm_90 kernel is a CuTe-DSL program compiled once and
called through tvm-ffi; this times the layers above that call, each on the same prepared inputs
(gates activated, cu_seqlens int64, as `kernels/library/gdn/flashinfer.py` hands them over):

- `public cp=auto` / `public cp=off`: `flashinfer.gdn_prefill.chunk_gated_delta_rule`
- `dsl entry`: its sm_90 entry `delta_rule_prefill_dsl_sm90` (argument checks, views, cache look-ups)
- `compiled`: the compiled kernel called with the views and scalars the entry would pass
- `variant <name>`: kdispatch's registered variants (the prefill guard launch included), among them
  `flashinfer_direct` (kernels/library/gdn/flashinfer_direct.py), which calls the compiled kernel

For each: host us (until the call returns, device idle before), wall us (until the device is idle
again), and for the first shape cProfile's top functions of the public calls and two variants.

    python benchmarks/flashinfer_prefill_host.py [--shapes 1x64 1x1024 8x4096 64x8192] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from kdispatch import registry
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.workloads import SimpleWorkload, materialize

from gdn_prefill_host import wall_us  # noqa: E402  (benchmarks/ is the script folder)
from hosttime import host_breakdown, host_us  # noqa: E402

DEF = "gdn_prefill"
VARIANTS = ("flashinfer", "flashinfer.cp_off", "flashinfer_direct", "triton_prefill_chunked.v16")


def library_layers(args) -> dict:
    """name -> fn(): FlashInfer's layers on inputs prepared once (the state updated in place)."""
    import cuda.bindings.driver as cuda_driver
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    from flashinfer.gdn_kernels.delta_rule_dsl import delta_rule_sm90 as sm90

    from kdispatch.kernels.library.gdn import flashinfer_direct

    q, k, v, state, A_log, a, dt_bias, b, cu, scale = args
    cu64, _, alpha, beta = prefill_guard.guard(cu, q.shape[0], gates=(A_log, a, dt_bias, b))
    out = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=q.dtype, device=q.device)

    def public(cp):
        return lambda: chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state,
                                              output_final_state=True, cu_seqlens=cu64, output=out,
                                              output_state=state, use_cp=cp)

    calls = {"public cp=auto": public("auto"), "public cp=off": public(False),
             "dsl entry": lambda: sm90.delta_rule_prefill_dsl_sm90(out, state, q, k, v, state, alpha, beta, cu64,
                                                                   scale)}
    calls["public cp=off"]()  # compiles (or finds) the kernel the entry uses
    torch.cuda.synchronize()
    found = flashinfer_direct._lookup(q.device)  # the kernel `flashinfer_direct` calls (warns where absent)
    if found is None:
        return calls
    compiled, tensormaps = found
    T, D, hq, hk, hv = q.shape[0], q.shape[2], q.shape[1], k.shape[1], v.shape[1]
    hsab, n = max(hq, hv), cu64.shape[0] - 1

    def direct():
        stream = cuda_driver.CUstream(torch.cuda.current_stream().cuda_stream)
        compiled(q.as_strided((T, D, hq), (hq * D, 1, D)), k.as_strided((D, T, hk), (1, hk * D, D)),
                 v.as_strided((D, T, hv), (1, hv * D, D)), out.as_strided((D, T, hv), (1, hv * D, D)),
                 alpha.reshape(-1), beta.reshape(-1), state, state, None, None, None, tensormaps, cu64, scale,
                 hq, hk, hv, hsab, n, 1, 0, n * hsab, stream)

    calls["compiled"] = direct
    return calls


def same_results(args) -> str:
    """How far `flashinfer_direct`'s output and final state are from `flashinfer.cp_off`'s (the same
    kernel: 0 expected), each on its own copy of the state, outputs poisoned first."""
    runs = []
    for name in ("flashinfer.cp_off", "flashinfer_direct"):
        call = list(args)
        call[3] = args[3].clone()
        fn = registry.get(DEF, name).fn
        fn(*call)  # the direct variant's first call of a process goes through FlashInfer's entry
        call[3] = args[3].clone()
        out, state = fn(*call)
        runs.append((out.float(), state))
    (o1, s1), (o2, s2) = runs
    return (f"direct vs cp_off: output max |diff| {(o1 - o2).abs().max().item():.3g}, state "
            f"{(s1 - s2).abs().max().item():.3g}, finite {bool(o2.isfinite().all() and s2.isfinite().all())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1x64", "1x1024", "8x4096", "64x8192"],
                    help="sequences x total tokens")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    registry.discover()
    print(f"# benchmarks/flashinfer_prefill_host.py on {torch.cuda.get_device_name()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}")
    rows = []
    for i, shape in enumerate(opts.shapes):
        n, t = map(int, shape.split("x"))
        axes = {"num_seqs": n, "total_seq_len": t}
        args = list(materialize(DEF, SimpleWorkload(axes, uuid=f"fi-host-{shape}"), device="cuda", seed=0))
        calls = library_layers(args)
        for name in VARIANTS:
            fn = registry.get(DEF, name).fn
            calls[f"variant {name}"] = lambda fn=fn: fn(*args)
        print(f"== {n} sequences, {t} tokens; {same_results(args)}")
        for name, fn in calls.items():
            row = {"shape": axes, "call": name, "host_us": host_us(lambda *_: fn(), ()), "wall_us": wall_us(lambda *_: fn(), ())}
            rows.append(row)
            print(f"  {name:<40} host {row['host_us']:8.1f}  wall {row['wall_us']:8.1f} us", flush=True)
        if i == 0:
            for name in ("public cp=off", "public cp=auto", "variant flashinfer.cp_off", "variant flashinfer_direct"):
                print(f"  cProfile, {name}:")
                print("\n".join(f"      {line}" for line in host_breakdown(lambda *_: calls[name](), ())))
    if opts.json:
        opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                                         "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
