"""The tuning commands of `kdispatch` (added to its parser by kdispatch/cli.py):

    kdispatch tune [--workloads DIR ...] [--definitions D ...] [--variants V ... | --skip-variants V ...]
                   [--device cuda|cuda:N[,M]] [--out routers/] [--store PATH] [--quick] [--force] [--trials N]
                   [--timeout S] [--screen FACTOR] [--warm N] [--eager-turns | --eager-turns-only [--retake-before UTC]]
                   [--stand-in-baseline]
    kdispatch route [--store PATH ...] [--out routers/] [--arch sm90] [--definitions D ...] [--workloads DIR ...]
                    [--check HELDOUT_STORE]
    kdispatch explain <definition> key=value ... [--arch sm90] [--routers DIR] [--store PATH ...]
    kdispatch bench --workloads DIR [DIR ...] [--definitions D ...] [--device ...] [--quick] [--max-minutes M]
                    [--json PATH]
    kdispatch report [--store PATH ...] [--out DIR] [--arch sm90] [--workloads DIR ...]
    kdispatch add <variant.py | solution.json> [--author A] [--parent V] [--archs sm90 ...] [--force]

Workload sets: `tune` measures the contest's (traces/) and the coverage set of the shapes engines
send (traces/coverage/) unless --workloads names others; traces/heldout/ is for `bench` only.
Stores: `tune` writes `tuner/results/<device-slug>.sqlite` (git-ignored) and its committed text
twin `tuner/results/traces/<device-slug>.jsonl.gz`; `route`, `explain` and `report` read
every store under tuner/results/ by default (no GPU needed). `--quick` (a smoke run: 6 workloads
per definition, 1 trial, few repetitions) uses `tuner/results/quick/` for both its store and its
routers unless --store / --out say otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


TUNE_SETS = ("traces", "traces/coverage")  # the contest's workloads and the coverage of what engines send
SCREEN_FACTOR = 2.0  # `tune --screen`: pairs over this factor slower than the fastest are not measured (tuner/job.py)
HELDOUT_SET = "traces/heldout"  # never tuned on: `route --check`'s store measures it
DEFAULT_REPORT_DIR = "kdispatch-report"  # under the current folder: never a tracked file unless asked


def _defs_arg(p):
    p.add_argument("--definitions", nargs="+", metavar="D", help="definitions (short or full names); default: all")


def _utc(text: str) -> str:
    """A time as the store writes `measured_at` (ISO, UTC, whole seconds), from any ISO form; a
    time without a zone is taken as UTC."""
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r} (e.g. 2026-11-29T22:02:00Z)") from None
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    from .job import STAMP

    return t.strftime(STAMP)


def _store_arg(p, many=True):
    p.add_argument("--store", nargs="+" if many else None, metavar="PATH",
                   help="results store(s) (.sqlite or its traces/*.jsonl.gz twin); default: every store under tuner/results/")


def add_commands(sub) -> None:
    p = sub.add_parser("tune", help="measure every variant on every workload, then compile the routers")
    p.add_argument("--workloads", nargs="+", default=list(TUNE_SETS), metavar="DIR",
                   help=f"FlashInfer-Bench trace set folders (default: {' '.join(TUNE_SETS)})")
    _defs_arg(p)
    p.add_argument("--variants", nargs="+", metavar="V", help="only these variants (the baseline is always measured)")
    p.add_argument("--skip-variants", nargs="+", metavar="V",
                   help="every variant but these (the baseline is always measured)")
    p.add_argument("--device", default="cuda", help="cuda (every visible GPU, one worker each), cuda:N[,M], or cpu")
    p.add_argument("--out", help="routers folder (default: routers/, or tuner/results/quick/routers with --quick)")
    p.add_argument("--store", help="results store (default: tuner/results/<device>.sqlite)")
    p.add_argument("--quick", action="store_true", help="smoke run: 6 workloads per definition, 1 trial, few reps")
    p.add_argument("--force", action="store_true", help="re-measure what the store already has")
    p.add_argument("--trials", type=int, help="correctness trials per workload (default 3; --quick 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds without progress before a worker is "
                                                                "killed as hung (default 300)")
    p.add_argument("--no-route", action="store_true", help="measure only; do not compile routers")
    p.add_argument("--warm", type=int, default=0, metavar="N",
                   help="warm-up workers per GPU that first call every pending variant once, so that the compiles "
                        "run in parallel before the measuring (default 0: none; it pays on compile-heavy sets, "
                        "benchmarks/results/warm-ab-H200.txt)")
    p.add_argument("--screen", type=float, default=SCREEN_FACTOR, metavar="FACTOR",
                   help="neither gate nor time a variant on a workload where a rough first time is over FACTOR times "
                        f"the fastest's in both call modes (default {SCREEN_FACTOR:g}; 0: measure every pair fully)")
    p.add_argument("--eager-turns", action="store_true",
                   help="take each workload's eager times with its variants in turns, call by call, as `bench` does "
                        "(tuner/job.py), the baseline's call among them where only other variants are pending; "
                        "without it, a definition's new rows take them as most of its stored rows on this GPU did, "
                        "each variant's own loop where none are stored; re-measure whole definitions so (--force): "
                        "`route` warns of a definition whose rows mix the two protocols, or were taken without the "
                        "baseline's call")
    p.add_argument("--eager-turns-only", action="store_true",
                   help="measure nothing new: take the eager times of the store's passing rows (this GPU's, of the "
                        "variants' current code) again, in turns, workload by workload; no gate, no graph timing "
                        "(a definition of own-loop rows becomes one of turns in a fraction of a tune); on workloads "
                        "mostly in turns already, rows of own loops or taken without the baseline's call, alone with "
                        "its call (--force: every workload whole; --variants / --skip-variants: those variants' rows "
                        "and the baseline's)")
    p.add_argument("--retake-before", metavar="UTC", type=_utc,
                   help="with --eager-turns-only: also take again the workloads with a row measured before this "
                        "time (e.g. 2026-11-29T22:02:00Z): a --force retake cut short resumes given its start time, "
                        "where --force would begin again")
    p.add_argument("--stand-in-baseline", action="store_true",
                   help="measure a definition whose stored rows on this GPU were taken against a library baseline "
                        "that does not run here (a package missing), with the next baseline that runs (the reference "
                        "at worst) in its place; without it such a tune stops before measuring")
    p.add_argument("--pending", action="store_true", help="print what would be measured and stop (no GPU needed: "
                   "without one, the store's newest environment stands in)")
    p.add_argument("--max-minutes", type=float, help="stop measuring after this long (store and routers are "
                                                     "written; re-running resumes)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("route", help="compile the routers from the results store (no GPU needed)")
    _store_arg(p)
    p.add_argument("--out", help="routers folder (default: routers/)")
    p.add_argument("--arch", help="only this architecture (default: every one in the store)")
    _defs_arg(p)
    p.add_argument("--workloads", nargs="+", metavar="DIR",
                   help=f"fit on the workloads of these trace sets only (default: {' '.join(TUNE_SETS)}, what "
                        "`tune` fits on, for the project's stores; every workload of a store given with --store); "
                        "workloads measured once but since dropped from the sets lack the newer variants' rows")
    p.add_argument("--check", metavar="PATH", help="a store of workloads never fitted on, measured with every "
                                                    "variant (tuner/results/heldout/): each router's regret there")
    p.add_argument("--json", type=Path, metavar="OUT", help="with --check: write its summary there")
    p.set_defaults(func=cmd_route)

    p = sub.add_parser("explain", help="which variant the router picks for a shape, and why")
    p.add_argument("definition")
    p.add_argument("axes", nargs="*", metavar="key=value", help="variable axes, e.g. total_seq_len=100 num_seqs=2")
    p.add_argument("--arch", help="architecture (default: this machine's GPU, else sm90)")
    p.add_argument("--routers", help="routers folder (default: routers/)")
    p.add_argument("--model", help="GPU model whose own router answers where it has one, as its folder names it "
                                   "(e.g. nvidia_h100_80gb_hbm3; default: this machine's GPU, else none)")
    _store_arg(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("bench", help="measure every variant and the routed op on a workload set (a table)")
    p.add_argument("--workloads", nargs="+", default=["traces"], metavar="DIR",
                   help="FlashInfer-Bench trace set folders (default: traces; traces/heldout was never tuned on)")
    _defs_arg(p)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--trials", type=int)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--variants", nargs="+", metavar="V",
                   help="only these variants besides the baseline and the routed op ('--variants routed': "
                        "just the baseline against the routed op)")
    p.add_argument("--max-minutes", type=float, help="stop measuring after this long and report what was "
                   "measured (the JSON says it is incomplete)")
    p.add_argument("--json", help="also write every measurement and the summary here")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="Markdown report (regions, speedups, regret) with a plot per definition")
    _store_arg(p)
    p.add_argument("--out", default=None, help=f"folder (default: ./{DEFAULT_REPORT_DIR}; the committed report is "
                                               "tuner/results/report, written only when named)")
    p.add_argument("--arch")
    _defs_arg(p)
    p.add_argument("--workloads", nargs="+", metavar="DIR",
                   help=f"report the fit on the workloads of these trace sets only, as `route` (default: "
                        f"{' '.join(TUNE_SETS)} where no --store is named)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("add", help="land a candidate variant (kdispatch module or FlashInfer-Bench solution.json)")
    p.add_argument("path")
    p.add_argument("--author", help="author or agent (default: git user.name; a solution's own author)")
    p.add_argument("--parent", help="the variant this one was derived from")
    p.add_argument("--archs", nargs="+", help="architectures of a solution.json variant (default: sm90 sm100)")
    p.add_argument("--force", action="store_true", help="replace an earlier landed candidate of the same file")
    p.set_defaults(func=cmd_add)



def _fail(args, message: str):
    """A user's mistake: one line on stderr, exit status 2, no traceback."""
    print(f"kdispatch {args.command}: {message}", file=sys.stderr)
    raise SystemExit(2)


