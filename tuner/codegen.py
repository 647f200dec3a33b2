"""Router code generation: a fitted Policy -> `routers/<arch>/<definition>.py`, and the policy of
one GPU model (fitted on its measurements alone, `Policy.devices`) -> `routers/<arch>/<model>/<definition>.py`.

The module imports nothing and defines

    REGIONS = (...)        # data: each region's bounds, choice, workloads and measured speedup
    def route(<the definition's variable axes, in definition order>) -> str
    REGIONS_EAGER, def route_eager(...)   # only where eager calls get other choices than graph ones
    REGIONS_HINTED, def route_hinted(<the axes>, <the spec's call-time hints>) (+ _eager, hand_back_)
                           # calls that pass the hints (Spec.hints): a fit with them as more features,
                           # only where it chooses otherwise

`route` computes the derived features it needs (tuner/features.py), then one `if` per region
whose choice is not the baseline (regions are disjoint boxes, so their order does not matter),
then returns the baseline. A region with other admissible variants returns them all, fastest
first, when the shape lies within the measured range of every feature (`MEASURED`); beyond it,
only the region's own choice. The dispatcher calls it once per new tensor signature and takes the
first variant of the answer that is available, accepts the shape (`supports`) and has not failed
on it, else the baseline. `route` answers for calls captured in a CUDA graph (fitted on graph
times), `route_eager` for eager calls (fitted on eager host + device times); without `route_eager`
both modes get `route`'s answers. Everything in the file comes from the store (no clock, no host names),
sorted, so the same store gives byte-identical files.
"""
from __future__ import annotations

from pathlib import Path

from kdispatch import definitions as defs
from kdispatch import registry
from kdispatch.arch import device_module

from . import features as feats
from .fit import Policy, required_gain, variant_summary, workload_of

HEADER_WIDTH = 100


def _cond(definition: str, bounds: dict) -> str:
    """A region's test, over the fit features in order, then the call-time hints."""
    parts = []
    for f in feats.fit_names(definition) + tuple(defs.get(definition).spec.hints):
        if f not in bounds:
            continue
        lo, hi = bounds[f]
        if feats.is_bool(definition, f):
            if hi is not None and hi <= 0:
                parts.append(f"not {f}")
            elif lo is not None and lo >= 0:
                parts.append(f)
            continue
        if lo is not None and hi is not None:
            parts.append(f"{lo} < {f} <= {hi}")
        elif hi is not None:
            parts.append(f"{f} <= {hi}")
        elif lo is not None:
            parts.append(f"{f} > {lo}")
    return " and ".join(parts)


def _speedup(stats: dict) -> str:
    sp = stats.get("speedup")
    if not sp:
        return "no timing"
    lo, geo, hi = sp
    return f"{geo:.2f}x ({lo:.2f}x .. {hi:.2f}x)"


def _region_speedup(policy: Policy, r) -> str:
    """The region's measured speedup over what it replaces, or that estimates alone placed it."""
    if policy.estimated and not r.uuids:
        return "by estimated times (no measured workload in it)"
    return f"{_speedup(r.stats)} over {_base(policy, r)}"


def _chains(policy: Policy) -> bool:
    return any(r.fallbacks for r in policy.regions)


def _routed(policy: Policy, r) -> bool:
    """Does `route` test this region (a variant's, or the baseline's with stand-ins for where the
    baseline cannot run)? Other shapes fall through to the baseline."""
    return r.variant != policy.baseline or bool(r.fallbacks)


def _used_features(definition: str, policy: Policy) -> list[str]:
    used = set(policy.measured) if _chains(policy) else set()
    for r in policy.regions:
        if _routed(policy, r):
            used.update(r.bounds)
    return [f for f in defs.get(definition).spec.derived if f in used]


def _configs(definition: str, names) -> dict[str, str]:
    """name -> "key=value ..." for the configured variants among `names` (from the registry)."""
    out = {}
    for name in names:
        try:
            cfg = registry.get(definition, name).config
        except KeyError:
            continue
        if cfg:
            out[name] = " ".join(f"{k}={v}" for k, v in cfg.items())
    return out


def _heldout_lines(h: dict | None, label: str, withdrawn: bool = False) -> list[str]:
    if not h or not h.get("workloads"):
        return []
    return [f"# held out    {label}: {h['folds']}-fold over workloads: regret vs the best variant "
            f"{h['regret_mean_pct']:.2f}% mean, {h['regret_max_pct']:.2f}% max;",
            f"#             {h['speedup_vs_baseline']:.3f}x over the baseline; {h['slower_than_baseline']} slower than the "
            f"baseline beyond the spread, {h['unsafe']} routed to a failing variant"] + (
            ["#             below 1x: the regions it fitted lose to the baseline where they were not fitted,",
             "#             so every shape goes to the baseline"] if withdrawn else [])


