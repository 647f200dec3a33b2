"""SGLang's own GDN kernel classes with and without kdispatch's plugin, side by side in one run: the
calls SGLang 0.5.23's GDN attention backend makes on Hopper for Qwen3-Next (TritonGDNKernel's
packed decode and MTP verify, FlashInferGDNKernel's extend), each made once through SGLang's
unhooked class and once after `kdispatch.integrations.sglang.register()` hooked it through SGLang's
HookRegistry, at the head counts of TP 1, 2, 4 and 8.

Per call: the outputs (and the pool or intermediate states written) of the two must agree (bf16
output within 5e-2, states within 1e-2 relative to their norm); CUDA-graph time (one graph calls
the method once per input set, the sets' slots rotated through a pool larger than 4x the L2) and
eager time (host + device, synchronised; the two sides alternate call by call, 60 calls or more
each, so that drift on the shared host hits both; the quartiles of the pairs' speedups give its
spread); for extend also eager time with a new token
count every call (`eager_new`: the calls cut to T - 1, T - 2, ... tokens, each seen once, as an
engine's prefills come). Before each extend call the plugin's metadata hook (`note_lengths`) is
given the batch's sequence lengths, as SGLang's backend gives them once per forward batch, so the
hooked extend is routed with the batch's longest sequence (`max_seq_len`); host time (until the call returns, device idle: benchmarks/hosttime.py);
the plugin's speedup. Prints a table, then per family and mode the mean and
minimum speedup. Writes JSON. With --profile, also where the plugin's host time goes (cProfile).

Needs SGLang importable for real (benchmarks/stage_engines.sh: the engines bundle and its
engines-deps bundle; on the GPU machine `. benchmarks/gpu_env.sh`).

    python benchmarks/sglang_layer.py [--families decode extend verify] [--heads 32 16 8 4] [--json out.json]
                                      [--profile] [--calls-before N]
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch

from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name, pool_prefill_name, verify_name
from kdispatch.integrations import sglang as plugin
from kdispatch.tuner import timing
from kdispatch.workloads import materialize

from hosttime import host_breakdown, host_us  # noqa: E402  (benchmarks/ is the script folder)

DECODE = (1, 8, 32, 128, 256)  # requests
EXTEND = ((1, 128), (1, 2048), (4, 512), (16, 1024), (64, 4096))  # (sequences, tokens in all)
VERIFY = ((1, 4), (16, 4), (64, 4), (128, 2))  # (requests, draft tokens each)
STATE_BYTES = 128 * 128 * 4  # one head's fp32 state
MAX_SETS = 32
EAGER_REPS = 60  # eager calls per side, alternating
MODES = ("graph", "eager", "eager_new")  # eager_new: extend only, a new token count every call


def _sets(per_set_heads: int, l2: int) -> int:
    """Input sets whose states exceed 4x the L2 together (at most MAX_SETS)."""
    return max(2, min(MAX_SETS, math.ceil(4 * l2 / max(per_set_heads * STATE_BYTES, 1))))


def _rotated(idx: torch.Tensor, per_set: int, i: int) -> torch.Tensor:
    """Set i's slots: live slots shifted by i * per_set (padding stays padding)."""
    return torch.where(idx >= 0, idx + i * per_set, idx)