def _stores(args):
    from .flows import open_stores

    given = getattr(args, "store", None)
    for path in given or ():  # never create a store that was only named (a typo would make an empty one)
        if not Path(path).exists():
            _fail(args, f"no results store at {path}")
    return open_stores(given)


def _check_workloads(args) -> None:
    for root in map(Path, args.workloads):
        if not (root / "workloads").is_dir():
            _fail(args, f"{root} is not a FlashInfer-Bench trace set (no folder {root / 'workloads'})")


def cmd_tune(args) -> int:
    from .flows import StandInBaseline, tune

    _check_workloads(args)
    if args.retake_before and not args.eager_turns_only:
        _fail(args, "--retake-before goes with --eager-turns-only")
    if args.pending:
        from .flows import pending

        pending(args.workloads, definitions=args.definitions, variants=args.variants,
                skip_variants=args.skip_variants, device=args.device, store=args.store,
                eager_only=args.eager_turns_only, force=args.force, retake_before=args.retake_before)
        return 0
    try:
        r = tune(args.workloads, definitions=args.definitions, variants=args.variants,
                 skip_variants=args.skip_variants, device=args.device,
                 store=args.store, out=args.out, quick=args.quick, force=args.force, trials=args.trials,
                 timeout=args.timeout, compile_routers=not args.no_route, max_minutes=args.max_minutes,
                 screen=args.screen or None, warm=args.warm, eager_turns=args.eager_turns,
                 eager_only=args.eager_turns_only, retake_before=args.retake_before,
                 stand_in=args.stand_in_baseline)
    except StandInBaseline as exc:
        _fail(args, f"a library baseline is missing here:\n{exc}")
    print(f"tuned {len(r.plans)} definitions on {r.env['device']} ({r.env['arch']}): {len(r.measured)} measurements, "
          f"{len(r.routers)} routers, {r.seconds / 60:.1f} min" + ("" if r.complete else "; INCOMPLETE: re-run"))
    return 0 if r.complete else 3


