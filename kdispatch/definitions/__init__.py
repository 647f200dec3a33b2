"""The five contest operator definitions, in the FlashInfer-Bench Definition JSON format.

Each `<op_type>/<name>.json` here is the single source of truth for an operator's axes, inputs,
outputs and constraints. Its `reference` field holds the text of `kdispatch/references/<short>.py`
(kept identical by `python -m kdispatch.definitions sync`, and checked by the tests).

Plain dicts are returned so that `import kdispatch` never pulls in pydantic or flashinfer_bench;
`as_fib(name)` gives the validated `flashinfer_bench.data.Definition` when that package is there.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent

# Short names (kdispatch.ops.<short>) <-> full definition names.
SHORT_NAMES = {
    "moe_fp8": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
    "dsa_topk_indexer": "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64",
    "dsa_sparse_attention": "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64",
    "gdn_decode": "gdn_decode_qk4_v8_d128_k_last",
    "gdn_prefill": "gdn_prefill_qk4_v8_d128_k_last",
}
FULL_TO_SHORT = {full: short for short, full in SHORT_NAMES.items()}


def resolve_name(name: str) -> str:
    """Full definition name for a full or short name; ValueError naming the known ones otherwise."""
    if name in FULL_TO_SHORT:
        return name
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    raise ValueError(f"unknown definition {name!r}; known: {sorted(SHORT_NAMES)} or {sorted(FULL_TO_SHORT)}")


@lru_cache(maxsize=None)
def _paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_HERE.glob("*/*.json"))}


def names() -> list[str]:
    """Full names of every shipped definition."""
    return list(_paths())


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The definition as a plain dict (do not mutate: it is cached)."""
    return json.loads(_paths()[resolve_name(name)].read_text())


def path(name: str) -> Path:
    return _paths()[resolve_name(name)]


def reference_path(name: str) -> Path:
    """The project's reference implementation module whose text is the definition's `reference`."""
    return _HERE.parent / "references" / f"{FULL_TO_SHORT[resolve_name(name)]}.py"


def as_fib(name: str):
    """The definition validated as a `flashinfer_bench.data.Definition`."""
    from flashinfer_bench.data import Definition

    return Definition.model_validate(load(name))
