"""Where the vLLM prefill swap's eager time goes, on the GPU machine: the call alone (no gather or
scatter around it), on the same rotated input sets, timed in turns (`timing.eager_rounds_us`):
- `vllm`: vLLM's own `fi_chunk_gated_delta_rule` (compiled from its layer file, benchmarks/vllm_kernels.py);
- `plugin`: the swapped call, `kdispatch.integrations.vllm.fi_chunk_call` (its checks, then the variant
  its `serving.decision` decided, `serving.serve_decided`: no validation or signature look-up in the op);
- `op`: `kdispatch.ops.gdn_prefill_gathered` with the batch's longest sequence (what a caller other
  than the plugin pays), and `op (new out)` with a new output buffer per call;
- `plugin checks`: the swapped call with the op replaced by a no-op (its checks and buffers alone);
- `<variant> (direct)`: the op's eager choice and each variant named, called directly, and
  `engine`: the baseline's engine call, what the tuner times as vLLM's (kernels/library/gdn/vllm.py);
- `empty call`: the protocol's floor (two synchronisations and a Python call).
plugin - its choice's direct call is what the plugin costs an eager call, op - its choice's direct call
what the op's dispatch costs, and vllm - engine whether the tuner's baseline is vLLM's call.

    python benchmarks/vllm_prefill_parts.py --case 32:4:2048 --case 8:16:16384 [--variants NAME ...]
                                            [--rounds 200] [--json out.json] [--profile] [--new-counts]

A case is value heads : sequences : total tokens (the sequences of equal length, as in
benchmarks/vllm_kernels.py). Needs vLLM's Python files and `regex` on the GPU host
(benchmarks/stage_engines.sh).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch

import kdispatch.ops
from kdispatch import arch, registry
from kdispatch.integrations import pool_prefill, serving
from kdispatch.integrations import vllm as plugin
from kdispatch.tuner import timing

from hosttime import PROFILED, host_breakdown  # noqa: E402  (benchmarks/ is the script folder)
from vllm_kernels import prefill_sets, trimmed_prefill, vllm_functions  # noqa: E402


def _checks_only(kw: dict) -> None:
    """The plugin's call with kdispatch's op replaced by a no-op: its own checks and buffers alone."""
    serve, pool_prefill.serve_gathered = pool_prefill.serve_gathered, lambda *a, **k: None
    try:
        plugin.fi_chunk_call(**kw)
    finally:
        pool_prefill.serve_gathered = serve


def new_count(c: dict, drop: int) -> dict:
    """Set c on its first T - drop tokens (vllm_kernels.py's `trimmed_prefill`, the output buffer too)."""
    cut = trimmed_prefill(c, drop)
    cut["out"] = c["out"][:cut["v"].shape[1]]
    return cut


def callables(hv: int, sets: list, fns: dict, variants: list | None) -> tuple[dict, str]:
    """name -> fn(marker, set) of the parts timed, and the name of the op's eager choice."""
    short = serving.gdn_short(plugin.PREFILL_KIND, hv)
    op = kdispatch.ops.DISPATCHERS[short]
    name = op.definition
    c0 = sets[0]
    longest = max(c0["lens"])
    axes = {"total_seq_len": c0["v"].shape[1], "num_seqs": len(c0["lens"]), "len_cu_seqlens": len(c0["lens"]) + 1,
            "max_seq_len": longest}
    choice = op.choose(arch.arch_of(c0["v"].device), axes, "eager", strided=True)  # as the plugin's call gets it
    base = registry.baseline(name, arch.arch_of(c0["v"].device))

    def call_args(c):
        return (c["q"][0], c["k"][0], c["v"][0], c["g"][0], c["beta"][0], c["initial"], c["cu_seqlens"], c["out"])

    def vllm_kw(c):
        return dict(q=c["q"], k=c["k"], v=c["v"], g=c["g"], beta=c["beta"], initial_state=c["initial"],
                    output_final_state=True, cu_seqlens=c["cu_seqlens"], use_qk_l2norm_in_kernel=False)

    def noted(c):
        plugin.note_lengths(SimpleNamespace(num_prefills=len(c["lens"])), SimpleNamespace(max_query_len=max(c["lens"])))

    scale = 128 ** -0.5
    out = {
        "vllm": lambda _, c: fns[plugin.FI_PREFILL](**vllm_kw(c)),
        "plugin": lambda _, c: (noted(c), plugin.fi_chunk_call(**vllm_kw(c))),
        "op": lambda _, c: kdispatch.ops.gdn_prefill_gathered(*call_args(c), max_seq_len=max(c["lens"])),
        "op (new out)": lambda _, c: kdispatch.ops.gdn_prefill_gathered(*call_args(c)[:-1], torch.empty_like(c["out"]),
                                                                         max_seq_len=max(c["lens"])),
        "plugin checks": lambda _, c: (noted(c), _checks_only(vllm_kw(c))),
        "engine": lambda _, c: base.engine_fn(*call_args(c), scale),
        "empty call": lambda *_: None,
    }
    for v in [choice, *(registry.get(name, n) for n in variants or ())]:
        out[f"{v.name} (direct)"] = lambda _, c, fn=v.fn: fn(*call_args(c), scale)
    return out, choice.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="heads:sequences:tokens")
    ap.add_argument("--variants", nargs="*", help="variants called directly besides the op's eager choice")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--new-counts", action="store_true",
                    help="every timed call a token count not seen before (the sets cut to T - 1, T - 2, ...), as engines prefill")
    ap.add_argument("--profile", action="store_true", help="where the host time of the plugin, the op and the plugin's checks goes (cProfile)")
    opts = ap.parse_args()
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    fns = vllm_functions()
    plugin._originals.update({k: fns[k] for k in (plugin.FI_PREFILL, plugin.FLA_PREFILL)})  # as register()
    registry.discover()
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc)
              .isoformat(timespec="minutes"), "rounds": opts.rounds, "rows": []}
    print(f"# benchmarks/vllm_prefill_parts.py on {report['device']}, {report['date']}: eager us per call "
          f"(median, p10 .. p90 of {opts.rounds} rounds in turns)")
    for case in opts.case:
        hv, seqs, total = map(int, case.split(":"))
        sets, _ = prefill_sets(hv, seqs, total, l2, device, fns["l2norm_fwd"])
        for c in sets:
            c["initial"] = c["pool"][c["slots"]]  # vLLM's gathered states, once per set: the call alone is timed
            c["out"] = torch.empty_like(c["v"][0])
        parts, choice = callables(hv, sets, fns, opts.variants)
        marker = torch.empty(0, device=device)  # the timing helpers find the device in each set
        timed_sets = [[marker, c] for c in sets]
        for fn in parts.values():  # first calls (compiles, one-off decisions) outside the timer
            fn(*timed_sets[0])
            fn(*timed_sets[0])
        torch.cuda.synchronize()
        fresh_counts = iter(range(1, total))  # token counts dropped, each once
        if opts.new_counts:
            if opts.rounds * len(parts) + 3 * PROFILED >= total:
                raise SystemExit(f"--new-counts: {total} tokens leave fewer new counts than the "
                                 f"{opts.rounds * len(parts) + 3 * PROFILED} calls timed and profiled")
            timed_sets = [[marker, new_count(sets[i % len(sets)], next(fresh_counts))]
                          for i in range(opts.rounds * len(parts))]
        before = dict(plugin.PREFILL_STATS)
        times = timing.eager_rounds_us(parts, timed_sets, opts.rounds)
        # the timed plugin calls and its checks-only calls, each served by kdispatch or passed to vLLM
        swapped = {k: plugin.PREFILL_STATS[k] - before[k] for k in ("served", "passed")}
        row = {"value_heads": hv, "num_seqs": seqs, "total_seq_len": total, "eager_choice": choice,
               "new_counts": opts.new_counts, "plugin_calls": swapped,
               "us": {n: [round(statistics.median(x), 2), round(timing.percentile(x, 0.1), 2),
                          round(timing.percentile(x, 0.9), 2)] for n, x in times.items()}}
        report["rows"].append(row)
        us = {n: m for n, (m, _, _) in row["us"].items()}
        print(f"\n{hv} value heads, {seqs} x {total // seqs} tokens: eager choice {choice}; swapped calls "
              f"(plugin and its checks) served {swapped['served']}, passed to vLLM {swapped['passed']}")
        for n, (m, lo, hi) in row["us"].items():
            print(f"  {n:44s} {m:9.1f}  ({lo:.1f} .. {hi:.1f})")
        print(f"  plugin - op {us['plugin'] - us['op']:+.1f}, op - {choice} (direct) "
              f"{us['op'] - us[f'{choice} (direct)']:+.1f}, vllm - engine {us['vllm'] - us['engine']:+.1f},"
              f" plugin - vllm {us['plugin'] - us['vllm']:+.1f}")
        if opts.profile:
            for n in ("plugin", "op", "plugin checks"):
                fn = parts[n]
                if opts.new_counts:  # every profiled call a count not seen before too
                    fn = lambda *_, f=fn: f(marker, new_count(sets[0], next(fresh_counts)))  # noqa: E731
                row[f"{n}_host_profile"] = host_breakdown(fn, timed_sets[0])
                print(f"  {n} under cProfile:\n" + "\n".join(f"    {line}" for line in row[f"{n}_host_profile"]))
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