def _region_lines(policy: Policy, d: str) -> list[str]:
    lines = []
    for i, r in enumerate(policy.regions, 1):
        cond = _cond(d, r.bounds) or "every shape"
        who = f"{r.variant} (baseline)" if r.variant == policy.baseline else r.variant
        sp = "" if r.variant == policy.baseline else f", {_region_speedup(policy, r)}"
        then = "" if not r.fallbacks else (f"; where it cannot run here, {', '.join(r.fallbacks)}"
                                            if r.variant == policy.baseline else f"; then {', '.join(r.fallbacks)}")
        back = "; engine plugins keep the engine's kernel (`hand_back`)" if r.hand_back else ""
        lines.append(f"#   {i}. {cond}: {who}, {r.stats.get('workloads', len(r.uuids))} workloads{sp}{then}{back}")
    return lines


def _base(policy: Policy, r) -> str:
    """What a region's speedup is over: the baseline, or its guarded call in a `hand_back` region."""
    return f"{policy.baseline}'s guarded call" if r.hand_back else policy.baseline


def _regions_data(policy: Policy, name: str) -> list[str]:
    lines = [f"{name} = ("]
    for i, r in enumerate(policy.regions, 1):
        bounds = {f: tuple(b) for f, b in sorted(r.bounds.items())}
        sp = r.stats.get("speedup")
        back = ", 'hand_back': True" if r.hand_back else ""
        lines.append(f"    {{'region': {i}, 'variant': {r.variant!r}, 'bounds': {bounds!r}, "
                     f"'workloads': {r.stats.get('workloads', len(r.uuids))}, "
                     f"'speedup': {tuple(sp) if sp else None!r}, 'fallbacks': {tuple(r.fallbacks)!r}{back}}},")
    return lines + [")"]


def _features_body(policy: Policy, d: str) -> list[str]:
    """The lines computing the features the policy's regions read from the axes."""
    body = []
    used = _used_features(d, policy)
    consts = feats.constants_used(d, used)
    if consts:
        body.append(f"    {', '.join(consts)} = {', '.join(map(str, consts.values()))}  # constant axes")
    for f in used:
        der = defs.get(d).spec.derived[f]
        body.append(f"    {f} = {der.expr}  # {der.doc}")
    return body


def _hand_back_body(policy: Policy, d: str) -> list[str]:
    """True inside the regions engine plugins hand back to the engine's kernel (tuner/fit.py)."""
    body = _features_body(policy, d)
    for i, r in enumerate(policy.regions, 1):
        if r.hand_back:
            cond = _cond(d, r.bounds)
            body += [f"    if {cond}:  # region {i}", "        return True"] if cond else \
                [f"    return True  # region {i}"]
    return body + ["    return False"]


def _route_body(policy: Policy, d: str) -> list[str]:
    body = _features_body(policy, d)
    if _chains(policy):
        inside = " and ".join(f"{lo} <= {f} <= {hi}" for f, (lo, hi) in policy.measured.items()) or "True"
        body.append(f"    inside = {inside}  # within the measured ranges: fallbacks apply")
    unconditional = False
    for i, r in enumerate(policy.regions, 1):
        if not _routed(policy, r):
            continue
        cond = _cond(d, r.bounds)
        what = ("the baseline; its stand-ins where it cannot run here" if r.variant == policy.baseline
                else _region_speedup(policy, r))
        body.append(f"    # region {i}: {r.stats.get('workloads', len(r.uuids))} workloads, {what}")
        if cond:
            body += [f"    if {cond}:", f"        return {_answer(policy, r)}"]
        else:
            body.append(f"    return {_answer(policy, r)}")
            unconditional = True
    if not unconditional:
        body.append(f"    return {policy.baseline!r}")
    return body


def _same_choices(a: Policy, b: Policy) -> bool:
    return ([(r.bounds, r.variant, r.fallbacks, r.hand_back) for r in a.regions]
            == [(r.bounds, r.variant, r.fallbacks, r.hand_back) for r in b.regions])


def _answer(policy: Policy, r) -> str:
    if not r.fallbacks:
        return repr(r.variant)
    return f"{(r.variant, *r.fallbacks)!r} if inside else {r.variant!r}"


