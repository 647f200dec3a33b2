"""What code needs to know about one definition beyond its JSON: the operator spec.

The JSON (kdispatch/definitions/<op_type>/<name>.json, FlashInfer-Bench format) holds axes, inputs,
outputs, constraints and the reference's text. Everything else lives in one `Spec` per definition,
beside the JSON in `kdispatch/definitions/<op_type>/spec.py`:

- serving facts: the model's scalar arguments and an input builder that makes valid calls with the
  served model's magnitudes (`kdispatch.workloads.materialize` calls it);
- routing facts: derived shape features (Python expressions over the axes, pasted verbatim into the
  generated routers) and which features the fitter may split on;
- layout facts: inputs that may arrive as strided views (last dimension contiguous);
- correctness facts: outputs that are inputs updated in place, inputs shared between calls (pools,
  weights), tolerances, a special check where elementwise comparison is not the contract, and the
  value rules of index inputs that the checked mode (KDISPATCH_CHECK=1) enforces;
- timing facts: which input rotates between timed sets and how, the bytes a set reads, whether the
  reference can be captured in a CUDA graph, how much a variant's time varies between processes;
- the floor: bytes and FLOPs one call cannot avoid, for the benchmarks' fraction-of-floor numbers;
- coverage: the ranges of shapes serving engines send, beyond the contest's (`traces/coverage.py`
  samples a tuned coverage set and a held-out set from them), and where the fitter places regions
  by estimated times between the measured shapes.

Adding a definition = its JSON + a reference module + a spec + variants; nothing in `tuner/` changes.
Hooks take inputs by name (`args["state"]`), so a spec never depends on argument positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kdispatch.checks import Tol


@dataclass(frozen=True)
class Derived:
    """A shape feature computed from the axes: `expr` is a Python expression over the variable
    and constant axes (no tensors, no imports), evaluated by the fitter and pasted into routers."""

    expr: str
    doc: str
    is_bool: bool = False  # a predicate: routers test it with `if x` / `if not x`


@dataclass(frozen=True)
class Hint:
    """A fact about a call that its shapes do not show but an engine knows on the host before the
    call (the longest sequence of a packed batch): an optional keyword argument of the op, which the
    router's `route_hinted` (fitted with it as one more feature, tuner/fit.py `Table.with_hints`)
    answers calls that pass it from. `value(axes, inputs, ctx)` computes it for a workload from its
    given inputs and the workload's context (the spec's builder draws the other inputs from the same
    context): `kdispatch.workloads.hint_values`."""

    doc: str
    value: Callable[[dict, dict, object], int]


@dataclass(frozen=True)
class Rotation:
    """How timed input sets differ, so that no set is still in L2 when its turn comes.

    `make(args, i, n)` returns the rotated input of set i of n (args by name). Set 0 keeps the
    original unless the input is updated in place, in which case every set gets its own copy and
    timing never writes into the caller's tensors. `set_bytes(args)`: HBM bytes one call reads
    that differ between sets."""

    input: str
    make: Callable[[dict, int, int], object]
    set_bytes: Callable[[dict], int]
    max_sets: int | None = None  # a cap the rotation itself imposes (distinct sets it can make)


@dataclass(frozen=True)
class Floor:
    """What one call must at least move from HBM and compute (bytes, FLOPs)."""

    bytes: int
    flops: int = 0


@dataclass(frozen=True)
class Coverage:
    """The shapes serving engines send: what `traces/coverage.py` samples, log-uniformly, into a
    coverage set (tuned on) and a held-out set (never tuned on).

    `ranges`: variable axis -> (lo, hi), inclusive. `points`: shapes in the coverage set (a
    log-spaced grid when one axis varies; else every corner of the box, then stratified draws);
    `heldout`: shapes in the held-out set (seeded draws). `complete(axes)` returns the drawn axes
    with every other variable axis filled in (a cache pool's size), or None where the combination
    cannot occur (more sequences than tokens). `mixes`: ways to fill the inputs of one shape (e.g.
    prefill sequence-length mixes), taken in turn; `mix(axes, name, g)` -> {input: tensor} stored
    with the workload (an empty dict: the spec's builder draws the inputs). `grid`: axis -> values
    whose product is added to the coverage set after the `points` (where kernels cross over and
    random draws are too sparse to place the boundary), then the products of `more_grids` (finer
    steps in a part of the box); with `grid_every_mix`, each grid shape is measured in every mix
    (where the mix decides the winner, the fitter must see them all), except a shape for which
    `one_mix(axes)` says every mix gives the same workload (one sequence has one length mix)."""

    ranges: dict[str, tuple[int, int]]
    points: int
    heldout: int
    complete: Callable[[dict], dict | None] = dict
    mixes: tuple[str, ...] = ("random",)
    mix: Callable | None = None
    grid: dict[str, tuple[int, ...]] = field(default_factory=dict)
    more_grids: tuple[dict[str, tuple[int, ...]], ...] = ()
    grid_every_mix: bool = False
    one_mix: Callable[[dict], bool] | None = None


@dataclass(frozen=True)
class Estimate:
    """Where the fit features decide what a call costs but the coverage measures them sparsely (pool
    prefill with the longest sequence known), the fitter also places regions by estimated times
    (tuner/estimate.py): each variant's log time by local-linear regression in the logs of
    `features` over its measured workloads (Gaussian weights, `bandwidth` in natural-log units), at
    every shape of `grid`. `grid(ranges, measured)`: {feature: (lo, hi) measured}, {feature: its
    measured values, sorted; empty for eager fits} -> the valid shapes ({feature: value}) of a
    log-spaced grid inside them. Applies to a fit whose features include all of `features` (a
    feature that is a call-time hint: the hinted fit only). `max_depth`: the region tree's depth on
    the denser points. A bandwidth of 0.75 for the prefills, to resolve the contest prefill's window
    of one 700-1,024-token sequence (the chunked kernel's), scored worse on both held-out stores
    (2026-11-29: hinted graph mean regrets summed H200 24.4 -> 51.6%, H100 26.1 -> 38.7%)."""

    features: tuple[str, ...]
    grid: Callable[[dict[str, tuple[int, int]], dict[str, list[int]]], list[dict[str, int]]]
    bandwidth: float = 1.5
    max_depth: int = 6


def log_steps(lo: int, hi: int) -> list[int]:
    """lo, the powers of two strictly between, and hi (a grid axis of `Estimate.grid`)."""
    out, p = [lo], 1
    while p < hi:
        if p > lo:
            out.append(p)
        p *= 2
    return out + ([hi] if hi > lo else [])


@dataclass(frozen=True)
class Spec:
    short: str  # kdispatch.ops.<short>, and the name users type
    family: str  # kernels/<backend>/<family>/ holds its variants
    build: Callable[[dict, dict, object], dict]  # (axes, given inputs, workloads.Context) -> generated inputs
    fit: tuple[str, ...]  # features the region fitter may split on, in tie-breaking order
    main: str  # the feature on the x axis of plots and for spreading quick subsets
    reference: str  # module whose `run` is the reference (its text is the JSON's `reference`)
    derived: dict[str, Derived] = field(default_factory=dict)
    # call-time facts engines know but shapes do not show (see Hint)
    hints: dict[str, Hint] = field(default_factory=dict)
    model_scalars: dict[str, float | int] = field(default_factory=dict)
    in_place: dict[str, str] = field(default_factory=dict)  # output -> the input it is written into
    # inputs a call may pass as views whose last dimension is contiguous (engines split q/k/v out of
    # one packed projection); every other tensor input must be contiguous. Variants declaring
    # `strided=True` honour such strides; the dispatcher passes the others over for strided calls.
    strided: frozenset = frozenset()
    shared: frozenset = frozenset()  # inputs shared across calls and never written (not copied per trial)
    tolerances: dict[str, Tol] = field(default_factory=dict)  # per output; default Tol(1e-2, 1e-2)
    # (args, outputs, reference) -> checks.Verdict, all by name; None: elementwise with `tolerances`
    check: Callable | None = None
    # (args) -> extra facts the check needs from the reference side (computed once per trial)
    reference_extra: Callable[[dict], dict] | None = None
    rotation: Rotation | None = None
    reference_graph_safe: bool = True  # False: the reference syncs with the host (never captured)
    # variant -> fraction its time varies between processes (it must beat the baseline by at least that)
    run_to_run: dict[str, float] = field(default_factory=dict)
    floor: Callable[[dict, dict], Floor] | None = None  # (args, axes) -> Floor
    # constraints the ops add to the JSON's (which stays the official definition's), in its syntax
    constraints: tuple[str, ...] = ()
    # (args) -> None, or (argument, what is wrong at its first bad position): the value rules of index
    # inputs, which kernels otherwise treat as padding; run on every call in the checked mode (syncs)
    check_values: Callable[[dict], tuple[str, str] | None] | None = None
    coverage: Coverage | None = None  # the shapes engines send (tuned beyond the contest's)
    estimate: Estimate | None = None  # regions also placed by estimated times (see Estimate)

    def tolerance(self, output: str) -> Tol:
        return self.tolerances.get(output, DEFAULT_TOL)


DEFAULT_TOL = Tol(1e-2, 1e-2)  # FlashInfer-Bench's default
