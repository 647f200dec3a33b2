"""vLLM's GDN kernel calls with and without kdispatch's plugin, side by side in one run: the two calls
of vLLM's Qwen3-Next layer (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py) that the
plugin swaps on Hopper, each made once with vLLM's own function and once with the plugin's
replacement (kdispatch.integrations.vllm, which hands what its routers give back to vLLM's function),
at the head counts of TP 1, 2, 4 and 8:
- decode: `fused_recurrent_gated_delta_rule_packed_decode` (its packed decode-only path), from
  vllm.third_party.flash_linear_attention.ops, called as the layer calls it (A_log fp32, dt_bias in
  the model's bf16, the pool updated in place, `out` a [B, 1, HV, V] view);
- prefill: the layer's non-speculative prefill segment around `fi_chunk_gated_delta_rule` (its
  FlashInfer prefill, the default on sm_90; `prefill_fla`: around its fla `chunk_gated_delta_rule`,
  `--gdn-prefill-backend triton`, given the chunk metadata vLLM's GDN metadata builder computes on
  the host once per batch): the prefill sequences' states gathered from the pool
  (zeroed where a sequence has no initial state), the call with q/k L2-normalised beforehand (as the
  layer does), the final states scattered back. Where vLLM's FlashInfer function takes FlashInfer's
  exp(g) and an `output` buffer (vLLM >= 0.34: its layer makes exp(g) in its post-conv prep and hands
  a slice of its output rows), the calls get both, as the layer gives them. The plugin replaces only the call; gather and
  scatter stay vLLM's on both sides. The layer module itself does not import here (it needs vLLM's
  config stack: transformers, xgrammar, llguidance, compressed-tensors, fastapi, openai, ...), so its
  `fi_chunk_gated_delta_rule` is compiled from the module's own source (that function alone: it
  needs only torch and vLLM's l2norm_fwd). Before each plugin prefill call the batch's sequence count
  and longest query go to `note_lengths`, as the plugin's wrap of vLLM's metadata builder does.
The layer's convolution, gating and projections are the same on both sides and are not run.

Per call: outputs and states of the two sides must agree (bf16 output within 5e-2, states within
1e-2 relative to their norm); CUDA-graph time over input sets whose slots rotate through a pool
larger than 4x the L2; eager time (host + device, synchronised, the sides alternating call by call,
the quartiles of the paired speedups; for prefill also with a new token count every call,
`eager_new`: the sets cut to T - 1, T - 2, ... tokens); host time (until the call returns, device idle:
benchmarks/hosttime.py), and with --profile where the plugin's goes (cProfile). Needs vLLM's Python
files and `regex` on the GPU host (benchmarks/stage_engines.sh); prints a table and a summary,
writes JSON.

    python benchmarks/vllm_kernels.py [--families decode prefill prefill_fla] [--heads 32 16 8 4] [--json out.json]
                                      [--profile]
"""
from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import inspect
import json
import statistics
import typing
from pathlib import Path
from types import SimpleNamespace

import torch

from kdispatch.integrations import vllm as plugin
from kdispatch.tuner import timing

from hosttime import host_breakdown, host_us  # noqa: E402  (benchmarks/ is the script folder)
from sglang_layer import DECODE, EXTEND, MODES, _eager_interleaved, decode_calls, extend_calls, print_summary  # noqa: E402

LAYER_FILE = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"  # under vLLM's package folder


def vllm_functions() -> dict:
    """vLLM's packed decode, FlashInfer and fla prefill functions, and its l2norm_fwd."""
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule
    from vllm.third_party.flash_linear_attention.ops import fused_recurrent_gated_delta_rule_packed_decode
    from vllm.third_party.flash_linear_attention.ops.chunk import l2norm_fwd

    path = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / LAYER_FILE
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == plugin.FI_PREFILL]
    namespace = {"torch": torch, "Literal": typing.Literal, "l2norm_fwd": l2norm_fwd}
    exec(compile(ast.Module([fn], type_ignores=[]), str(path), "exec"), namespace)  # vLLM's own source
    return {plugin.KERNEL: fused_recurrent_gated_delta_rule_packed_decode, plugin.FI_PREFILL: namespace[plugin.FI_PREFILL],
            plugin.FLA_PREFILL: chunk_gated_delta_rule, "l2norm_fwd": l2norm_fwd}


def fla_chunk_metadata(cu_seqlens: torch.Tensor) -> dict:
    """The fla prefill's chunk indices and offsets, as vLLM's GDN metadata builder computes them on the
    host once per batch (the function would otherwise sync to compute them)."""
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE

    cpu = cu_seqlens.cpu()
    return {"chunk_indices": prepare_chunk_indices(cpu, FLA_CHUNK_SIZE).to(cu_seqlens.device),
            "chunk_offsets": prepare_chunk_offsets(cpu, FLA_CHUNK_SIZE).to(cu_seqlens.device)}