def _fit_inputs(args) -> tuple[dict | None, dict]:
    """What a fit from the stores takes besides them: the workloads to fit on ({definition: uuids};
    None: all the store holds), those of `--workloads`, by default the tuning sets' where no store is
    named; and the call-time hint values (Spec.hints) of every workload a fit or check may see."""
    from .flows import defs_with_hints, hint_values
    from .plan import workload_dicts

    uuids = None
    if args.workloads is None and args.store is None:
        args.workloads = list(TUNE_SETS)
    if args.workloads:
        from kdispatch import definitions as defs

        _check_workloads(args)
        uuids = {d: [w["uuid"] for w in workload_dicts(args.workloads, d)] for d in defs.names()}
    hint_sets = [r for r in (*TUNE_SETS, HELDOUT_SET) if Path(r).exists()]
    return uuids, {d: hint_values(d, hint_sets) for d in defs_with_hints(getattr(args, "definitions", None))}


def cmd_route(args) -> int:
    from .flows import compile_all
    from .plan import ROUTERS_DIR

    store = _stores(args)
    uuids, hints = _fit_inputs(args)
    from .store import twin_of

    if args.check and not (Path(args.check).exists() or twin_of(Path(args.check)).exists()):
        _fail(args, f"no results store at {args.check}")
    done = compile_all(store, args.out or ROUTERS_DIR, args.arch, args.definitions, uuids, stream=sys.stdout,
                       hints=hints)
    if not done:
        print("the store has no measurements: run `kdispatch tune` on a GPU machine first", file=sys.stderr)
        return 1
    if args.check:
        from .flows import check_routers
        from .store import Store

        check = Store.open(args.check)
        summary = check_routers(done, check, sys.stdout, hints)
        if args.json:
            envs = check.envs()
            args.json.write_text(json.dumps({
                "what": "kdispatch route --check: the routers fitted from the results store, scored on the "
                        "stored measurements of workloads never fitted on (every variant measured there)",
                "check_store": str(args.check), "devices": sorted({e["device"] for e in envs}),
                "measured": [min(r.measured_at for r in check.results()), max(r.measured_at for r in check.results())],
                "routers": {d: os.path.relpath(path) for d, path, _ in done}, "regret": summary}, indent=1) + "\n")
    return 0