def render(policy: Policy, device: str | None = None) -> str:
    """The router module's text (`device`: the GPU model it alone serves)."""
    t = policy.table
    d = defs.resolve_name(policy.definition)
    axes = feats.var_axes(d)
    env = t.env if t is not None else {}
    lines = [
        "# Generated by `kdispatch route` (kdispatch.tuner) from the results store. Do not edit by hand:",
        "# re-run `kdispatch tune` (measure) or `kdispatch route` (refit from the store).",
        "#",
        f"# definition  {d}",
        f"# arch        {policy.arch}",
    ]
    if device:
        lines.append(f"# serves      {device} GPUs, fitted on their measurements alone (other {policy.arch}: ../)")
    elif policy.devices or (t is not None and len(t.devices) > 1):  # other models have routers of their own
        lines.append(f"# serves      {policy.arch} GPUs without a router of their own (<model>/: fitted on one model)")
    if t is not None:
        for e in t.devices or (env,):  # fitted on each device's rows: a region wins on all of them
            lines += [
                f"# device      {e.get('device')} ({e.get('arch')}), driver {e.get('driver')}",
                f"# software    torch {e.get('torch')}, triton {e.get('triton')}, CUDA {e.get('cuda')}, "
                f"flashinfer {e.get('flashinfer')}",
            ]
        shapes = len({workload_of(u) for u in t.uuids})
        each = f" on each of {len(t.devices)} devices" if len(t.devices) > 1 else ""
        lines += [
            f"# measured    up to {t.measured_at}",
            f"# workloads   {shapes}{each} (workload-set digest {t.workload_digest()})",
        ]
    lines.append(f"# baseline    {policy.baseline}")
    if t is not None:
        lines.append("# variants    name, source hash, workloads passed / measured, geomean speedup over the baseline")
        summ = variant_summary(t)
        width = max(len(n) for n in summ)
        for name, s in summ.items():
            sp = f"{s['geomean_speedup']:.2f}x" if s["geomean_speedup"] else "-"
            extra = f"  [{s['screened']} screened out]" if s["screened"] else ""
            extra += f"  [{' '.join(s['first_failure'].split())}]" if s["failed"] else ""
            if s["not_graph_safe"]:
                extra += f"  [{s['not_graph_safe']} not graph-safe]"
            lines.append(f"#   {name:<{width}}  {s['hash']}  {s['passed']}/{s['measured']}  {sp}{extra}"[:HEADER_WIDTH * 2])
        configs = _configs(d, summ)
        if configs:
            lines.append("# configs     launch configurations the tuner measured as variants of their own")
            lines += [f"#   {name:<{width}}  {cfg}" for name, cfg in configs.items()]
    lines += [
        "# fit         threshold splits over " + ", ".join(policy.fit_names) + "; a variant replaces the baseline",
        "#             in a region only where it passed and was faster on every workload there by more than",
        f"#             the measured spread (and {policy.params.min_gain:.0%}); the dispatcher still checks the variant's `supports`",
        "#             and availability and takes the region's next admissible variant (inside the measured",
        "#             range of every feature), else the baseline",
    ]
    gains = {v: required_gain(policy.params, d, v) for v in (t.variants if t is not None else ())}
    noisy = sorted((v, g) for v, g in gains.items() if g > policy.params.min_gain)
    if noisy:
        lines.append("#             (by " + ", ".join(f"{f:.0%} for {v}" for v, f in noisy) +
                     ": its time varies between processes)")
    lines += _estimate_lines(policy, d)
    eager = policy.eager if policy.eager is not None and not _same_choices(policy, policy.eager) else None
    lines += _heldout_lines(policy.heldout, "graph", policy.withdrawn)
    if policy.eager is not None:
        lines += _heldout_lines(policy.eager.heldout, "eager", policy.eager.withdrawn)
    lines.append("# regions     CUDA graph (graph times)" + ("" if eager else "; eager calls get the same choices"))
    lines += _region_lines(policy, d)
    if eager:
        lines.append("# regions     eager calls (eager host + device times): `route_eager`")
        lines += _region_lines(eager, d)
    if policy.measured:
        lines.append("# measured    " + ", ".join(f"{lo} <= {f} <= {hi}" for f, (lo, hi) in policy.measured.items()))
    lines += [""] + _regions_data(policy, "REGIONS")
    if eager:
        lines += [""] + _regions_data(eager, "REGIONS_EAGER")
    lines += ["", f"MEASURED = {dict(policy.measured)!r}  # feature -> (min, max) over the tuned workloads"]
    lines += _functions(policy, eager, d, ", ".join(axes), "")
    lines += _hinted_lines(policy, d, axes)
    return "\n".join(lines) + "\n"


