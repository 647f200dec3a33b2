"""Shape features per definition: the variable axes plus derived integers, in one table.

A derived feature is a Python expression over the definition's variable axes (and nothing else:
no tensor values, no imports), so the router compiler can paste it verbatim into the generated
router, and the fitter evaluates exactly the same expression on every workload's axes.

`fit` names the features the region fitter may split on, in tie-breaking order (a split on an
earlier feature wins a tie); `main` is the feature on the x axis of the report's plots. Variable
axes that are missing from `fit` are pool sizes (`num_pages`) or redundant (`len_cu_seqlens`):
they do not change what a kernel costs, and a threshold on them would only fit noise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdispatch import definitions

PAGE_SIZE = 64
TOPK = 2048


@dataclass(frozen=True)
class Derived:
    expr: str  # Python expression over the variable axes
    doc: str
    is_bool: bool = False  # a predicate: the router tests it with `if x` / `if not x`


@dataclass(frozen=True)
class FeatureSpec:
    definition: str
    fit: tuple[str, ...]  # features the fitter may split on, in tie-breaking order
    main: str  # x axis of the report plots
    derived: dict[str, Derived] = field(default_factory=dict)


SPECS: dict[str, FeatureSpec] = {s.definition: s for s in (
    FeatureSpec("gdn_decode_qk4_v8_d128_k_last", fit=("batch_size",), main="batch_size"),
    FeatureSpec(
        "gdn_prefill_qk4_v8_d128_k_last",
        fit=("total_seq_len", "mean_seq_len", "num_seqs"),
        main="total_seq_len",
        derived={"mean_seq_len": Derived("total_seq_len // max(num_seqs, 1)", "mean tokens per sequence")},
    ),
    FeatureSpec(
        "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64",
        fit=("kv_fits_topk", "batch_size", "max_num_pages", "kv_pages"),
        main="max_num_pages",
        derived={
            "kv_fits_topk": Derived(f"max_num_pages * {PAGE_SIZE} <= {TOPK}",
                                    "every cached token is selected (no top-k needed, -1 padding)", is_bool=True),
            "kv_pages": Derived("batch_size * max_num_pages", "block-table entries of the batch (work)"),
        },
    ),
    FeatureSpec("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", fit=("num_tokens",), main="num_tokens"),
    FeatureSpec("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", fit=("seq_len",), main="seq_len"),
)}

_BUILTINS = {"max": max, "min": min, "abs": abs}


def spec(definition: str) -> FeatureSpec:
    return SPECS[definitions.resolve_name(definition)]


def var_axes(definition: str) -> list[str]:
    """The definition's variable axes in definition order (the router's parameters)."""
    d = definitions.load(definition)
    return [k for k, a in d["axes"].items() if a["type"] == "var"]


def compute(definition: str, axes: dict) -> dict[str, int]:
    """Every feature (variable axes, then derived ones) of one shape, as ints (predicates as 0/1)."""
    s = spec(definition)
    out = {k: int(axes[k]) for k in var_axes(definition) if k in axes}
    for name, d in s.derived.items():
        out[name] = int(eval(d.expr, {"__builtins__": _BUILTINS}, dict(out)))  # our own table's expressions
    return out


def is_bool(definition: str, feature: str) -> bool:
    d = spec(definition).derived.get(feature)
    return bool(d and d.is_bool)