def _parse_axes(items) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            _fail(argparse.Namespace(command="explain"), f"expected key=value, got {it!r}")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            _fail(argparse.Namespace(command="explain"), f"{k.strip()} must be an integer, got {v!r}")
    return out


def _source_of(v) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(v.source.relative_to(root))
    except ValueError:
        return str(v.source)


def cmd_explain(args) -> int:
    """What the dispatcher itself would call for a shape (its router, the run-time switches,
    availability, `declines`, remembered failures), then the measurements behind the region."""
    import kdispatch.ops
    from kdispatch import arch as _arch
    from kdispatch import definitions as defs

    from . import codegen, features
    from . import fit as fitting
    from .plan import ROUTERS_DIR

    try:
        d = defs.get(args.definition)
    except ValueError as exc:
        _fail(args, str(exc))
    axes = _parse_axes(args.axes)
    hints = {k: axes.pop(k) for k in list(axes) if k in d.spec.hints}  # call-time hints, as the op takes them
    unknown = sorted(set(axes) - set(d.var_axes))
    if unknown:
        _fail(args, f"{unknown} are not variable axes of {d.short} (axes: {d.var_axes}"
                    + (f"; hints: {list(d.spec.hints)}" if d.spec.hints else "") + ")")
    from kdispatch.workloads import resolve_axes

    try:
        axes = {k: v for k, v in resolve_axes(d, axes).items() if k in d.var_axes}
    except ValueError as exc:
        _fail(args, str(exc))
    here = _arch.local_arch()
    arch = _arch.Arch(args.arch or (here if here.startswith("sm") else "sm90"),
                      args.model or (getattr(here, "model", None) if args.arch in (None, here) else None))
    dispatcher = kdispatch.ops.DISPATCHERS[d.short]
    folder = Path(args.routers) if args.routers else ROUTERS_DIR
    path = folder / arch / (arch.model or "") / f"{d.name}.py"
    if not path.exists():  # the architecture's router serves models without one of their own
        path = folder / arch / f"{d.name}.py"
    if args.routers:
        dispatcher.set_router(arch, *((codegen.load_route(path)[0], codegen.load_route(path, "eager")[0])
                                      if path.exists() else (None,)))
    f = {**features.compute(d.name, axes), **hints}
    print(f"{d.short} on {arch}: " + ", ".join(f"{k}={v}" for k, v in f.items()))
    axes = {**axes, **hints}
    choice = dispatcher.explain(arch, axes)
    chained = len(choice.chain) > 1
    if chained:
        print(f"router {path} -> {', '.join(choice.chain)} (the first that runs here and accepts the shape)")
    elif choice.router_says is not None:
        print(f"router {path} -> {choice.router_says}")
    for step in choice.steps:
        print(step)
    v = choice.variant
    eager = dispatcher.explain(arch, axes, "eager")
    if eager.variant is v:
        print(f"serves: {v.name} ({v.backend}, {_source_of(v)}), captured in a CUDA graph or eager")
    else:
        print(f"serves, captured in a CUDA graph: {v.name} ({v.backend}, {_source_of(v)})")
        for step in eager.steps:
            print(f"eager: {step}")
        print(f"serves, eager: {eager.variant.name} ({eager.variant.backend}, {_source_of(eager.variant)}): "
              f"the router's eager choice ({', '.join(eager.chain)})")
    regions = codegen.load_route(path, hinted=bool(hints))[1] if path.exists() else ()
    region = next((r for r in regions if fitting.Region(r["bounds"], r["variant"], []).contains(f)), None)
    if region is not None:
        cond = codegen._cond(d.name, region["bounds"]) or "every shape"
        sp = region["speedup"]
        print(f"region {region['region']}: {cond} -> {region['variant']} (tuned on {region['workloads']} workloads"
              + (f"; speedup over the baseline {sp[1]:.2f}x geomean, {sp[0]:.2f}x .. {sp[2]:.2f}x" if sp else "")
              + ")")
        if region.get("hand_back"):
            print("engine plugins hand this shape back to the engine's own kernel: the variant beat only the "
                  "guarded baseline that kdispatch.ops runs (tuner/fit.py)")
        if region.get("fallbacks") and choice.router_says is not None and not chained:
            print("outside the tuned range of a feature: only the region's choice is tried, not its fallbacks "
                  f"({', '.join(region['fallbacks'])})")
    try:
        table = fitting.load_table(_stores(args), d.name, arch)
    except Exception:
        table = None
    if table is None:
        return 0
    var = d.var_axes
    same = [] if hints else [u for u in table.uuids if all(table.axes[u].get(a) == axes[a] for a in var)]
    near = same or [u for u in table.uuids if region is not None and not hints and  # (the store has no hint values)
                    fitting.Region(region["bounds"], "", []).contains(table.features[u])]
    label = "measured on this exact shape" if same else "measured on the region's workloads"
    if not near:
        return 0
    print(f"{label} ({table.device_names}, {len(near)} workload rows), median µs per call:")
    names = table.variants
    print("  " + "  ".join(f"{a:>13}" for a in var) + "  " + "  ".join(f"{n[:22]:>22}" for n in names))
    for u in near[:40]:
        cells = []
        for n in names:
            r = table.rows.get((n, u))
            cells.append(f"{'-' if r is None else (f'{r.median_us:.2f}' if r.passed else r.status[:22]):>22}")
        print("  " + "  ".join(f"{table.axes[u].get(a, '')!s:>13}" for a in var) + "  " + "  ".join(cells))
    if len(near) > 40:
        print(f"  ... and {len(near) - 40} more")
    return 0


