"""Region fitting: from the results store to a per-(definition, architecture) routing policy.

Input (`load_table`): for one definition and architecture, the store's rows of the most recently
measured environment (device + versions) of that architecture, and per variant its most recently
measured source hash. Each workload is a point in feature space (`tuner/features.py`), with a
weight (1 per workload: shapes that occur more often in the trace set count more).

Admissibility. The baseline is always admissible (it is what the dispatcher falls back to). A
variant v is admissible on workload w only if it passed the correctness gate there, was timed with
a graph-safe method (on every workload: one capture failure anywhere marks the variant unsafe
everywhere, since it is a property of its code), and beats the baseline by more than the measured
spread:

    t_v + margin < t_base,   margin = max(s_v + s_base, gain * t_base)      (tuner/stats.py)
    or: p90_v < p10_base and t_v + gain * t_base < t_base   (the 10-90 ranges apart: a long tail
        on the baseline, e.g. the reference's eager host syncs, is no doubt about which is faster)

where s = (p90 - p10) / 2 of the repetitions and gain = min_gain = 3% (CUDA-graph replays have tiny
spreads; the floor absorbs run-to-run drift so that a re-measurement does not find the routed op
slower than the baseline), or more for a variant whose time is known to vary between processes
(`Spec.run_to_run`, e.g. fla-core's chunk prefill: `required_gain`). The same margin decides
"slower than the baseline" in the held-out regret and in `kdispatch bench`. A baseline that syncs
with the host (the MoE reference) cannot be captured, so its graph-mode time is its device time
around an eager call (events), the least it could cost; how it fares on eager calls is the eager
policy's business (below). A variant is admissible in a region only if admissible on
EVERY workload of the region; a variant that failed (or was not measured) on any workload of a region
is never chosen for it. Where the baseline itself failed (it raised, ran out of memory, or was
wrong), every variant that passed there is admissible: anything correct beats it.

Call modes. The same is fitted twice from the same rows: for calls captured in a CUDA graph on the
graph times above, and for eager calls on the eager times (host + device of a synchronised call,
with their own 10-90 spread; there a variant that cannot be captured is admissible too). Eager rows
taken in turns with the baseline's (tuner/job.py, `eager_paired`) are compared with it round by
round instead: admissible where the median of the variant's call over the baseline's of the same
round is below 1 - gain and its 90th percentile below 1 (faster in nine rounds of ten). The calls
of a round meet the same spell of the host; the two 10-90 ranges added, where one cold call of the
baseline's can reach 3.9x its median, kept FlashInfer's decode at 29-34 requests against a CUDA
kernel at half its time. On the H200's turns rows of 14 definitions (benchmarks/results/eager-turns-H200.txt,
the rows with and without the pairing) it moved two eager routers' held-out regret: decode 1.62 ->
1.28% mean, packed decode qk16 0.75 / 4.47 -> 0.11 / 0.67% (mean / max); the other 12 fit the same. The router holds both (`Policy.eager`); the dispatcher asks which mode a call is in only for shapes whose two
choices differ. One router for both (the graph policy serving eager calls) was scored on both
held-out stores (2026-11-29): the eager mean regrets summed over the (router, call) pairs rose from
430 to 1,605% (H100) and from 323 to 1,169% (H200), worse in 29 and 27 pairs, better in 4 and 6
(the H200 indexer among them: 20.4 -> 1.7%). The eager admissibility was also tried with the
variant's median ahead by the gain and its p90 below the baseline's median, in place of beating
it beyond the spread: H200 323 -> 281%, H100 430 -> 463% (pool prefill qk16 plain 15.6 -> 56.6%),
the same counts slower than the baseline; not adopted. Nor the eager times' host part (eager - graph)
taken as its median over the 7 or 15 workloads nearest in log feature space, to smooth the host's
noise (2026-11-29): eager mean regrets summed H200 286 -> 268 / 255%, H100 316 -> 502 / 580%
(the indexer 0.4 -> 21.9%, decode 11.4 -> 27.8%); not adopted.

An eager choice must also hold on a faster host (`holds_on_a_faster_host`): with both rows' host parts
(eager - graph time) at `FitParams.fast_host` = 0.3 of the tune's, the variant must still beat the
baseline by the gain. Two benches of the same H200 routers 50 minutes apart (2026-11-30, 21:15 and
22:05 UTC, benchmarks/results/bench-heldout-routed-H200.json) found the baselines' eager times 0.60x
in geomean (0.35-1.15x) on the second host, graph times within 1%, and five eager calls routed to
host-light variants with slower kernels behind the baseline there (the staged prefill at 13 x 19,554
tokens: 212 against vLLM's path 173 us; stored 204 against 293). Scored on the H200 held-out rows as
measured, the eager mean regrets summed over the routers rose 141.0 -> 199.2% (gathered qk2 plain
5.1 -> 48.5%: 4 x 3,929 left to the baseline, 4.5x the staged path's time, in a region where the
staged path fails the rule elsewhere), none slower either way; with every held-out row's host part
at 0.4 of its measured (a faster host than the tune's), 153.9 -> 144.8% and 2 -> 0 slower. The
refit routers benched on a third host (2026-12-01 ~00:23 UTC): of those five calls only gathered qk16
13 x 7,280 still behind (268 vs 240 us), in a region that passes the rule on all 31 tuned workloads:
the plain call cannot see its length mix. What the rule costs on gathered qk2 plain (48.5%) comes from
the same blindness: its region of 3,466+ tokens over at most 22 sequences holds one-long-prompt mixes
where the staged path takes 2.7-3.3x the baseline's graph time. Neither a deeper eager tree (depth 5:
eager regrets summed 199.2 -> 213.4%) nor smaller eager regions (`min_leaf` 3: 196.1%, gathered qk4
10.9 -> 6.1%, gathered qk16 14.5 -> 17.8%) moves it; not adopted.

Guarded library baselines. A library baseline that makes the engine's call safe (an index guard
launched first; registry `engine=`) is timed twice by the tuner: its row holds the engine's own
call, what engine plugins hand the baseline's calls to, and its metrics the guarded call's
("guarded"), what `kdispatch.ops` runs. Regions are fitted on the engine's times as for any
baseline; then each region left to the baseline is refitted on its own workloads against the
guarded times (`_ops_regions`): where a variant beats the guarded call there, `kdispatch.ops` calls
take it, and the sub-region is marked `hand_back`: plugins keep the engine's kernel there. Held-out
regret and "slower than the baseline" are scored as a plugin runs (the rows' engine times). Rows
measured before the tuner recorded guarded times have none: then nothing changes.

Regions (`fit`). A workload's cost under a variant is the square of its latency over the fastest
admissible variant's there (`miss_exponent`; 1 = the best choice; 20% slower costs 1.44, 2x slower
4), times the workload's weight: a ratio, so that short calls count as much as long ones (summed
microseconds let a few long calls decide for every short one, which held-out regret, a per-shape
ratio, then shows); squared, so that a variant far slower on part of a region loses it to one a little
slower everywhere there (regret is bounded per shape, issue 15). Scored on both held-out stores
(2026-11-28) against the plain ratio: graph regret better in 16 of the 19 (router, call) pairs that
moved (H100 pool qk2 plain 54.3 / 269.9% -> 18.5 / 48.8% mean / max, H100 decode 0.39 / 1.50% -> 0.05
/ 0.25%, H200 gathered qk2 plain 73.3 / 402.3% -> 34.0 / 97.5%, H200 decode 1.42 / 14.36% -> 0.75 /
8.99%), slightly worse in 3 (at most 30.5 -> 34.0% mean, H200 pool qk2 plain); eager even (16 better,
14 worse: H100 pool qk16 plain 50.6 -> 15.6% mean, H200 contest prefill plain 7.3 -> 8.4%, max 31 ->
79%); the same counts slower than the baseline; 5-fold regret of the prefill routers on their training
rows about even. A region's choice is the
admissible variant of least total cost (ties: the baseline, then by name). Regions are grown as a
binary tree of threshold splits `feature <= t` over the features in `FeatureSpec.fit`: at each node
every threshold between two adjacent distinct feature values of the node's workloads is scored by
the total cost of its two children, each child valued at the better of staying one region or its own
best split (one level of lookahead, so a variant winning only in a middle interval is found); the
best is kept if it lowers the node's cost by more than `min_split_gain` (1%) of it, each side keeps
at least `min_leaf` workloads (3: two let one length mix decide a region; where the coverage
measures each shape in several length mixes, two shapes in every mix for graph calls and one more
than the mixes for eager ones, a one-sequence shape, the same workload in every mix, counting as one
in each: `_leaf_params`; a side under min_leaf where no variant but the baseline is admissible everywhere, to
carve out the shapes no variant wins in every length mix, was scored on the H200 held-out store on 2026-12-02:
graph mean regrets summed over the routers 108.7 -> 120.1%, eager 156.5 -> 166.2%, verify qk2's graph 2.1 ->
12.6%, none slower either way; not adopted), and depth <= `max_depth` (4, so at most 16 regions; 5 was
scored on both held-out stores on 2026-11-29: graph regret unchanged but pool qk16's 15.00 -> 14.39% mean
(H200), eager mean regrets summed over the routers 276 -> 273% (H200) and 322 -> 318% (H100), with one more
eager call slower than the baseline, H200 gathered qk2, and the H100 indexer's eager 0.36 -> 7.84%). Sibling
leaves with the same choice are merged, then adjacent boxes with the same choice. Ties between
splits go to the earlier feature and the lower threshold, so the result is deterministic. Thresholds
sit midway between the two tuned values they separate on a log scale, t = isqrt(a b) (`_midway`):
the features are sizes, tuned on log-spaced grids, whose effect on time is multiplicative, so
untuned shapes between go to the nearer side by ratio (a pool prefill at 4 value heads won by the
chunked kernel at 8,692 tokens and lost at 17,728 sent 12,700 tokens to it, 2.8x slower than the
baseline, with the arithmetic midpoint 13,210; H100, 2026-11-26); shapes beyond the tuned range get
the outermost region's choice. A region of a variant other than the baseline then has each split
bound pulled in between its own workloads and the nearest workload beyond them where the baseline
was chosen (among those inside its other bounds): a split found between workloads elsewhere in the
feature space does not hand the variant shapes far from any it won on, nearer to where the baseline
won; they go to the baseline (`_tighten`). That bound sits where the variant's time over the
baseline's, interpolated in log-log between the two, crosses 1 (`_crossing`; midway where the
variant was not measured beyond its region): a kernel that wins by 15% on one side and loses by 70%
on the other stops winning much nearer the first. Where two variants' regions meet on a split, each
the other's only neighbour across it, the shared bound moves in both to where their times cross the
same way (`_settle`; its effect on the held-out scores: benchmarks/results/README.md, the
heldout-check entries).

Estimated times (`Spec.estimate`, tuner/estimate.py). Where the spec asks for it and the fit's
features include the spec's estimate features (pool prefill with the longest sequence: the hinted
fit), the tree also grows on the shapes of a log grid inside the measured ranges, each variant's
time there estimated from its measured workloads; a variant is admissible at a grid shape where its
estimate beats the baseline's by its required gain. The measured workloads stay in, so a variant
still needs to pass and win on every measured workload of its region; the grid places the bounds
between them (no `_tighten`), and the tree may grow deeper (`Estimate.max_depth`). Holding the eager
grid's estimates to the fast-host rule too (graph times estimated beside the eager ones) was scored
on both held-out stores (2026-12-03): hinted eager mean regrets summed H200 20.3 -> 37.6% (on a
faster host 30.1 -> 35.2%), H100 100.9 -> 121.5% (on a faster host 119.5 -> 95.4%, 2 -> 0 slower);
not adopted.

Fallback chains. Each region also lists its other admissible variants, by total cost there
(`Region.fallbacks`): where the choice declines a shape, is unavailable or raised on it, the
dispatcher takes the next one instead of the baseline. A region the baseline keeps lists the
variants that ran correctly on all its workloads, by total time there: the dispatcher stops at the
baseline wherever it runs, and takes them only where it cannot (its package is missing: the
FlashMLA baseline of sparse attention without sgl-flash-mla), rather than the definition's torch
reference. Only within the measured range of every numeric feature (`Policy.measured`): beyond it
no variant was measured at all, so only the nearest region's best variant is tried (if it accepts
the shape), then the baseline.

Generalisation (`heldout_regret`): k-fold over workloads (k = 5, folds by uuid hash): fit on the
other folds, route the held-out workloads, and compare the chosen variant's latency with the best
correct one measured there and with the baseline. Where the held-out workloads' total time under the
policy exceeds the baseline's (speedup below 1x), its regions would lose on shapes nobody measured
too: the policy is withdrawn, every shape to the baseline (`Policy.withdrawn`; the header says so).
(The vLLM-convention prefill at 32 value heads, graph calls without the longest sequence: 6 small
workloads won by up to 5.7x, a 5-fold 0.989x, a held-out 119 x 7-token call 1.3x slower than the
baseline; H100 rows of 2026-11-27.)
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from kdispatch import definitions as defs
from kdispatch import registry

from . import estimate as estimates
from . import features as feats
from .stats import MODES, Timed, beats, geomean, slower, timed
from .store import Result, Store, slug


def required_gain(params: "FitParams", definition: str, variant: str) -> float:
    """The fraction by which `variant` must beat the baseline: min_gain, or its known variation
    between processes (the spec's `run_to_run`, or an override in params) when larger."""
    return max(params.min_gain, defs.get(definition).spec.run_to_run.get(variant, 0.0),
               params.run_to_run.get((defs.resolve_name(definition), variant), 0.0))


def holds_on_a_faster_host(r, x, b, tb, gain: float, fast_host: float, guarded: bool = False) -> bool:
    """Does variant row r (eager time x) still beat baseline row b (eager time tb) by `gain` with both
    calls' host parts (eager - graph time) scaled to `fast_host`? Without a graph time to split a
    row's eager time by, yes (nothing to scale)."""
    gv, gb = timed(r, "graph"), timed(b, "graph", guarded)
    if gv is None or gb is None:
        return True
    scaled = lambda eager, graph: graph + fast_host * max(eager - graph, 0.0)  # noqa: E731
    return scaled(x.median_us, gv.median_us) <= (1.0 - gain) * scaled(tb.median_us, gb.median_us)


@dataclass
class FitParams:
    max_depth: int = 4
    min_leaf: float = 3.0  # workload weight per region
    min_split_gain: float = 0.01  # fraction of the node's cost a split must save
    min_gain: float = 0.03  # a variant must beat the baseline by this fraction (or the spread)
    miss_exponent: float = 2.0  # a workload's cost: (latency / the best admissible latency) ** this
    # (definition, variant) -> extra known run-to-run variation, on top of the specs' `run_to_run`
    run_to_run: dict = field(default_factory=dict)
    folds: int = 5
    # an eager choice must also beat the baseline with every row's host part (eager - graph time) at
    # this fraction of what the tune's host took (`holds_on_a_faster_host`)
    fast_host: float = 0.3


@dataclass
class Table:
    """Everything the fitter knows about one (definition, arch): all from the store."""

    definition: str
    arch: str
    env: dict
    baseline: str
    hashes: dict[str, str]  # variant -> source hash used
    uuids: list[str]  # sorted by (features, uuid)
    axes: dict[str, dict]
    features: dict[str, dict[str, int]]
    rows: dict[tuple[str, str], Result]  # (variant, uuid) -> row
    weights: dict[str, float] = field(default_factory=dict)
    fit_names: tuple[str, ...] = ()  # the features the fitter splits on (the spec's, then any hints)
    devices: tuple[dict, ...] = ()  # the environment of each device fitted on, newest first (`load_table`)

    @property
    def variants(self) -> list[str]:
        """Baseline first, then the others by name."""
        return [self.baseline] + sorted(v for v in self.hashes if v != self.baseline)

    @property
    def device_names(self) -> str:
        """The devices fitted on, newest first ("NVIDIA H200 and NVIDIA H100 80GB HBM3")."""
        return " and ".join(e["device"] for e in self.devices) or self.env.get("device", "")

    def measured_range(self) -> dict[str, tuple[int, int]]:
        """feature -> (min, max) over the workloads, for each numeric feature the fitter splits on."""
        return {f: (min(self.features[u][f] for u in self.uuids), max(self.features[u][f] for u in self.uuids))
                for f in self.fit_names if self.uuids and not feats.is_bool(self.definition, f)}

    @property
    def measured_at(self) -> str:
        return max((r.measured_at for r in self.rows.values()), default="")

    def workload_digest(self) -> str:
        h = hashlib.sha256()
        for u in sorted(self.uuids):
            h.update(f"{u}:{json.dumps(self.axes[u], sort_keys=True)}\n".encode())
        return h.hexdigest()[:16]

    def without(self, variants) -> "Table":
        """The table with these variants' measurements left out (never the baseline's)."""
        drop = set(variants) - {self.baseline}
        return Table(self.definition, self.arch, self.env, self.baseline,
                     {n: h for n, h in self.hashes.items() if n not in drop}, self.uuids, self.axes, self.features,
                     {k: r for k, r in self.rows.items() if k[0] not in drop}, self.weights, self.fit_names,
                     self.devices)

    def on_device(self, device: str) -> "Table":
        """The table of one device's rows alone (its workloads, its variants and their hashes)."""
        env = next(e for e in self.devices if e["device"] == device)
        keep = [u for u in self.uuids if len(self.devices) < 2 or u.endswith(DEVICE_SEP + slug(device))]
        kept = set(keep)
        rows = {k: r for k, r in self.rows.items() if k[1] in kept}
        hashes = {n: h for n, h in self.hashes.items() if n == self.baseline}
        hashes.update({n: r.variant_hash for (n, _u), r in rows.items()})
        return Table(self.definition, self.arch, env, self.baseline, hashes, keep, self.axes, self.features, rows,
                     self.weights, self.fit_names, (env,))

    def subset(self, uuids) -> "Table":
        """The table on these workloads; a device none of whose workloads is left is no longer one the
        table holds (a router's header names the devices it was fitted on)."""
        keep = set(uuids)
        order = [u for u in self.uuids if u in keep]
        devices = self.devices
        if len(devices) > 1:
            devices = tuple(e for e in devices if any(u.endswith(DEVICE_SEP + slug(e["device"])) for u in order)) \
                or devices
        env = self.env if self.env in devices or not devices else devices[0]
        return Table(self.definition, self.arch, env, self.baseline, self.hashes, order, self.axes, self.features,
                     {k: r for k, r in self.rows.items() if k[1] in keep}, self.weights, self.fit_names, devices)

    def with_hints(self, values: dict[str, dict[str, int]]) -> "Table":
        """The table with the definition's call-time hints (`Spec.hints`) as more fit features, on
        the workloads whose hint values are known (workload uuid -> {hint: value})."""
        names = tuple(defs.get(self.definition).spec.hints)
        keep = [u for u in self.uuids if all(n in values.get(workload_of(u), {}) for n in names)]
        fts = {u: {**self.features[u], **{n: int(values[workload_of(u)][n]) for n in names}} for u in keep}
        fit_names = self.fit_names + names
        order = sorted(keep, key=lambda u: (tuple(fts[u][f] for f in fit_names), u))
        kept = set(keep)
        return Table(self.definition, self.arch, self.env, self.baseline, self.hashes, order, self.axes, fts,
                     {k: r for k, r in self.rows.items() if k[1] in kept}, self.weights, fit_names, self.devices)


DEVICE_SEP = "@"  # a workload measured on several devices: one fitted row each, "<uuid>@<device slug>"


def workload_of(key: str) -> str:
    """The workload uuid of a table's workload key (`load_table`: one key per workload and device)."""
    return key.split(DEVICE_SEP, 1)[0]


def load_table(store: Store, definition: str, arch: str, uuids=None) -> Table | None:
    """The store's view of (definition, arch); None when nothing was measured for it.

    Per device of the architecture (H100 and H200 are both sm90), its most recently measured
    environment, and in it each variant's most recently measured hash. Where several devices have
    measured the definition with the same baseline, every workload enters once per device, keyed
    "<uuid>@<device slug>": a region's variant must then win on each device (a router serves the
    architecture, and the crossovers move with the memory bandwidth: fitted on H100 rows alone, the
    contest decode sent batch 64 to a kernel 5% slower than FlashInfer on an H200, 2026-11-28). The
    baseline is the one first in the registry's order among the devices' (a device measured without
    the library of the preferred baseline, such as FlashInfer's top-k module, stays out). Each device
    measured also gets a router fitted on its rows alone (`Table.on_device`, tuner/flows.py
    `compile_all`); the joint one serves the architecture's other devices."""
    definition = defs.resolve_name(definition)
    envs = {e["id"]: e for e in store.envs() if e["arch"] == arch}
    rows = [r for r in store.results(definition) if r.env in envs]
    if uuids is not None:
        keep = set(uuids)
        rows = [r for r in rows if r.uuid in keep]
    if not rows:
        return None
    latest: dict[str, str] = {}
    for r in rows:
        latest[r.env] = max(latest.get(r.env, ""), r.measured_at)
    newest_env: dict[str, str] = {}  # device -> its most recently measured environment
    for e in sorted(latest, key=lambda e: (latest[e], e)):
        newest_env[envs[e]["device"]] = e
    # the registry's order of preference (registry.baseline): the first library baseline that runs
    rank = {v.name: i for i, v in enumerate(v for v in registry.variants(definition) if v.baseline)}
    parts = [(e, *_env_rows([r for r in rows if r.env == e], rank))
             for e in sorted(newest_env.values(), key=lambda e: (latest[e], e), reverse=True)]
    parts = [p for p in parts if p[1] is not None]
    if not parts:
        raise ValueError(f"{definition} on {arch}: the store has no baseline measurements")
    baseline = min((b for _e, b, _k in parts), key=lambda b: rank.get(b, len(rank)))
    parts = [p for p in parts if p[1] == baseline]
    env = parts[0][0]
    hashes: dict[str, str] = {}
    by_key: dict[tuple[str, str], Result] = {}
    for e, _base, kept in reversed(parts):  # the newest device's hash names a variant
        for r in kept:
            hashes[r.variant] = r.variant_hash
            if len(parts) > 1:
                r = replace(r, uuid=f"{r.uuid}{DEVICE_SEP}{slug(envs[e]['device'])}")
            by_key[(r.variant, r.uuid)] = r
    axes = {}
    for r in by_key.values():
        axes.setdefault(r.uuid, r.axes)
    fts = {u: feats.compute(definition, a) for u, a in axes.items()}
    fit_names = feats.fit_names(definition)
    order = sorted(axes, key=lambda u: (tuple(fts[u][f] for f in fit_names), u))
    return Table(definition, arch, envs[env], baseline, hashes, order, axes, fts, by_key,
                 {u: 1.0 for u in order}, tuple(fit_names), tuple(envs[e] for e, _b, _k in parts))


def _env_rows(rows: list[Result], rank: dict[str, int]) -> tuple[str | None, list[Result]]:
    """(baseline, rows) of one environment: each variant's most recently measured hash; the baseline
    is the one first in `rank` (the registry's order) among the variants measured there as the
    baseline, the most recently measured among those it does not rank; none where no row was measured
    as the baseline (that device stays out). Not simply the newest: a row keeps the role of the tune
    that measured it, and `tune --eager-turns-only` renews a stand-in's rows (measured as the baseline
    while the preferred library was missing) after the preferred baseline's."""
    newest: dict[tuple[str, str], str] = {}
    for r in rows:
        k = (r.variant, r.variant_hash)
        newest[k] = max(newest.get(k, ""), r.measured_at)
    hashes: dict[str, str] = {}
    for (name, h), t in sorted(newest.items()):
        if name not in hashes or (t, h) > (newest[(name, hashes[name])], hashes[name]):
            hashes[name] = h
    rows = [r for r in rows if hashes.get(r.variant) == r.variant_hash and r.variant != "routed"]
    base_rows = [r for r in rows if r.baseline]
    if not base_rows:
        return None, rows
    newest = max(base_rows, key=lambda r: (r.measured_at, r.variant)).variant
    return min({r.variant for r in base_rows}, key=lambda v: (rank.get(v, len(rank)), v != newest, v)), rows


# ----------------------------------------------------------------------------------------------
# The policy
# ----------------------------------------------------------------------------------------------

@dataclass
class Region:
    bounds: dict[str, tuple]  # feature -> (lo exclusive or None, hi inclusive or None)
    variant: str
    uuids: list[str]
    stats: dict = field(default_factory=dict)
    # the region's other admissible variants, fastest first: where `variant` declines a shape (or is
    # unavailable, or raises) the dispatcher tries these before the baseline; in a region the baseline
    # keeps, the variants that ran there, for where the baseline cannot run (`_Matrix.stand_ins`)
    fallbacks: list[str] = field(default_factory=list)
    # engine plugins hand the region's calls back to the engine's own kernel (see `_ops_regions`)
    hand_back: bool = False

    def contains(self, f: dict) -> bool:
        return _inside(f, self.bounds)


@dataclass
class Policy:
    definition: str
    arch: str
    baseline: str
    regions: list[Region]
    table: Table | None = None
    heldout: dict | None = None
    params: FitParams = field(default_factory=FitParams)

    # feature -> (min, max) over the fitted workloads, for every numeric fit feature
    measured: dict[str, tuple[int, int]] = field(default_factory=dict)
    mode: str = "graph"  # the call mode whose times chose the regions (stats.MODES)
    eager: "Policy | None" = None  # on the graph policy: the policy for eager calls
    fit_names: tuple[str, ...] = ()  # the features its regions split on
    # on the graph policy of a definition with call-time hints: the (graph, .eager) policy fitted with
    # them too, for calls that pass them
    hinted: "Policy | None" = None
    estimated: int = 0  # grid shapes with estimated times the regions were also fitted on (Spec.estimate)
    # its regions lost to the baseline on the k-fold's held-out workloads, so every shape goes to the
    # baseline (`fit`)
    withdrawn: bool = False
    # on a policy fitted on several devices' rows: each device's own policy (`Table.on_device`), which
    # serves that GPU model (routers/<arch>/<model>/); this one serves the architecture's other models
    devices: dict = field(default_factory=dict)

    def for_device(self, device: str) -> "Policy":
        """The policy that serves calls on `device` (a device name)."""
        return self.devices.get(device, self)

    def route(self, features: dict) -> str:
        return self.chain(features)[0]

    def inside(self, features: dict) -> bool:
        """Is the shape within the measured range of every feature (no extrapolation)?"""
        return all(lo <= features[f] <= hi for f, (lo, hi) in self.measured.items())

    def hands_back(self, features: dict) -> bool:
        """Do engine plugins give this shape back to the engine's own kernel (`hand_back`)?"""
        return any(r.hand_back for r in self.regions if r.contains(features))

    def chain(self, features: dict) -> tuple[str, ...]:
        """The region's choice, then its fallbacks (only inside the measured ranges: beyond them
        nothing but the nearest region's best measured variant is trusted, then the baseline)."""
        for r in self.regions:
            if r.contains(features):
                return (r.variant, *r.fallbacks) if self.inside(features) else (r.variant,)
        return (self.baseline,)


class _Matrix:
    """Dense arrays over (variant, workload) for one table."""

    def __init__(self, t: Table, params: FitParams, mode: str = "graph", guarded: bool = False):
        self.t = t
        self.mode = mode
        self.names = t.variants
        self.fit = list(t.fit_names)
        n, V = len(t.uuids), len(self.names)
        self.X = np.array([[t.features[u][f] for f in self.fit] for u in t.uuids], dtype=np.int64).reshape(n, len(self.fit))
        self.w = np.array([t.weights.get(u, 1.0) for u in t.uuids], dtype=np.float64)
        # what min_leaf counts: a workload's weight, times the length mixes where its shape is one
        # workload in all of them (one sequence, `Coverage.one_mix`): it stands for a shape in every mix
        cov = defs.get(t.definition).spec.coverage
        one = cov.one_mix if cov is not None and len(cov.mixes) > 1 else None
        self.leaf_w = self.w * np.array([len(cov.mixes) if one and one(t.axes[u]) else 1 for u in t.uuids], dtype=np.float64)
        self.lat = np.full((V, n), np.nan)
        self.ok = np.zeros((V, n), dtype=bool)
        self.runs = np.zeros((V, n), dtype=bool)  # timed, correct and (graph) capturable: could serve it
        # Graph safety is a property of a variant's code, not of a shape: one that could not be
        # captured on any workload (a host sync, say) is never routed to in a graph, anywhere.
        unsafe = {v for (v, _u), r in t.rows.items() if r.passed and not r.routable} if mode == "graph" else set()
        for i, u in enumerate(t.uuids):
            b = t.rows.get((t.baseline, u))
            tb = timed(b, mode, guarded)  # guarded: what kdispatch.ops runs (see `_ops_regions`)
            for j, name in enumerate(self.names):
                r = t.rows.get((name, u))
                x = tb if j == 0 else timed(r, mode)
                if x is not None:
                    self.lat[j, i] = x.median_us
                if j == 0:
                    self.ok[j, i] = True
                elif x is not None and name not in unsafe and b is not None and (mode == "eager" or r.routable):
                    self.runs[j, i] = True
                    gain = required_gain(params, t.definition, name)
                    paired = (r.metrics or {}).get("eager_paired") if mode == "eager" and not guarded else None
                    if paired and paired["baseline"] == t.baseline and b.passed:
                        self.ok[j, i] = paired["median"] <= 1.0 - gain and paired["p90"] < 1.0
                    else:
                        self.ok[j, i] = not b.passed or (tb is not None and beats(x, tb, gain))
                    if mode == "eager" and self.ok[j, i] and b.passed:
                        self.ok[j, i] = holds_on_a_faster_host(r, x, b, tb, gain, params.fast_host, guarded)
        # The baseline's cost where it has no timing: the worst measured latency there (only the
        # baseline is admissible on such a workload anyway).
        worst = np.nanmax(np.where(np.isnan(self.lat), -np.inf, self.lat), axis=0)
        self.lat[0] = np.where(np.isnan(self.lat[0]), np.where(np.isfinite(worst), worst, 0.0), self.lat[0])
        # cost: latency over the workload's fastest admissible variant's, to miss_exponent (module docstring)
        best = np.nanmin(np.where(self.ok, self.lat, np.nan), axis=0)
        best = np.where(best > 0, best, 1.0)  # a workload nothing timed costs nothing
        ratio = self.lat / best[None, :]
        self.cost = np.where(np.isnan(self.lat), 0.0, ratio ** params.miss_exponent) * self.w[None, :]

    def add_estimates(self, est, params: FitParams, within: dict | None = None) -> int:
        """Appends the shapes of `est.grid` (a spec's `Estimate`) inside the measured ranges of its
        features (for a graph fit, also at their measured values) and inside the box `within` (feature
        -> (lo exclusive or None, hi inclusive or None)), with every variant's estimated
        time there (tuner/estimate.py), admissible where that beats the baseline's estimate by the variant's required gain (and the variant is
        admissible on some measured workload: one never captured stays out of graphs); returns how
        many shapes were added."""
        cols = [self.fit.index(f) for f in est.features]
        ranges = {f: (int(self.X[:, c].min()), int(self.X[:, c].max())) for f, c in zip(est.features, cols)}
        # The grid may also take the measured values (engines' longest sequences fall between its
        # powers of two). Graph fits only: eager times carry the host's noise, which the extra shapes'
        # estimates then spread (hinted prefills, 5-fold, H100 rows of 2026-11-27: graph, the nine
        # definitions, 17 -> 13 workloads slower than the baseline at the same 3.3% mean regret;
        # eager, the eight pool and gathered ones, 6 -> 9 slower and 11.3 -> 11.8% had they been
        # used there too).
        measured = {f: sorted({int(x) for x in self.X[:, c]}) if self.mode == "graph" else []
                    for f, c in zip(est.features, cols)}
        shapes = est.grid(ranges, measured)
        if not shapes:
            return 0
        rows = [{**feats.compute(self.t.definition, shape), **shape} for shape in shapes]
        # a grid of the features' ranges also makes derived features (the mean length) fall outside
        # a sub-fit's region: such shapes would place its splits where it never routes
        rows = [r for r in rows if _inside(r, within or {})]
        if not rows:
            return 0
        X = np.array([[r[f] for f in self.fit] for r in rows], dtype=np.int64)
        logs = lambda a: np.log(np.maximum(a, 1).astype(np.float64))  # noqa: E731
        declined = np.array([[_declines(self.t.definition, n, self.t.axes[u]) for u in self.t.uuids] for n in self.names],
                            dtype=bool).reshape(len(self.names), len(self.t.uuids))
        declines_query = np.array([[_declines(self.t.definition, n, r) for r in rows] for n in self.names], dtype=bool)
        lat = np.exp(estimates.log_times(logs(self.X[:, cols]), self.lat, logs(X[:, cols]), est.bandwidth,
                                         declined, declines_query))
        if not np.isfinite(lat[0]).any():
            return 0  # the baseline was not timed in this mode
        gain = np.array([0.0] + [required_gain(params, self.t.definition, v) for v in self.names[1:]])
        with np.errstate(invalid="ignore"):
            ok = (lat < lat[0][None, :] * (1.0 - gain[:, None])) & self.ok.any(axis=1)[:, None]
        ok[0] = True
        best = np.min(np.where(ok & np.isfinite(lat), lat, np.inf), axis=0)
        best = np.where(np.isfinite(best) & (best > 0), best, 1.0)
        self.X = np.concatenate([self.X, X])
        self.w = np.concatenate([self.w, np.ones(len(X))])
        self.leaf_w = np.concatenate([self.leaf_w, np.ones(len(X))])
        self.lat = np.concatenate([self.lat, lat], axis=1)
        self.ok = np.concatenate([self.ok, ok], axis=1)
        ratio = lat / best[None, :]
        self.cost = np.concatenate([self.cost, np.where(np.isnan(lat), 0.0, ratio ** params.miss_exponent)], axis=1)
        return len(X)

    def leaf(self, idx: np.ndarray) -> tuple[int, float]:
        """(variant index, total cost) of the best admissible variant over workloads idx."""
        good = self.ok[:, idx].all(axis=1)
        costs = np.where(good, self.cost[:, idx].sum(axis=1), np.inf)
        j = int(np.argmin(costs))  # first minimum: baseline, then by name
        return j, float(costs[j])

    def runners_up(self, idx: np.ndarray, chosen: int) -> list[str]:
        """The variants other than `chosen` and the baseline admissible on every workload of idx,
        by total cost there (ties by name)."""
        good = self.ok[:, idx].all(axis=1)
        costs = self.cost[:, idx].sum(axis=1)
        return [self.names[j] for j in sorted(range(1, len(self.names)), key=lambda j: (costs[j], self.names[j]))
                if good[j] and j != chosen]

    def stand_ins(self, idx: np.ndarray) -> list[str]:
        """For a region the baseline keeps (idx: its measured workloads): the other variants that ran
        on every one of them, by their total time over the baseline's there (ties by name); not the
        torch reference, which the dispatcher falls back to anyway."""
        if not len(idx):
            return []
        named = np.array([n != registry.REFERENCE for n in self.names[1:]], dtype=bool)
        good = self.runs[1:, idx].all(axis=1) & named
        ratio = (self.lat[1:, idx] / np.maximum(self.lat[0, idx], 1e-9)).sum(axis=1)
        return [self.names[j + 1] for j in sorted(np.flatnonzero(good), key=lambda j: (ratio[j], self.names[j + 1]))]

    def _cut_table(self, idx: np.ndarray):
        """idx sorted by each feature (columns), and for each position k < len(idx) - 1 of each
        column the split after it (the first k + 1 sorted workloads on the left): the best admissible
        cost of each side (inf where no variant is admissible on all of it), the left side's weight,
        and whether the split falls between distinct values. All features at once: the lookahead
        asks for this at every candidate split of every node, where numpy's per-call overhead, not
        the arrays, costs the time."""
        X = self.X[idx]
        order = np.argsort(X, axis=0, kind="stable")
        cols = idx[order]  # [m, features]
        vals = np.take_along_axis(X, order, axis=0)
        c = np.cumsum(self.cost[:, cols], axis=1)  # [variants, m, features]
        bad = np.cumsum(~self.ok[:, cols], axis=1)
        wc = np.cumsum(self.leaf_w[cols], axis=0)
        lc = np.where(bad[:, :-1] == 0, c[:, :-1], np.inf).min(axis=0)
        rc = np.where(bad[:, -1:] - bad[:, :-1] == 0, c[:, -1:] - c[:, :-1], np.inf).min(axis=0)
        return cols, vals, lc, rc, wc[:-1], wc[-1], vals[1:] != vals[:-1]

    def splits(self, idx: np.ndarray, min_leaf: float):
        """Yields (feature index, threshold, left idx, right idx, left cost, right cost) for every
        admissible split of idx, in (feature, threshold) order."""
        cols, vals, lc, rc, wl, tot_w, distinct = self._cut_table(idx)
        admissible = distinct & (wl >= min_leaf) & (tot_w - wl >= min_leaf)
        for fi, k in zip(*(a.tolist() for a in np.nonzero(admissible.T))):  # feature, then threshold order
            yield (fi, _midway(int(vals[k, fi]), int(vals[k + 1, fi])), cols[:k + 1, fi], cols[k + 1:, fi],
                   float(lc[k, fi]), float(rc[k, fi]))

    def best_split_cost(self, idx, min_leaf) -> float:
        """The lowest left + right cost over the admissible splits of idx (the lookahead of `_grow`)."""
        _, _, lc, rc, wl, tot_w, distinct = self._cut_table(idx)
        admissible = distinct & (wl >= min_leaf) & (tot_w - wl >= min_leaf)
        return float((lc + rc)[admissible].min()) if admissible.any() else math.inf


def fit(table: Table, params: FitParams | None = None, with_heldout: bool = True, mode: str = "graph") -> Policy:
    """The policy for calls in `mode`; the graph policy carries the eager one as `.eager`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    given = params or FitParams()
    params = _leaf_params(given, table, mode)
    regions, m = _regions(table, params, mode)
    if any((r.metrics or {}).get("guarded") for r in table.rows.values() if r.baseline):
        regions = _ops_regions(table, params, mode, regions)
    regions.sort(key=lambda r: _box_key(r.bounds, m.fit))
    for r in regions:
        r.stats = region_stats(table, r, mode, guarded=r.hand_back)
    pol = Policy(table.definition, table.arch, table.baseline, regions, table, params=params,
                 measured=table.measured_range(), mode=mode, fit_names=tuple(m.fit),
                 estimated=len(m.X) - len(table.uuids))
    if with_heldout:
        pol.heldout = heldout_regret(table, given, mode)
        if pol.heldout.get("workloads") and pol.heldout["speedup_vs_baseline"] < 1.0:
            # regions that cost more than the baseline on workloads they were not fitted on would on
            # the shapes nobody measured too: the baseline serves them all
            base = Region({}, table.baseline, list(table.uuids))
            base.stats = region_stats(table, base, mode)
            pol.regions, pol.withdrawn = [base], True
    if mode == "graph":
        pol.eager = fit(table, given, with_heldout, "eager")
    return pol


def _leaf_params(params: FitParams, table: Table, mode: str = "graph") -> FitParams:
    """`params` with min_leaf raised where the definition's coverage measures each shape in several
    length mixes (prefill: random, skewed, equal). Eager calls, and fits on the call-time hints (the
    longest sequence tells the mixes apart): one more than the mixes, so that a region spans more
    than one shape (a region of one shape is placed by splits midway to shapes far away in every
    feature: with 3, pool prefill's 5-fold regret was 26.6% / 11.0% / 16.8% / 10.9% mean at 4 / 8 /
    16 / 32 value heads, with 4 21.6% / 9.5% / 16.4% / 11.8%; H100, 2026-11-26). Graph calls
    without hints: two shapes in every mix, since there the variants' times are close and which
    wins turns on the mix, which those features cannot see (eager host time mostly does not): pool
    prefill's 5-fold shapes slower than the baseline went 5 / 4 / 12 / 8 -> 3 / 3 / 6 / 6 at 32 /
    16 / 8 / 4 value heads, the speedup over it 1.42 / 1.36 / 1.18 / 1.27x -> 1.52 / 1.38 / 1.24 /
    1.38x; with 6 for eager calls too, 8 value heads' eager speedup fell 1.95 -> 1.58x (H100 rows of
    2026-11-27; the contest prefill's held). Definitions without mixes keep min_leaf: at 4 their
    5-fold regret held or grew. A one-sequence shape is measured once, its mixes being one workload
    (`Coverage.one_mix`), and counts as that many workloads (`_Matrix.leaf_w`): counted as one, a
    region of prompts needed six lengths, and the chunked kernel's window of one prompt of ~700-1,024
    tokens went unrouted (1 x 1,000 to `flashinfer.cp_off`, 16% slower; H200). Scored on both held-out stores
    (2026-11-29), graph mean regret without hints: H100 pool qk4 21.8 -> 5.4%, gathered qk4 18.4 ->
    7.6%, pool qk2 18.5 -> 10.8%, contest 6.1 -> 5.9%; H200 contest 6.3 -> 5.9%, pool qk4 14.4 ->
    18.6% (three held-out calls of 6-9 sequences, where the mix decides, changed sides), gathered qk4
    8.1 -> 8.5%; summed over the routers H100 119.6 -> 85.3%, H200 132.8 -> 136.9%; eager sums 322.3
    -> 315.9% (H100), 285.0 -> 286.2% (H200), hinted ones within 2.3 points; the same counts slower
    than the baseline."""
    spec = defs.get(table.definition).spec
    mixes = len(spec.coverage.mixes) if spec.coverage is not None else 1
    hinted = any(h in table.fit_names for h in spec.hints)
    floor = 2 * mixes if mode == "graph" and not hinted else mixes + 1
    return params if mixes < 2 or params.min_leaf >= floor else replace(params, min_leaf=float(floor))


def _regions(table: Table, params: FitParams, mode: str, guarded: bool = False,
             within: dict | None = None) -> tuple[list[Region], _Matrix]:
    """The fitted regions (tree, merge, tighten) against the baseline's row times, or its guarded
    times (`guarded`); estimated shapes only inside the box `within` (a region being refitted)."""
    m = _Matrix(table, params, mode, guarded)
    n = len(table.uuids)
    if not n:
        return [Region({}, table.baseline, [])], m
    est = defs.get(table.definition).spec.estimate
    if est is not None and set(est.features) <= set(m.fit) and m.add_estimates(est, params, within):
        tree = _grow(m, np.arange(len(m.X)), 0, replace(params, max_depth=est.max_depth))
        boxes = _merge_boxes(_leaves(tree, {}), m.fit)  # the estimates place the bounds between workloads
    else:
        boxes = _settle(_tighten(_merge_boxes(_leaves(_grow(m, np.arange(n), 0, params), {}), m.fit), m), m)
    return [Region(bounds, m.names[vj], [table.uuids[i] for i in sorted(idx) if i < n],
                   fallbacks=m.runners_up(np.array(sorted(idx)), vj) if vj
                   else m.stand_ins(np.array(sorted(i for i in idx if i < n), dtype=np.int64)))
            for bounds, vj, idx in boxes], m


def _ops_regions(table: Table, params: FitParams, mode: str, regions: list[Region]) -> list[Region]:
    """The regions of a definition whose baseline is a guarded library call (its rows time the
    engine's own call, their metrics the guarded call: see the module docstring): each region left to
    the baseline refitted on its own workloads against the guarded times, so that `kdispatch.ops`
    calls take a variant that beats the guard's extra launch there. Those sub-regions are marked
    `hand_back`: engine plugins keep the engine's kernel in them, as before."""
    out = []
    for r in regions:
        if r.variant != table.baseline or not r.uuids:
            out.append(r)
            continue
        sub, _ = _regions(table.subset(r.uuids), params, mode, guarded=True, within=r.bounds)
        for s in sub:
            bounds = _intersect(r.bounds, s.bounds)
            if _empty(bounds):
                continue
            out.append(Region(bounds, s.variant, s.uuids, fallbacks=s.fallbacks,
                              hand_back=s.variant != table.baseline))
    return out


def _intersect(a: dict, b: dict) -> dict:
    """The bounds of both boxes (feature -> (lo exclusive or None, hi inclusive or None))."""
    out = dict(a)
    for f, (lo, hi) in b.items():
        alo, ahi = out.get(f, (None, None))
        out[f] = (lo if alo is None else alo if lo is None else max(alo, lo),
                  hi if ahi is None else ahi if hi is None else min(ahi, hi))
    return out


def _inside(values: dict, bounds: dict) -> bool:
    """Whether feature values lie in the box `bounds` (feature -> (lo exclusive, hi inclusive))."""
    return all((lo is None or values[f] > lo) and (hi is None or values[f] <= hi) for f, (lo, hi) in bounds.items())


def _empty(bounds: dict) -> bool:
    """Whether no integer feature values lie in the box."""
    return any(lo is not None and hi is not None and lo >= hi for lo, hi in bounds.values())


def _grow(m: _Matrix, idx: np.ndarray, depth: int, p: FitParams):
    vj, cost = m.leaf(idx)
    leaf = ("leaf", vj, idx)
    if depth >= p.max_depth or m.leaf_w[idx].sum() < 2 * p.min_leaf:
        return leaf
    look = depth + 1 < p.max_depth
    best, best_key = None, None
    scale = max(cost, 1e-30)
    for fi, thr, li, ri, lc, rc in m.splits(idx, p.min_leaf):
        now = lc + rc
        if look:
            lc = min(lc, m.best_split_cost(li, p.min_leaf))
            rc = min(rc, m.best_split_cost(ri, p.min_leaf))
        value = lc + rc
        # Lowest value after lookahead; among equal ones (to 1e-9) the larger immediate gain, then
        # the earlier feature and lower threshold (the iteration order).
        key = (round(value / scale, 9), round(now / scale, 9))
        if best is None or key < best_key:
            best, best_key = (value, fi, thr, li, ri), key
    if best is None or best[0] >= cost - max(p.min_split_gain * cost, 1e-12 * max(cost, 1.0)):
        return leaf
    _, fi, thr, li, ri = best
    left, right = _grow(m, li, depth + 1, p), _grow(m, ri, depth + 1, p)
    if left[0] == "leaf" and right[0] == "leaf" and left[1] == right[1]:
        return ("leaf", left[1], idx)
    return ("split", fi, thr, left, right)


def _leaves(node, bounds: dict):
    if node[0] == "leaf":
        return [(dict(bounds), node[1], list(node[2]))]
    _, fi, thr, left, right = node
    lo, hi = bounds.get(fi, (None, None))
    lb = {**bounds, fi: (lo, thr if hi is None else min(hi, thr))}
    rb = {**bounds, fi: (thr if lo is None else max(lo, thr), hi)}
    return _leaves(left, lb) + _leaves(right, rb)


def _merge_boxes(boxes, fit_names):
    """Merges two boxes with the same choice that differ in one feature's adjacent intervals."""
    boxes = [(b, v, idx) for b, v, idx in boxes]
    changed = True
    while changed:
        changed = False
        for i in range(len(boxes)):
            for j in range(len(boxes)):
                if i == j or boxes[i][1] != boxes[j][1]:
                    continue
                bi, bj = boxes[i][0], boxes[j][0]
                keys = set(bi) | set(bj)
                diff = [k for k in keys if bi.get(k, (None, None)) != bj.get(k, (None, None))]
                if len(diff) != 1:
                    continue
                k = diff[0]
                (lo_i, hi_i), (lo_j, hi_j) = bi.get(k, (None, None)), bj.get(k, (None, None))
                if hi_i is not None and hi_i == lo_j:
                    nb = {**bi, k: (lo_i, hi_j)}
                    if nb[k] == (None, None):
                        del nb[k]
                    boxes[i] = (nb, boxes[i][1], boxes[i][2] + boxes[j][2])
                    del boxes[j]
                    changed = True
                    break
            if changed:
                break
    return [({fit_names[k]: v for k, v in sorted(b.items())}, vj, idx) for b, vj, idx in boxes]


def _tighten(boxes, m: _Matrix):
    """Each box of a variant other than the baseline, its split bounds pulled in between its own
    workloads and the nearest ones beyond them, inside its other bounds, where the baseline was
    chosen (to where the variant's time ratio crosses the baseline's, `_crossing`). A split is placed
    between the node's neighbouring values, often of workloads far off in another feature: a box of
    few-sequence shapes measured up to 74 tokens kept a bound of 570 set between many-sequence
    workloads, and a 4 x 128-token prefill went to a kernel 3x slower than the baseline, which was
    chosen at 719 tokens (H100, 2026-11-26). Shapes between go to the baseline.
    Bounds towards another variant's box are `_settle`'s. Open faces stay open: closing every one
    inside the measured range at the box's own workloads sent the shapes beyond to a baseline far
    slower there (held-out prefill regret, H200 rows of 2026-11-29: contest graph 5.9 -> 52.7%
    mean, pool qk4 eager 10.3 -> 140.1%) to spare three eager calls slower than it."""
    rivals = np.zeros(len(m.X), dtype=bool)
    for _bounds, vj, idx in boxes:
        if vj == 0:
            rivals[idx] = True
    out = []
    for bounds, vj, idx in boxes:
        if vj == 0 or not idx:
            out.append((bounds, vj, idx))
            continue
        tight = dict(bounds)
        for name, (lo, hi) in bounds.items():
            if feats.is_bool(m.t.definition, name):
                continue
            near = rivals.copy()
            for other, (olo, ohi) in bounds.items():
                x = m.X[:, m.fit.index(other)]
                if other != name and olo is not None:
                    near &= x > olo
                if other != name and ohi is not None:
                    near &= x <= ohi
            fi = m.fit.index(name)
            x, own = m.X[near, fi], m.X[idx, fi]
            above, below = x[x > own.max()], x[x < own.min()]
            inner, outer = np.asarray(idx), np.nonzero(near)[0]
            if hi is not None and above.size:
                hi = min(hi, _crossing(m, vj, fi, inner, outer, int(own.max()), int(above.min())))
            if lo is not None and below.size:
                lo = max(lo, _crossing(m, vj, fi, inner, outer, int(own.min()), int(below.max())))
            tight[name] = (lo, hi)
        out.append((tight, vj, idx))
    return out


def _settle(boxes, m: _Matrix):
    """The faces `_tighten` leaves: where a box of one variant and a box of another (neither the
    baseline) meet on a feature's split, and each is the other's only neighbour across it, the shared
    bound moves, in both boxes, from the split to where the two variants' times cross between their
    nearest workloads (`_crossing` against the neighbour). A split sits midway between the node's
    neighbouring values; when the two are far apart, the shapes between went to whichever side the
    midpoint gave them (pool prefill, 2 value heads, eager: the fused kernel's box reached 5,116
    tokens, its workloads stopping at 2,048, and a 66 x 4,391 call took 569 us against its
    neighbour's 399; H200, 2026-11-28)."""
    out = [(dict(b), vj, idx) for b, vj, idx in boxes]
    for i in range(len(out)):
        bi, vi, ii = out[i]
        if vi == 0 or not ii:
            continue
        for name in list(bi):
            lo, hi = bi[name]
            if hi is None or feats.is_bool(m.t.definition, name):
                continue
            ahead = [j for j, (bj, _, _) in enumerate(out) if j != i and bj.get(name, (None, None))[0] == hi
                     and _touch(bi, bj, name)]
            if len(ahead) != 1:
                continue
            j = ahead[0]
            bj, vk, ij = out[j]
            behind = [k for k, (bk, _, _) in enumerate(out) if k != j and bk.get(name, (None, None))[1] == hi
                      and _touch(bk, bj, name)]
            if vk in (0, vi) or not ij or behind != [i]:
                continue
            fi = m.fit.index(name)
            a, b = int(m.X[ii, fi].max()), int(m.X[ij, fi].min())
            if not a <= hi < b:
                continue
            t = _crossing(m, vi, fi, np.asarray(ii), np.asarray(ij), a, b, against=vk)
            bi[name], bj[name] = (lo, t), (t, bj[name][1])
    return out


def _touch(a: dict, b: dict, along: str) -> bool:
    """Whether two boxes overlap in every feature but `along` (bounds: lo exclusive, hi inclusive)."""
    for f in (set(a) | set(b)) - {along}:
        (alo, ahi), (blo, bhi) = a.get(f, (None, None)), b.get(f, (None, None))
        lo = max((v for v in (alo, blo) if v is not None), default=-math.inf)
        hi = min((v for v in (ahi, bhi) if v is not None), default=math.inf)
        if lo >= hi:
            return False
    return True


def _crossing(m: _Matrix, vj: int, fi: int, inner, outer, a: int, b: int, against: int = 0) -> int:
    """The threshold on feature `fi` between a box's own edge value `a` (variant vj chosen) and the
    nearest value `b` where the baseline (or the variant `against`) was chosen: where vj's time over
    that one's, in log-log between its mean at a (own workloads) and at b (the other's), crosses 1;
    the geometric midpoint where that cannot be estimated (vj not measured at b, or not losing there,
    or the other not measured at a). Returned as the bound beyond which the other takes over: the
    last value of the box's side (a <= t < b
    when b > a; b <= t < a when b < a, a lower bound being exclusive). The times fall steeply on one
    side of a crossover: 32 value heads, 16 sequences, the chunked kernel 0.85x the baseline's time
    at 32 tokens a sequence and 1.7x at 128; the midpoint (64) sent 64-token sequences to it, 1.10x
    slower than the baseline (H100, 2026-11-26)."""
    def log_ratio(rows, at: int) -> float:
        rows = rows[m.X[rows, fi] == at]
        r = m.lat[vj, rows] / m.lat[against, rows]
        r = r[np.isfinite(r) & (r > 0)]
        return float(np.log(r).mean()) if r.size else math.nan
    lo_v, hi_v = min(a, b), max(a, b)
    la, lb = log_ratio(inner, a), log_ratio(outer, b)
    if not (la < 0 < lb) or lo_v <= 0:
        return _midway(lo_v, hi_v)
    t = math.exp(math.log(a) + la / (la - lb) * (math.log(b) - math.log(a)))
    return min(max(int(t), lo_v), hi_v - 1)


def _midway(a: int, b: int) -> int:
    """The threshold between tuned values a < b (a <= t < b): their geometric mean, rounded down
    (the arithmetic one where a value is not positive)."""
    return math.isqrt(a * b) if a > 0 else (a + b) // 2


def _box_key(bounds: dict, fit_names):
    key = []
    for f in fit_names:
        lo, hi = bounds.get(f, (None, None))
        key.append((-math.inf if lo is None else lo, math.inf if hi is None else hi))
    return tuple(key)


# ----------------------------------------------------------------------------------------------
# Numbers for the header and the report
# ----------------------------------------------------------------------------------------------

def region_stats(t: Table, r: Region, mode: str = "graph", guarded: bool = False) -> dict:
    """Speedup of the region's choice over the baseline on its workloads (min, geomean, max), in `mode`
    (`guarded`: over the guarded baseline's times, what kdispatch.ops would run instead)."""
    sp = []
    for u in r.uuids:
        b, v = timed(t.rows.get((t.baseline, u)), mode, guarded), timed(t.rows.get((r.variant, u)), mode)
        if b is not None and v is not None and v.median_us > 0:
            sp.append(b.median_us / v.median_us)
    if not sp:
        return {"workloads": len(r.uuids), "speedup": None}
    return {"workloads": len(r.uuids),
            "speedup": (round(min(sp), 2), round(geomean(sp), 2), round(max(sp), 2))}


def variant_summary(t: Table) -> dict[str, dict]:
    """Per variant: workloads passed / measured, screened out (several times slower there, tuner/job.py),
    failed and the first failure reason, geomean speedup over baseline."""
    out = {}
    for name in t.variants:
        rows = [t.rows[(name, u)] for u in t.uuids if (name, u) in t.rows]
        passed = [r for r in rows if r.passed]
        failed = [r for r in rows if not r.passed and not r.screened]
        sp = []
        for r in passed:
            b = t.rows.get((t.baseline, r.uuid))
            if b is not None and b.passed and r.median_us > 0:
                sp.append(b.median_us / r.median_us)
        out[name] = {"hash": t.hashes.get(name, ""), "measured": len(rows), "passed": len(passed),
                     "screened": sum(1 for r in rows if r.screened), "failed": len(failed),
                     "first_failure": f"{failed[0].status}: {failed[0].reason}"[:120] if failed else "",
                     "not_graph_safe": sum(1 for r in passed if not r.routable),
                     "geomean_speedup": (round(geomean(sp), 3) if sp else None)}
    return out


def _fold_of(key: str, k: int) -> int:
    """A workload's fold: by its uuid, so that its rows of several devices are held out together."""
    return int(hashlib.sha256(workload_of(key).encode()).hexdigest()[:8], 16) % k


def heldout_regret(t: Table, params: FitParams | None = None, mode: str = "graph") -> dict:
    """k-fold regret in `mode`: fit without each fold, route its workloads, compare with the best
    measured there."""
    params = params or FitParams()
    k = min(params.folds, len(t.uuids))
    if k < 2:
        return {"folds": k, "workloads": 0}
    acc = _RegretSum()
    for fold in range(k):
        held = [u for u in t.uuids if _fold_of(u, k) == fold]
        train = [u for u in t.uuids if _fold_of(u, k) != fold]
        if held and train:
            acc.add(fit(t.subset(train), params, with_heldout=False, mode=mode), t, held, mode, params.min_gain)
    return {"folds": k, **acc.summary()}


def measured_regret(policy: Policy, t: Table, mode: str = "graph") -> dict:
    """The regret of a fitted policy (of its `mode`) on another measured set `t` of the same
    definition and architecture (e.g. the held-out workloads, measured with every variant and never
    fitted on): what `kdispatch bench` would report, without running the routed op."""
    return measured_regret_of([(policy, t)], mode)


def measured_regret_of(parts, mode: str = "graph", fast_host: bool = False) -> dict:
    """`measured_regret` summed over [(policy, table)] pairs (each device's rows with its policy).
    `fast_host` (eager): every row's host part (eager - graph time) at the policy's
    `FitParams.fast_host` of the measured, as on a faster host than the check store's (a bench
    host's baselines took 0.35-1.15x their stored eager times, 2026-11-30): where host-light
    variants chosen for a slow host's baseline fall behind it."""
    acc = _RegretSum()
    for policy, t in parts:
        pol = policy.eager if mode == "eager" and policy.eager is not None else policy
        acc.add(pol, t, t.uuids, mode, policy.params.min_gain,
                host_scale=policy.params.fast_host if fast_host else None)
    return acc.summary()


class _RegretSum:
    """Routed vs best vs baseline over workloads, as the dispatcher would route them: the first
    variant of the region's chain that accepts the shape (its `supports`), or, in a region that
    hands calls back, the engine's own kernel (what a plugin runs; every time here is the row's).
    The summary names the call with the largest regret (`worst`): where a router is short, that call
    says which shape and which variants to look at."""

    def __init__(self):
        self.regrets, self.chosen, self.best, self.base = [], 0.0, 0.0, 0.0
        self.slower, self.unsafe = [], []
        self.worst = None

    def add(self, pol: Policy, t: Table, uuids, mode: str, min_gain: float, host_scale: float | None = None) -> None:
        at = (lambda x: timed(x, mode)) if host_scale is None else (lambda x: _on_host(x, host_scale))  # noqa: E731
        for u in uuids:
            b = at(t.rows.get((t.baseline, u)))
            if b is None:
                continue
            name = t.baseline if pol.hands_back(t.features[u]) else _dispatched(pol, t, u)
            row = t.rows.get((name, u))
            r = at(row)
            if r is None and row is not None and row.screened:  # screened out there: its rough time
                r = _screen_time(row.screened, mode)
            if name != t.baseline and (r is None or (mode == "graph" and not row.routable and not row.screened)):
                self.unsafe.append(u)  # routed to a variant that failed (or was not measured) here
                r = b
            best, best_name = min((at(x).median_us, v) for (v, uu), x in t.rows.items()
                                  if uu == u and at(x) is not None and (mode == "eager" or x.routable or v == t.baseline))
            self.regrets.append(r.median_us / best - 1.0)
            if self.worst is None or self.regrets[-1] > self.worst["regret_pct"] / 100:
                self.worst = {"features": dict(t.features[u]), "regret_pct": 100 * self.regrets[-1],
                              "routed": name, "routed_us": r.median_us, "best": best_name, "best_us": best,
                              "baseline_us": b.median_us}
            self.chosen += r.median_us
            self.best += best
            self.base += b.median_us
            if name != t.baseline and r is not b and slower(r, b, min_gain):
                self.slower.append(u)

    def summary(self) -> dict:
        if not self.regrets:
            return {"workloads": 0}
        return {"workloads": len(self.regrets),
                "regret_mean_pct": round(100 * sum(self.regrets) / len(self.regrets), 2),
                "regret_max_pct": round(100 * max(self.regrets), 2),
                "regret_total_pct": round(100 * (self.chosen / self.best - 1.0), 2),
                "speedup_vs_baseline": round(self.base / self.chosen, 3),
                "slower_than_baseline": len(self.slower), "unsafe": len(self.unsafe),
                "worst": {k: round(v, 2) if isinstance(v, float) else v for k, v in self.worst.items()}}


def _declines(definition: str, name: str, features: dict) -> bool:
    """Does variant `name` decline a shape with these features (its `supports`)? Not where it is not
    registered here (its rows came from another machine: measured, it ran)."""
    try:
        return registry.get(definition, name).declines(features) is not None
    except KeyError:
        return False


def _on_host(r, host_scale: float) -> Timed | None:
    """Row r's eager time with its host part (eager - graph median) at `host_scale` of the measured:
    the median and both percentiles less the same host time (`measured_regret_of`'s `fast_host`)."""
    e, g = timed(r, "eager"), timed(r, "graph")
    if e is None or g is None:
        return e
    cut = (1.0 - host_scale) * max(e.median_us - g.median_us, 0.0)
    return Timed(e.median_us - cut, None if e.p10_us is None else e.p10_us - cut,
                 None if e.p90_us is None else e.p90_us - cut)


def _screen_time(screened: dict, mode: str) -> Timed | None:
    """A screened-out row's rough time in `mode` (None: graph, not capturable)."""
    x = screened["graph_us" if mode == "graph" else "eager_us"]
    return None if x is None else Timed(x, x, x)


def _dispatched(pol: Policy, t: Table, u: str) -> str:
    """The first variant of u's chain that accepts u's shape (one not registered here is taken as
    measured: it ran there)."""
    for name in pol.chain(t.features[u]):
        try:
            if registry.get(t.definition, name).declines(t.axes[u]) is None:
                return name
        except KeyError:
            return name
    return t.baseline
