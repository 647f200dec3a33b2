"""FlashInfer's sm_90 GDN prefill with and without its context-parallel (CP) path, on batches whose
length mix varies: does forcing CP, told the longest sequence or not, serve batches with one long
sequence among short ones, where FlashInfer's "auto" keeps CP off (sequences x heads of a wave or
more) and the recurrence walks the long sequence alone?

Per case (value heads, sequences, tokens, length mix: the coverage sets' "random", "skewed" and
"equal", kdispatch/definitions/gdn/spec.py), FlashInfer's public call with activated gates, states
read and written in place (contiguous [N, HV, 128, 128] fp32), in four modes: `use_cp=False`,
`"auto"`, `True` without `max_seqlen` (the packed length bounds the grids), and `True` with the
batch's longest sequence as `max_seqlen`. Each mode is captured in a CUDA graph per input set (three
sets, replayed in turn: no set stays in L2 from its previous replay), median of the replays; its
output and final states are compared with `use_cp=False`'s on the same inputs.

    python benchmarks/flashinfer_cp_mix.py [--json out.json] [--heads 4 8 32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdispatch.definitions.gdn.spec import equal_cu_seqlens, random_cu_seqlens, skewed_cu_seqlens  # noqa: E402

D = 128
SETS = 3
REPLAYS = 20
# (value heads, sequences, tokens, mix): the held-out engine prefills' mixed batches and grid points
# around them, the long single sequences where CP is FlashInfer's own choice, and equal batches
CASES = [(hv, n, t, mix) for hv in (4, 8, 32) for n, t, mix in (
    (1, 8192, "equal"), (4, 16384, "random"), (8, 4402, "random"), (10, 2330, "skewed"), (23, 1615, "skewed"),
    (24, 8906, "random"), (64, 1024, "skewed"), (64, 4096, "skewed"), (64, 4096, "random"), (66, 4391, "skewed"),
    (64, 8192, "equal"), (256, 8192, "skewed"), (256, 8192, "random"), (173, 15286, "random"))]
MODES = {"cp_off": dict(use_cp=False), "auto": dict(use_cp="auto"), "cp_on": dict(use_cp=True),
         "cp_on_hint": dict(use_cp=True, hint=True)}


def cu_seqlens(t: int, n: int, mix: str, g: torch.Generator) -> torch.Tensor:
    if mix == "random":
        return random_cu_seqlens(t, n, g)
    return skewed_cu_seqlens(t, n, g) if mix == "skewed" else equal_cu_seqlens(t, n)


def inputs(hv: int, n: int, t: int, cu: torch.Tensor, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    hq = hv // 2

    def unit(h):
        x = torch.randn(t, h, D, device="cuda", generator=g)
        return (x / x.norm(dim=-1, keepdim=True)).to(torch.bfloat16)

    return {"q": unit(hq), "k": unit(hq), "v": torch.randn(t, hv, D, device="cuda", generator=g).to(torch.bfloat16),
            "alpha": torch.rand(t, hv, device="cuda", generator=g) * 0.1 + 0.9,
            "beta": torch.rand(t, hv, device="cuda", generator=g),
            "state": torch.randn(n, hv, D, D, device="cuda", generator=g) * 0.05,
            "out": torch.empty(t, hv, D, device="cuda", dtype=torch.bfloat16), "cu": cu.cuda()}


def call(x: dict, mode: dict, longest: int):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    hint = {"max_seqlen": longest} if mode.get("hint") else {}
    chunk_gated_delta_rule(x["q"], x["k"], x["v"], g=x["alpha"], beta=x["beta"], scale=D ** -0.5,
                           initial_state=x["state"], output_final_state=True, cu_seqlens=x["cu"], output=x["out"],
                           output_state=x["state"], use_cp=mode["use_cp"], **hint)


def graph_us(sets: list[dict], mode: dict, longest: int) -> float:
    graphs = []
    for x in sets:
        call(x, mode, longest)  # compiles, and warms the allocator outside the capture
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            call(x, mode, longest)
        graphs.append(gr)
    for gr in graphs:
        gr.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(REPLAYS * len(graphs)):
        start.record()
        graphs[i % len(graphs)].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def one_case(hv: int, n: int, t: int, mix: str) -> dict:
    cu = cu_seqlens(t, n, mix, torch.Generator().manual_seed(hv * 7919 + n * 31 + t))
    longest = int((cu[1:] - cu[:-1]).max())
    row = {"value_heads": hv, "num_seqs": n, "total_seq_len": t, "mix": mix, "max_seq_len": longest, "us": {},
           "max_abs_diff": {}}
    ref = None
    for name, mode in MODES.items():
        x = inputs(hv, n, t, cu, seed=1)
        state0 = x["state"].clone()
        try:
            call(x, mode, longest)
            torch.cuda.synchronize()
            if ref is None:
                ref = (x["out"].float(), x["state"].clone())
            else:
                row["max_abs_diff"][name] = max(float((x["out"].float() - ref[0]).abs().max()),
                                                float((x["state"] - ref[1]).abs().max()))
            del state0
            sets = [inputs(hv, n, t, cu, seed=s) for s in range(2, 2 + SETS)]
            row["us"][name] = graph_us(sets, mode, longest)
        except Exception as exc:  # a mode FlashInfer refuses here: say so, measure the rest
            row["us"][name] = None
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--heads", type=int, nargs="*", default=[4, 8, 32])
    opts = ap.parse_args()
    import flashinfer

    result = {"device": torch.cuda.get_device_name(), "flashinfer": flashinfer.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    for case in CASES:
        if case[0] not in opts.heads:
            continue
        t0 = time.perf_counter()
        row = one_case(*case)
        result["rows"].append(row)
        us = row["us"]
        print(f"hv {row['value_heads']:2d} N {row['num_seqs']:4d} T {row['total_seq_len']:6d} {row['mix']:7s} "
              f"max {row['max_seq_len']:6d} | " + " ".join(f"{k} {v:7.1f}" if v else f"{k} -" for k, v in us.items())
              + f" | diff {max(row['max_abs_diff'].values(), default=0):.2e} ({time.perf_counter() - t0:.0f} s)"
              + (f" errors {row['errors']}" if "errors" in row else ""), flush=True)
        if opts.json:
            opts.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