def cmd_bench(args) -> int:
    from kdispatch import definitions as defs

    from .flows import bench, bench_table

    _check_workloads(args)
    store, info = bench(args.workloads, definitions=args.definitions, variants=args.variants, device=args.device,
                        quick=args.quick, trials=args.trials, timeout=args.timeout,
                        max_minutes=args.max_minutes)
    env = info["env"]
    print(f"{env['device']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
          f"flashinfer {env['flashinfer']}: median µs per call (CUDA graph, rotated inputs); routed/base in "
          "both call modes (graph; eager = host + device of a synchronised call)")
    summaries = {}
    for d in info["definitions"]:
        lines, summ = bench_table(store, info["env_id"], d)
        if not lines:
            continue
        summaries[d] = summ
        print(f"\n== {defs.get(d).short}")
        print("\n".join(lines))
    print("\n== summary: routed op vs baseline, and regret vs the best passing variant measured on each workload")
    bad = 0
    for d, s in summaries.items():
        bad += s["routed_failures"]
        print(f"{defs.get(d).short:<22} {s['workloads']:>4} workloads  baseline {s['baseline']:<24} "
              f"routed failures: {s['routed_failures']}")
        # the op called with the workloads' call-time hints gets rows of its own
        for label, m in [(mode, s[mode]) for mode in ("graph", "eager")] + \
                [(f"{mode} hinted", s["hinted"][mode]) for mode in ("graph", "eager") if "hinted" in s]:
            bad += m["slower_than_baseline"]
            sp = f"{m['routed_geomean_speedup']:.3f}x" if m["routed_geomean_speedup"] else "n/a"
            rg = (f"regret {m['regret_mean_pct']:.2f}% mean, {m['regret_max_pct']:.2f}% max"
                  if m["regret_mean_pct"] is not None else "regret n/a")
            back = (f" ({m['handed_back']} in regions engine plugins hand back: against the guarded call there)"
                    if m.get("handed_back") else "")
            behind = (f"; where it served the baseline itself, behind its own call: {m['behind_baseline']}"
                      if m.get("behind_baseline") else "")
            print(f"    {label:<6} routed {sp} geomean over the baseline{back}; {rg}; "
                  f"slower than baseline beyond the spread: {m['slower_than_baseline']}{behind}")
        for peer, by_mode in s.get("peers", {}).items():  # not counted as failures: a peer is not the baseline
            cells = "; ".join(f"{mode} {m['routed_geomean_speedup']:.3f}x (min {m['routed_min_speedup']:.3f}x, "
                              f"{m['workloads']} workloads, slower {m['slower_than_peer']})"
                              for mode, m in by_mode.items() if m["workloads"])
            print(f"    vs {peer}: {cells or 'no workload timed by both'}")
    if not info["complete"]:
        print(f"\n[bench] stopped at --max-minutes {args.max_minutes:g}: {info['pending']} (variant, workload) pairs "
              "not measured; the summary covers the workloads measured")
    if args.json:
        out = {"env": env, "complete": info["complete"], "pending": info["pending"], "summary": summaries,
               "results": [dict(vars(r)) for d in info["definitions"] for r in store.results(d)]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
        print(f"written {args.json}")
    return 1 if bad else 0


def cmd_report(args) -> int:
    from .report import write_report

    uuids, hints = _fit_inputs(args)
    path = write_report(_stores(args), args.out or DEFAULT_REPORT_DIR, args.arch, uuids=uuids, hints=hints,
                        definitions=args.definitions)
    print(f"written {path}")
    return 0


def cmd_add(args) -> int:
    from .landing import LandingError, add

    try:
        prov = add(args.path, author=args.author, parent=args.parent, archs=args.archs, force=args.force)
    except (LandingError, KeyError) as exc:
        print(f"kdispatch add: {exc}", file=sys.stderr)
        return 2
    for v in prov["variants"]:
        print(f"landed {v['name']} ({v['backend']}, {'/'.join(v['archs'])}) for {v['definition']}")
    for f in prov["files"]:
        print(f"  {f}")
    print(f"author {prov['author']}, parent {prov['parent']}, {prov['date']}; "
          "`kdispatch tune` measures it and regenerates the routers")
    return 0


def main(argv=None) -> int:  # `python -m kdispatch.tuner.cli ...` without the rest of kdispatch's CLI
    parser = argparse.ArgumentParser(prog="kdispatch-tuner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