def decode_sets(hv: int, batch: int, l2: int, device) -> tuple[list, torch.Tensor]:
    """Keyword arguments of vLLM's packed decode call per input set (the SGLang bench's inputs)."""
    calls, pool = decode_calls(hv, batch, l2, device)
    A_log = calls[0][1]["A_log"].float()  # a float32 parameter in vLLM's layer
    dt_bias = calls[0][1]["dt_bias"].to(torch.bfloat16)  # the model's dtype
    out = torch.empty(batch, 1, hv, 128, dtype=torch.bfloat16, device=device)
    return [dict(mixed_qkv=args[0], a=args[1], b=args[2], A_log=A_log, dt_bias=dt_bias, scale=kw["scale"],
                 initial_state=pool, out=out, ssm_state_indices=kw["cache_indices"], use_qk_l2norm_in_kernel=True)
            for args, kw in calls], pool


def prefill_sets(hv: int, seqs: int, total: int, l2: int, device, l2norm) -> tuple[list, torch.Tensor]:
    """Per input set: q/k (normalised) / v / g / beta [1, T, ...], the pool, the sequences' slots,
    has-initial-state flags, cu_seqlens and lengths."""
    calls, pool = extend_calls(hv, seqs, total, l2, device)
    (q, k, v, g, beta), kw, lens = calls[0]
    q, k = l2norm(q.contiguous()), l2norm(k.contiguous())
    has_initial = torch.ones(seqs, dtype=torch.bool, device=device)
    return [dict(q=q, k=k, v=v, g=g, beta=beta, pool=pool, slots=kw["cache_indices"], has_initial=has_initial,
                 cu_seqlens=kw["query_start_loc"], lens=lens) for _, kw, _ in calls], pool


def trimmed_prefill(c: dict, drop: int) -> dict:
    """A prefill set on its first T - drop tokens (boundaries clamped: the last sequences shorter or
    empty): a token count the dispatcher has not seen, as engines send nearly every prefill."""
    t = c["v"].shape[1] - drop
    starts = [sum(c["lens"][:i]) for i in range(len(c["lens"]))]
    cut = {**c, **{n: c[n][:, :t] for n in ("q", "k", "v", "g", "beta")}, "cu_seqlens": c["cu_seqlens"].clamp(max=t),
           "lens": [max(0, min(s + n, t) - s) for s, n in zip(starts, c["lens"])]}
    if "fla" in c:
        cut["fla"] = fla_chunk_metadata(cut["cu_seqlens"])
    if "output" in c:
        cut["output"] = c["output"][:t]
    return cut


def decode_method(kernel):
    """vLLM's packed decode call with `kernel`; returns the output it wrote (not the pool: the graph
    timer poisons what a call returns and checks that a replay overwrites it)."""
    def run(c):
        kernel(**c)
        return c["out"]
    return run


def prefill_method(kernel, hinted: bool):
    """The layer's prefill segment with `kernel` as its prefill function (the fla one also gets the
    set's chunk metadata, `fla`; vLLM >= 0.34's FlashInfer one an `output` buffer)."""
    def run(c):
        if hinted:
            plugin.note_lengths(SimpleNamespace(num_prefills=len(c["lens"])), SimpleNamespace(max_query_len=max(c["lens"])))
        pool, slots = c["pool"], c["slots"]
        initial = pool[slots]
        initial[~c["has_initial"], ...] = 0
        o, final = kernel(q=c["q"], k=c["k"], v=c["v"], g=c["g"], beta=c["beta"], initial_state=initial,
                          output_final_state=True, cu_seqlens=c["cu_seqlens"], use_qk_l2norm_in_kernel=False,
                          **c.get("fla", {}), **({"output": c["output"]} if "output" in c else {}))
        pool[slots] = final.to(pool.dtype)
        return o
    return run