def _estimate_lines(policy: Policy, d: str) -> list[str]:
    """What the fit took from estimated times (`Spec.estimate`), if anything."""
    if not policy.estimated:
        return []
    est = defs.get(d).spec.estimate
    return [f"# estimates   the regions are also fitted on {policy.estimated} grid shapes (powers of two in the measured",
            f"#             ranges of {', '.join(est.features)}), each variant's time there estimated",
            f"#             from its measured workloads (local-linear in the logs, bandwidth {est.bandwidth}:",
            "#             tuner/estimate.py); the measured workloads of a region still bind its choice"]


def _functions(policy: Policy, eager: Policy | None, d: str, params: str, tag: str) -> list[str]:
    """`route<tag>` and, where they apply, its eager and hand-back siblings."""
    lines = ["", "", f"def route{tag}({params}):"] + _route_body(policy, d)
    if eager:
        lines += ["", "", f"def route{tag}_eager({params}):"] + _route_body(eager, d)
    if any(r.hand_back for r in policy.regions):
        lines += ["", "", f"def hand_back{tag}({params}):"] + _hand_back_body(policy, d)
    if eager and any(r.hand_back for r in eager.regions):
        lines += ["", "", f"def hand_back{tag}_eager({params}):"] + _hand_back_body(eager, d)
    return lines


def _hinted_lines(policy: Policy, d: str, axes: list[str]) -> list[str]:
    """`route_hinted` (and its eager and hand-back siblings) for calls that pass the definition's
    call-time hints (`Spec.hints`), where fitting on them gave other choices than `route`'s."""
    h = policy.hinted
    if h is None:
        return []
    if _same_choices(h, policy) and _same_choices(h.eager or h, policy.eager or policy):
        return []  # the hints change nothing: such calls route as the others
    eager = h.eager if h.eager is not None and not _same_choices(h, h.eager) else None
    hints = list(defs.get(d).spec.hints)
    params = ", ".join(axes + hints)
    lines = ["", "", f"# Calls that pass {', '.join(hints)} ({'; '.join(defs.get(d).spec.hints[n].doc for n in hints)}), "
             "fitted with it as one more feature:"]
    lines += _estimate_lines(h, d)
    lines += _heldout_lines(h.heldout, "graph", h.withdrawn) + (
        _heldout_lines(h.eager.heldout, "eager", h.eager.withdrawn) if h.eager else [])
    lines.append("# regions     CUDA graph (graph times)" + ("" if eager else "; eager calls get the same choices"))
    lines += _region_lines(h, d)
    if eager:
        lines.append("# regions     eager calls: `route_hinted_eager`")
        lines += _region_lines(eager, d)
    lines += [""] + _regions_data(h, "REGIONS_HINTED")
    if eager:
        lines += [""] + _regions_data(eager, "REGIONS_HINTED_EAGER")
    return lines + ["", f"MEASURED_HINTED = {dict(h.measured)!r}"] + _functions(h, eager, d, params, "_hinted")


def write(policy: Policy, out_dir: str | Path, device: str | None = None) -> Path:
    """Writes `<out_dir>/<arch>/<definition>.py`, or with `device` (a GPU model's name, the policy
    fitted on its rows alone) `<out_dir>/<arch>/<model>/<definition>.py` (and the packages'
    __init__.py files where missing)."""
    out_dir = Path(out_dir)
    pkg = out_dir / policy.arch
    for folder in (pkg, pkg / device_module(device)) if device else (pkg,):
        folder.mkdir(parents=True, exist_ok=True)
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text("")
    if device:
        pkg = pkg / device_module(device)
    path = pkg / f"{defs.resolve_name(policy.definition)}.py"
    text = render(policy, device)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def remove_model_routers(out_dir: str | Path, arch: str, definition: str, keep) -> None:
    """Deletes the definition's routers of GPU models not in `keep` (device names), e.g. where only
    one model's rows are left, and the architecture's router is its own."""
    wanted = {device_module(n) for n in keep}
    for path in sorted(Path(out_dir, arch).glob(f"*/{defs.resolve_name(definition)}.py")):
        if path.parent.name not in wanted:
            path.unlink()


def load_route(path: str | Path, mode: str = "graph", hinted: bool = False):
    """(route function, REGIONS) of a router file for calls in `mode` (`hinted`: calls passing the
    call-time hints, where the router has `route_hinted`), loaded without importing any package."""
    ns: dict = {}
    code = Path(path).read_text()
    exec(compile(code, str(path), "exec"), ns)  # generated, import-free module
    tag = "_hinted" if hinted and "route_hinted" in ns else ""
    if mode == "eager" and f"route{tag}_eager" in ns:
        return ns[f"route{tag}_eager"], ns[f"REGIONS{tag.upper()}_EAGER"]
    return ns[f"route{tag}"], ns.get(f"REGIONS{tag.upper()}", ())