def decode_calls(hv: int, batch: int, l2: int, device) -> tuple[list, object]:
    """TritonGDNKernel.packed_decode(mixed_qkv, a, b, **kw) per input set, as SGLang's backend calls it."""
    n = _sets(batch * hv, l2)
    w = {"axes": {"batch_size": batch, "num_slots": batch * n + 1}, "inputs": {}, "uuid": f"layer-decode-{hv}-{batch}"}
    mixed_qkv, a, b, A_log, dt_bias, pool, idx, _, scale = materialize(packed_name(hv // 2, hv), w, device=device)
    idx = torch.arange(1, batch + 1, dtype=torch.int32, device=device)
    A_log = A_log.to(torch.bfloat16)  # one parameter tensor for every call, as the layer passes it
    calls = [((mixed_qkv, a, b), dict(A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=pool,
                                     cache_indices=_rotated(idx, batch, i), num_v_heads=hv, head_v_dim=128))
             for i in range(n)]
    return calls, pool


def extend_calls(hv: int, seqs: int, total: int, l2: int, device) -> tuple[list, object]:
    """FlashInferGDNKernel.extend(q, k, v, g, beta, **kw): q/k/v [1, T, H, 128] views of one projection
    row; each call (args, kw, the sequences' lengths as the forward batch's metadata has them)."""
    n = _sets(seqs * hv, l2)
    w = {"axes": {"total_seq_len": total, "num_seqs": seqs, "num_slots": seqs * n + 1}, "inputs": {},
         "uuid": f"layer-extend-{hv}-{seqs}-{total}"}
    q, k, v, g, beta, pool, _, _, cu, _, _ = materialize(pool_prefill_name(hv // 2, hv), w, device=device)
    hq = hv // 2
    row = torch.cat([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], dim=1)
    qs, ks, vs = row.split([hq * 128, hq * 128, hv * 128], dim=1)
    args = (qs.view(1, total, hq, 128), ks.view(1, total, hq, 128), vs.view(1, total, hv, 128), g[None], beta[None])
    idx = torch.arange(1, seqs + 1, dtype=torch.int32, device=device)
    out = torch.empty(1, total, hv, 128, dtype=torch.bfloat16, device=device)
    lens = cu.diff().tolist()
    calls = [(args, dict(ssm_states=pool, cache_indices=_rotated(idx, seqs, i), query_start_loc=cu,
                         state_checkpoint_cu_starts=None, num_state_checkpoints=0, state_checkpoint_every_n_tokens=0,
                         output=out, layer_id=0, extend_prefix_lens=None, track_state=None, track_chunk_idx=None),
              lens)
             for i in range(n)]
    return calls, pool


def trimmed_extend(call, drop: int):
    """An extend call on its first T - drop tokens (boundaries clamped: the last sequences shorter):
    a prefill of a token count the dispatcher has not seen, as engines send nearly every call."""
    (q, k, v, g, beta), kw, lens = call
    t = q.shape[1] - drop
    starts = [sum(lens[:i]) for i in range(len(lens))]
    return ((q[:, :t], k[:, :t], v[:, :t], g[:, :t], beta[:, :t]),
            {**kw, "query_start_loc": kw["query_start_loc"].clamp(max=t), "output": kw["output"][:, :t]},
            [max(0, min(s + n, t) - s) for s, n in zip(starts, lens)])


def verify_calls(hv: int, seqs: int, steps: int, l2: int, device) -> tuple[list, object]:
    """TritonGDNKernel.target_verify(**kw) as SGLang's backend calls it (linear drafts)."""
    n = _sets(seqs * hv, l2)
    total = seqs * steps
    w = {"axes": {"num_seqs": seqs, "cache_steps": steps, "total_seq_len": total, "num_slots": seqs * n + 1,
                  "num_cache_rows": seqs}, "inputs": {}, "uuid": f"layer-verify-{hv}-{seqs}-{steps}"}
    q, k, v, a, b, A_log, dt_bias, pool, _, cu, inter, rows, _ = materialize(verify_name(hv // 2, hv), w, device=device)
    hq = hv // 2
    row = torch.cat([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], dim=1)
    qs, ks, vs = row.split([hq * 128, hq * 128, hv * 128], dim=1)
    idx = torch.arange(1, seqs + 1, dtype=torch.int32, device=device)
    dt_bias = dt_bias.to(torch.bfloat16)  # one parameter tensor for every call, as the layer passes it
    calls = [((), dict(A_log=A_log, dt_bias=dt_bias, q=qs.view(1, total, hq, 128),
                       k=ks.view(1, total, hq, 128), v=vs.view(1, total, hv, 128), a=a, b=b, ssm_states=pool,
                       cache_indices=_rotated(idx, seqs, i), query_start_loc=cu, intermediate_states_buffer=inter,
                       intermediate_state_indices=rows, cache_steps=steps, retrieve_parent_token=None,
                       stable_rows=False))
             for i in range(n)]
    return calls, inter


FAMILIES = {  # family -> (class module, class, method, shapes, call builder, result -> output tensor)
    "decode": ("gdn_triton", "TritonGDNKernel", "packed_decode", DECODE,
               lambda hv, s, l2, dev: decode_calls(hv, s, l2, dev), lambda r: r),
    "extend": ("gdn_flashinfer", "FlashInferGDNKernel", "extend", EXTEND,
               lambda hv, s, l2, dev: extend_calls(hv, *s, l2, dev), lambda r: r[0]),
    "verify": ("gdn_triton", "TritonGDNKernel", "target_verify", VERIFY,
               lambda hv, s, l2, dev: verify_calls(hv, *s, l2, dev), lambda r: r),
}


def _kernel_class(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"sglang.srt.layers.attention.linear.kernels.{module}"), name)


_unhooked_said = False  # `_hook_all` names the targets it could not hook once a run


def _hook_all():
    """kdispatch's hooks applied through SGLang's registry; returns a function that undoes them."""
    import os

    global _unhooked_said

    from sglang.srt.plugins import hook_registry

    classes = [_kernel_class(m, c) for m, c, *_ in FAMILIES.values()]
    saved = [(cls, n, cls.__dict__[n]) for cls in set(classes) for n in ("extend", "packed_decode", "target_verify")
             if n in cls.__dict__]
    switch = os.environ.get(plugin.SWITCH)
    os.environ[plugin.SWITCH] = "1"
    hook_registry.HookRegistry.reset()
    assert plugin.register()
    # SGLang logs a traceback for a target it cannot import; here that is the metadata hook's
    # (GDNAttnBackend imports SGLang's model runner, whose dependencies are not staged): said in one
    # line instead, and the bench gives the plugin each batch's lengths itself (`_run`)
    registry_log = logging.getLogger(hook_registry.__name__)
    level = registry_log.level
    registry_log.setLevel(logging.CRITICAL)
    try:
        hook_registry.HookRegistry.apply_hooks()
    finally:
        registry_log.setLevel(level)
    unhooked = sorted(set(hook_registry.HookRegistry._hooks) - hook_registry.HookRegistry._patched)
    if unhooked and not _unhooked_said:
        print(f"# not hooked here (their modules do not import in this environment): {', '.join(unhooked)}")
        _unhooked_said = True
    assert not {t for t in unhooked if t != plugin.METADATA_TARGET}, "a kernel method was not hooked"

    def undo():
        for cls, n, fn in saved:
            setattr(cls, n, fn)
        hook_registry.HookRegistry.reset()
        if switch is None:
            os.environ.pop(plugin.SWITCH, None)
        else:
            os.environ[plugin.SWITCH] = switch

    return undo


def _run(method, call):
    """One call; an extend call's batch lengths first go to the plugin's metadata hook, as SGLang's
    backend calls it once per forward batch (SGLang's own class ignores them)."""
    args, kw, *lens = call
    if lens:
        plugin.note_lengths(None, SimpleNamespace(extend_seq_lens_cpu=lens[0]))
    return method(*args, **kw)


def _eager_interleaved(methods: dict, calls: list, device, reps: int) -> dict:
    """Eager (host + device, synchronised) microseconds of each method, median over `reps` calls each,
    the methods alternating call by call (which goes first alternates too): machine drift (other
    tenants, clocks) hits both alike. With two methods, also the quartiles of the per-pair speedup
    (the first method's call over the second's on the same inputs): `(q1, q3)` under "speedup"."""
    marker = torch.empty(0, device=device)  # the timing helpers find the device in each set
    samples = {who: [] for who in methods}
    order = list(methods.items())
    for i in range(reps):
        one = [[marker, calls[i % len(calls)]]]
        for who, method in order if i % 2 == 0 else order[::-1]:
            samples[who] += timing.eager_times_us(lambda _, c, m=method: _run(m, c), one, 1)
    out = {who: statistics.median(xs) for who, xs in samples.items()}
    if len(samples) == 2:
        first, second = samples.values()
        q = statistics.quantiles([a / b for a, b in zip(first, second)], n=4)
        out["speedup"] = (q[0], q[2])
    return out


def print_summary(rows: list, families, modes) -> None:
    """Per family and mode the mean and minimum speedup; for eager modes also the shapes slower beyond
    the spread (the engine's call faster in three of four pairs: the pairs' third quartile below 1)."""
    for family in families:
        for mode in modes:
            xs = [r[f"speedup_{mode}"] for r in rows if r["family"] == family and f"speedup_{mode}" in r]
            if xs:
                slower = sum(1 for r in rows if r["family"] == family and r.get(f"speedup_{mode}_quartiles", (1, 1))[1] < 1)
                beyond = "" if mode == "graph" else f", {slower} slower in 3 of 4 pairs"
                print(f"  {family:<7} {mode:<6} mean {statistics.mean(xs):.2f}x  min {min(xs):.2f}x  ({len(xs)} shapes{beyond})")
    print(f"  outputs disagree on {sum(1 for r in rows if r.get('agree') is False)} of {len(rows)} calls")


def measure(family: str, hv: int, shape, l2: int, device, profile: bool = False, calls_before: int = 0) -> dict:
    module, cls_name, method_name, _, build, output_of = FAMILIES[family]
    cls = _kernel_class(module, cls_name)
    calls, written = build(hv, shape, l2, device)
    start = written.clone()
    row = {"family": family, "value_heads": hv, "shape": shape, "sets": len(calls)}
    results, methods = {}, {}
    undo = lambda: None  # noqa: E731
    try:
        for who in ("sglang", "kdispatch"):
            if who == "kdispatch":
                undo = _hook_all()
            # as SGLang's backend builds it (FlashInfer's class loads its kernels here); a bound method
            # keeps the function it was bound to, so SGLang's stays unhooked after _hook_all
            method = getattr(cls(), method_name)
            try:
                written.copy_(start)
                out = output_of(_run(method, calls[0])).clone()
                results[who] = (out, written.clone())
                for i in range(calls_before):  # eager calls before the graph is captured (engines warm up)
                    _run(method, calls[i % len(calls)])
                if device.type == "cuda":
                    marker = torch.empty(0, device=device)  # the timing helpers find the device in each set
                    sets = [[marker, c] for c in calls]
                    times, _ = timing.graph_times_us(lambda _, c, m=method: _run(m, c), sets)
                    row[f"{who}_graph_us"] = statistics.median(times)
                    row[f"{who}_host_us"] = host_us(_run, (method, calls[0]))
                    if profile and who == "kdispatch":
                        row["kdispatch_host_profile"] = host_breakdown(_run, (method, calls[0]))
                methods[who] = method
            except Exception as exc:
                row[f"{who}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        if device.type == "cuda" and methods:
            reps = max(EAGER_REPS, 2 * len(calls))
            for who, us in _eager_interleaved(methods, calls, device, reps).items():
                row[f"{who}_eager_us" if who != "speedup" else "speedup_eager_quartiles"] = us
            if family == "extend":  # every call a new token count, as engines prefill
                fresh = [trimmed_extend(calls[i % len(calls)], 1 + i) for i in range(reps)]
                for who, us in _eager_interleaved(methods, fresh, device, reps).items():
                    row[f"{who}_eager_new_us" if who != "speedup" else "speedup_eager_new_quartiles"] = us
    finally:
        undo()
    if len(results) == 2:
        (o1, s1), (o2, s2) = results["sglang"], results["kdispatch"]
        row["max_abs_out_diff"] = float((o1.float() - o2.float()).abs().max())
        row["state_rel_diff"] = float((s1 - s2).norm() / s1.norm().clamp_min(1e-30))
        row["agree"] = bool(row["max_abs_out_diff"] <= 5e-2 and row["state_rel_diff"] <= 1e-2)
    for mode in MODES:
        if f"sglang_{mode}_us" in row and f"kdispatch_{mode}_us" in row:
            row[f"speedup_{mode}"] = row[f"sglang_{mode}_us"] / row[f"kdispatch_{mode}_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--heads", nargs="*", type=int, default=[hv for _, hv in PACKED_HEADS.values()])
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/sglang-layer-H100.json"))
    ap.add_argument("--profile", action="store_true", help="where the plugin's host time goes, per shape")
    ap.add_argument("--calls-before", type=int, default=0, help="eager calls of each side before its graph capture")
    opts = ap.parse_args()
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    rows = []
    print(f"{'family':<8}{'HV':>4} {'shape':<12}{'SGLang g':>10}{'kd g':>9}{'x':>7}{'SGLang e':>10}{'kd e':>9}{'x':>7}"
          f"{'SGLang h':>10}{'kd h':>9}{'agree':>7}")
    for family in opts.families:
        for hv in opts.heads:
            for shape in FAMILIES[family][3]:
                r = measure(family, hv, shape, l2, device, opts.profile, opts.calls_before)
                rows.append(r)
                f = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
                x = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
                print(f"{family:<8}{hv:>4} {str(shape):<12}{f('sglang_graph_us'):>10}{f('kdispatch_graph_us'):>9}"
                      f"{x('speedup_graph'):>7}{f('sglang_eager_us'):>10}{f('kdispatch_eager_us'):>9}"
                      f"{x('speedup_eager'):>7}{f('sglang_host_us'):>10}{f('kdispatch_host_us'):>9}"
                      f"{str(r.get('agree', '-')):>7}"
                      + "".join(f"  {w}: {r[w + '_error']}" for w in ("sglang", "kdispatch") if w + "_error" in r),
                      flush=True)
                print("\n".join(f"    {line}" for line in r.get("kdispatch_host_profile", [])))
    print("\nsummary: the plugin's speedup over SGLang's kernel class (mean, min over shapes and head counts)")
    print_summary(rows, opts.families, MODES)
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "torch": torch.__version__,
                                     "extend_routed_with_max_seq_len": True,  # note_lengths fed every call
                                     "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