def measure(family: str, hv: int, shape, l2: int, device, fns: dict, profile: bool = False) -> dict:
    if family == "decode":
        sets, written = decode_sets(hv, shape, l2, device)
        methods = {"vllm": decode_method(fns[plugin.KERNEL]), "kdispatch": decode_method(plugin.packed_decode_call)}
    else:
        sets, written = prefill_sets(hv, *shape, l2, device, fns["l2norm_fwd"])
        ours = {"prefill": plugin.fi_chunk_call, "prefill_fla": plugin.fla_chunk_call}[family]
        theirs = fns[plugin.FI_PREFILL if family == "prefill" else plugin.FLA_PREFILL]
        if family == "prefill_fla":
            for c in sets:
                c["fla"] = fla_chunk_metadata(c["cu_seqlens"])
        elif plugin._gates_taken(theirs) == "exp":  # vLLM >= 0.34, as its layer calls it
            output = "output" in inspect.signature(theirs).parameters
            for c in sets:
                c["g"] = c["g"].float().exp()
                if output:
                    c["output"] = torch.empty(c["v"].shape[1:], dtype=c["v"].dtype, device=device)
        methods = {"vllm": prefill_method(theirs, False), "kdispatch": prefill_method(ours, True)}
    start = written.clone()
    row = {"family": family, "value_heads": hv, "shape": shape, "sets": len(sets)}
    results = {}
    for who, method in methods.items():
        try:
            written.copy_(start)
            if family == "decode":
                sets[0]["out"].fill_(float("nan"))
            results[who] = (method(sets[0]).clone(), written.clone())
            marker = torch.empty(0, device=device)  # the timing helpers find the device in each set
            times, _ = timing.graph_times_us(lambda _, c, m=method: m(c), [[marker, c] for c in sets])
            row[f"{who}_graph_us"] = statistics.median(times)
            row[f"{who}_host_us"] = host_us(method, (sets[0],))
            if profile and who == "kdispatch":
                row["kdispatch_host_profile"] = host_breakdown(method, (sets[0],))
        except Exception as exc:
            row[f"{who}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            methods = {w: m for w, m in methods.items() if w != who}
    if len(methods) == 2:
        reps = max(60, 2 * len(sets))
        stats = plugin.STATS if family == "decode" else plugin.PREFILL_STATS
        phases = {"eager": sets}
        if family != "decode":  # every call a new token count, as engines prefill
            phases["eager_new"] = [trimmed_prefill(sets[i % len(sets)], 1 + i) for i in range(reps)]
        for phase, calls in phases.items():
            before = dict(stats)
            for who, us in _eager_interleaved({w: (lambda m: lambda c: m(c))(m) for w, m in methods.items()},
                                              [((c,), {}) for c in calls], device, reps).items():
                row[f"{who}_{phase}_us" if who != "speedup" else f"speedup_{phase}_quartiles"] = us
            # the plugin's calls of the phase: served by kdispatch, or handed to vLLM's function
            row[f"kdispatch_{phase}_calls"] = {k: stats[k] - before[k] for k in ("served", "passed")}
    if len(results) == 2:
        (o1, s1), (o2, s2) = results["vllm"], results["kdispatch"]
        row["max_abs_out_diff"] = float((o1.float() - o2.float()).abs().max())
        row["state_rel_diff"] = float((s1 - s2).norm() / s1.norm().clamp_min(1e-30))
        row["agree"] = bool(row["max_abs_out_diff"] <= 5e-2 and row["state_rel_diff"] <= 1e-2)
    for mode in MODES:
        if f"vllm_{mode}_us" in row and f"kdispatch_{mode}_us" in row:
            row[f"speedup_{mode}"] = row[f"vllm_{mode}_us"] / row[f"kdispatch_{mode}_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # prefill_fla only when asked: vLLM's fla kernels autotune on each new shape (a first run of its 20 shapes
    # did not finish in 4.7 minutes, H100, 2026-11-27)
    ap.add_argument("--families", nargs="*", default=["decode", "prefill"], choices=["decode", "prefill", "prefill_fla"])
    ap.add_argument("--heads", nargs="*", type=int, default=[32, 16, 8, 4])
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/vllm-kernels-H100.json"))
    ap.add_argument("--profile", action="store_true", help="where the plugin's host time goes, per shape")
    opts = ap.parse_args()
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    fns = vllm_functions()
    plugin._originals.update({k: fns[k] for k in (plugin.KERNEL, plugin.FI_PREFILL, plugin.FLA_PREFILL)})  # as register()
    shapes = {"decode": DECODE, "prefill": EXTEND, "prefill_fla": EXTEND}
    rows = []
    print(f"{'family':<8}{'HV':>4} {'shape':<12}{'vLLM g':>9}{'kd g':>9}{'x':>7}{'vLLM e':>9}{'kd e':>9}{'x':>7}  agree")
    for family in opts.families:
        for hv in opts.heads:
            for shape in shapes[family]:
                r = measure(family, hv, shape, l2, device, fns, opts.profile)
                rows.append(r)
                f = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
                x = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
                print(f"{family:<8}{hv:>4} {str(shape):<12}{f('vllm_graph_us'):>9}{f('kdispatch_graph_us'):>9}"
                      f"{x('speedup_graph'):>7}{f('vllm_eager_us'):>9}{f('kdispatch_eager_us'):>9}"
                      f"{x('speedup_eager'):>7}  {r.get('agree', '-')}"
                      + "".join(f"  {w}: {r[w + '_error']}" for w in ("vllm", "kdispatch") if w + "_error" in r),
                      flush=True)
                for line in r.get("kdispatch_host_profile", []):
                    print(f"    {line}")
    print("\nsummary: the plugin's speedup over vLLM's function (mean, min over shapes and head counts)")
    print_summary(rows, opts.families, MODES)
    print(f"  served / passed: decode {plugin.STATS}, prefill {plugin.PREFILL_STATS}")
    import vllm

    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "torch": torch.__version__, "vllm": vllm.__version__, "rows": rows},
                                    indent=1, default=str))


if __name__ == "__main__":
    main()
