"""`kdispatch report`: a Markdown report of the store, per (architecture, definition), with plots, and
per GPU model measured where several were (its own router, `Policy.devices`; no plot).

Per definition: the environment, the regions of the fitted router with their measured speedups,
the held-out regret, the eager calls' regions and the measured shapes whose eager and graph choices
differ, a table per variant (passed / measured, geomean speedup over the baseline,
first failure), and a PNG of latency against the definition's main feature (tuner/features.py)
for every variant, with the router's choice on each workload circled. The PNG needs matplotlib;
without it the report says so and links the plots an earlier run left in the folder.
"""
from __future__ import annotations

import io
from pathlib import Path

from kdispatch import definitions as defs

from . import codegen, features
from . import fit as fitting
from .store import Store


def write_report(store: Store, out_dir: str | Path, arch: str | None = None,
                 params: fitting.FitParams | None = None, uuids: dict | None = None, hints: dict | None = None,
                 stream=None, definitions=None) -> Path:
    """The report of the policies `kdispatch route` would write from `store` (the same workloads,
    `uuids`, and call-time hint values, `hints`: tuner/flows.py `fit_policies`), of every definition
    or those named in `definitions`."""
    from .flows import fit_policies

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    md = ["# kdispatch tuning report", ""]
    if plt is None:
        md += ["(matplotlib is not installed: no plots. `pip install matplotlib` and re-run `kdispatch report`.)", ""]
    for a, d, policy in fit_policies(store, arch, definitions, uuids=uuids, stream=stream or io.StringIO(),
                                     params=params, hints=hints):
        table = policy.table
        md += _section(policy, table)
        png = out_dir / f"{a}-{defs.get(d).short}.png"
        if plt is not None:
            _plot(plt, policy, table, png)
        if png.exists():  # without matplotlib, an earlier run's plot is kept and linked, marked so
            note = "" if plt is not None else " (plot from an earlier run: matplotlib is not installed)"
            md += [f"![{defs.get(d).short} on {a}]({png.name}){note}", ""]
        for name, own in policy.devices.items():  # the routers of the models measured (no plots of their own)
            md += _section(own, own.table, f"{defs.get(d).short} on {name} (its own router)")
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _section(policy: fitting.Policy, t: fitting.Table, title: str | None = None) -> list[str]:
    d = t.definition
    e = t.env
    out = [f"## {title or f'{defs.get(d).short} on {t.arch}'}", "",
           f"`{d}`: {len(t.uuids)} workloads; {t.device_names}, driver {e['driver']}; torch {e['torch']}, "
           f"triton {e['triton']}, CUDA {e['cuda']}, flashinfer {e['flashinfer']}; measured up to {t.measured_at}. "
           f"Baseline: `{t.baseline}`.", "",
           "| region | shapes | variant | workloads | speedup over baseline (geomean, min .. max) |",
           "| ---: | --- | --- | ---: | --- |"]
    for i, r in enumerate(policy.regions, 1):
        cond = codegen._cond(d, r.bounds) or "every shape"
        sp = "1.00x (baseline)" if r.variant == t.baseline else codegen._speedup(r.stats)
        out.append(f"| {i} | `{cond}` | `{r.variant}` | {len(r.uuids)} | {sp} |")
    h = policy.heldout or {}
    out.append("")
    if h.get("workloads"):
        out.append(f"Held out ({h['folds']}-fold over workloads): regret against the best measured variant "
                   f"{h['regret_mean_pct']:.2f}% mean, {h['regret_max_pct']:.2f}% max, {h['regret_total_pct']:.2f}% "
                   f"of total time; {h['speedup_vs_baseline']:.3f}x over the baseline in total; "
                   f"{h['slower_than_baseline']} workloads slower than the baseline beyond the spread; "
                   f"{h['unsafe']} routed to a variant that failed there.")
        out.append("")
    out += _eager_lines(policy, t)
    out += ["| variant | source hash | passed / measured | screened out | geomean speedup over baseline | first failure |",
            "| --- | --- | ---: | ---: | ---: | --- |"]
    for name, s in fitting.variant_summary(t).items():
        sp = f"{s['geomean_speedup']:.2f}x" if s["geomean_speedup"] else "-"
        fail = " ".join(s["first_failure"].split()).replace("|", "/")
        out.append(f"| `{name}` | `{s['hash']}` | {s['passed']} / {s['measured']} | {s['screened']} | {sp} | {fail} |")
    out.append("")
    return out


MAX_DIFFERING_ROWS = 40


def _eager_lines(policy: fitting.Policy, t: fitting.Table) -> list[str]:
    """The eager policy where it differs from the graph one, and the measured shapes it routes otherwise."""
    eager = policy.eager
    if eager is None or codegen._same_choices(policy, eager):
        return ["Eager calls get the same choices as captured ones.", ""]
    d = t.definition
    out = ["Eager calls (fitted on eager host + device times, `route_eager`):", "",
           "| region | shapes | variant | workloads |", "| ---: | --- | --- | ---: |"]
    for i, r in enumerate(eager.regions, 1):
        out.append(f"| {i} | `{codegen._cond(d, r.bounds) or 'every shape'}` | `{r.variant}` | {len(r.uuids)} |")
    axes = features.var_axes(d)
    shapes = {tuple(t.axes[u].get(a, "") for a in axes): t.features[u] for u in t.uuids}  # repeats once
    differ = [(s, g, e) for s, f in shapes.items() if (g := policy.route(f)) != (e := eager.route(f))]
    out += ["", f"Measured shapes whose eager and graph choices differ: {len(differ)} of {len(shapes)}"
            + (f" (the first {MAX_DIFFERING_ROWS})" if len(differ) > MAX_DIFFERING_ROWS else "") + ".", ""]
    if differ:
        out += ["| " + " | ".join(axes) + " | graph | eager |", "|" + " ---: |" * len(axes) + " --- | --- |"]
        for shape, g, e in differ[:MAX_DIFFERING_ROWS]:
            out.append("| " + " | ".join(map(str, shape)) + f" | `{g}` | `{e}` |")
        out.append("")
    return out


def _plot(plt, policy: fitting.Policy, t: fitting.Table, png: Path) -> None:
    main = features.main(t.definition)
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in t.variants:
        pts = sorted((t.features[u][main], r.median_us) for u in t.uuids
                     if (r := t.rows.get((name, u))) is not None and r.passed)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if len(pts) < 40 else ".", ms=3, lw=0.8,
                    label=name + (" (baseline)" if name == t.baseline else ""))
    chosen = []
    for u in t.uuids:
        name = policy.route(t.features[u])
        r = t.rows.get((name, u))
        if r is not None and r.passed:
            chosen.append((t.features[u][main], r.median_us))
    if chosen:
        ax.scatter([c[0] for c in chosen], [c[1] for c in chosen], s=60, facecolors="none", edgecolors="black",
                   label="router's choice")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(main)
    ax.set_ylabel("latency per call (µs)")
    ax.set_title(f"{defs.get(t.definition).short} on {t.device_names} ({t.arch})")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
