"""Workloads: turn a FlashInfer-Bench workload (axis values + input specs) into real arguments.

    from kdispatch.workloads import load_workloads, materialize
    for w in load_workloads("traces", "gdn_prefill"):
        args = materialize("gdn_prefill", w, device="cuda")      # definition input order

A FlashInfer-Bench "random" input is plain noise (random ints for `seq_lens`, `block_table`,
`cu_seqlens`, `sparse_indices`), which is not a valid call of these operators. `materialize` instead
builds inputs that satisfy every structural invariant of the operator and have the magnitudes of the
served models (DeepSeek-V3/V3.2, Qwen3-Next):

- values are generated on the CPU from a `torch.Generator` seeded by a stable hash of
  (uuid, seed, input name), then moved to the device: CPU and CUDA get identical bytes, and one
  input's values do not depend on which other inputs a workload stores;
- `{"type": "safetensors", "path", "tensor_key"}` inputs are loaded (path relative to `trace_root`),
  shape- and dtype-checked, and the generated inputs that depend on them are built around them
  (a stored `seq_lens` gets a matching `block_table`, a stored `cu_seqlens` fixes the sequences);
- `{"type": "scalar"}` inputs are taken as given; a scalar the workload does not give (or gives as
  "random") gets the model's value from `MODEL_SCALARS`;
- the big cache pools (indexer `k_index_cache_fp8`, sparse-attention `ckv_cache`/`kpe_cache`) depend
  on (num_pages, seed) but not on the uuid, like the one KV pool a serving engine keeps across
  batches: workloads of one pool size share one tensor per device (the most recent pool size is
  kept), which saves seconds of CPU generation per workload. The MoE weights are shared the same way
  (see below). `clear_cache()` frees both. Never write into these shared tensors.

Invariants per operator (what the tests check):

- GDN: q, k L2-normalised per head; state a decayed sum of rank-1 writes (what a real mid-sequence
  state looks like); A_log = log(U(1, 16)); dt_bias = softplus^-1 of a log-uniform dt in
  [1e-3, 1e-1] (the Mamba-2 initialisation; with these the decays span (0, 1)); prefill `cu_seqlens`
  splits `total_seq_len` into `num_seqs` non-empty sequences at random cut points.
- DSA indexer: every sequence has 1 .. max_num_pages * 64 tokens and the longest reaches the last
  block-table column; block-table pages are distinct across the batch (padding columns hold further
  distinct pages while the pool lasts, then any valid page); the FP8 key cache is real per-token
  quantisation (scale = amax / 448) in the deep_gemm page layout (`quantize_index_keys`); queries
  are quantised per (token, head) and that scale is folded into `weights` as SGLang does.
- DSA sparse attention: each row of `sparse_indices` is the top-k selection of one sequence: distinct
  real token ids page * 64 + slot of that sequence's (distinct) pages, in score (= random) order;
  a sequence shorter than 2048 tokens selects all its tokens and pads the tail with -1. At least one
  row is such a short one when num_tokens >= 2.
- MoE: real block quantisation of activations ([56, T] scales) and weights (per 128 x 128 block,
  amax -> 448, so FP8 values use the whole range and the scales come out ~1e-4); weights
  N(0, 1/fan_in) so outputs are O(1); routing logits N(0, 1), so a rank gets about
  8 * 32 / 256 = 1 expert per token, and at least one token always reaches a local expert. The weights (~1.4 GB) do not
  depend on the workload: they are built once per (definition, device) and shared by every call.

This module imports torch at the top (it is imported lazily by `kdispatch`), flashinfer_bench and
safetensors only inside the functions that need them.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from kdispatch import definitions as _defs

FP8_MAX = 448.0  # largest finite float8_e4m3fn
PAGE_SIZE = 64
TOPK = 2048
INDEX_HEAD_DIM = 128

GDN_DECODE = "gdn_decode_qk4_v8_d128_k_last"
GDN_PREFILL = "gdn_prefill_qk4_v8_d128_k_last"
DSA_INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
DSA_SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
MOE_FP8 = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"

# The served models' scalar arguments (also what traces/build.py writes into every workload).
MODEL_SCALARS: dict[str, dict[str, int | float]] = {
    GDN_DECODE: {"scale": 1.0 / math.sqrt(128)},  # Qwen3-Next: 1/sqrt(head_size)
    GDN_PREFILL: {"scale": 1.0 / math.sqrt(128)},
    # The official definition's value, 1/sqrt(qk_nope 128 + rope 64). (DeepSeek-V3.2 itself also
    # multiplies by the YaRN mscale^2 = (0.1 ln 40 + 1)^2 ~ 1.87; the contest keeps the plain value.)
    DSA_SPARSE: {"sm_scale": 1.0 / math.sqrt(192)},
    MOE_FP8: {
        "routed_scaling_factor": 2.5,  # DeepSeek-V3
        # Rank 0 of EP8. Synthetic routing is symmetric over the 256 experts, so every rank sees the
        # same token -> expert mass and rank 0 is as representative as any other offset.
        "local_expert_offset": 0,
    },
}

# Shared tensors that do not depend on the workload's uuid (see the module docstring):
# (definition, input, device) -> ((pool size, seed), tensor), one pool per slot; and the MoE weights.
_POOLS: dict[tuple[str, str, str], tuple[tuple, torch.Tensor]] = {}
_MOE_WEIGHTS: dict[tuple[str, str], dict[str, torch.Tensor]] = {}


def clear_cache() -> None:
    """Frees the shared cache pools and MoE weights (rebuilt, identically, when next needed)."""
    _POOLS.clear()
    _MOE_WEIGHTS.clear()


_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


# ----------------------------------------------------------------------------------------------
# Workload and definition plumbing
# ----------------------------------------------------------------------------------------------

@dataclass
class SimpleWorkload:
    """What `load_workloads` returns when flashinfer_bench is not installed (same attributes)."""

    axes: dict[str, int]
    inputs: dict[str, dict] = field(default_factory=dict)
    uuid: str = ""


def _definition(definition) -> dict:
    if isinstance(definition, str):
        return _defs.load(definition)
    if isinstance(definition, dict):
        return definition
    if hasattr(definition, "model_dump"):  # flashinfer_bench.data.Definition
        return definition.model_dump(mode="json")
    raise TypeError(f"definition must be a name, a dict or a Definition, got {type(definition).__name__}")


def _spec_dict(spec) -> dict:
    if isinstance(spec, dict):
        return spec
    if hasattr(spec, "model_dump"):
        return spec.model_dump(mode="json")
    raise TypeError(f"input spec must be a dict or a flashinfer_bench InputSpec, got {type(spec).__name__}")


def _workload_parts(workload) -> tuple[dict, dict, str]:
    """(axes, inputs as plain dicts, uuid) of a Workload, a Trace, or their JSON dicts."""
    if isinstance(workload, dict):
        if "workload" in workload:  # a Trace line
            workload = workload["workload"]
        axes, inputs, uuid = workload.get("axes", {}), workload.get("inputs", {}) or {}, workload.get("uuid")
    else:
        if hasattr(workload, "workload") and not hasattr(workload, "axes"):  # a flashinfer_bench Trace
            workload = workload.workload
        axes, inputs, uuid = workload.axes, workload.inputs or {}, workload.uuid
    if not uuid:
        raise ValueError("workload has no uuid (inputs are derived from it)")
    return dict(axes), {k: _spec_dict(v) for k, v in inputs.items()}, str(uuid)


def _resolve_axes(defn: dict, given: dict) -> dict[str, int]:
    axes = {k: int(a["value"]) for k, a in defn["axes"].items() if a["type"] == "const"}
    var = [k for k, a in defn["axes"].items() if a["type"] == "var"]
    given = {k: int(v) for k, v in given.items()}
    for k, v in given.items():
        if k not in defn["axes"]:
            raise ValueError(f"{defn['name']}: workload axis {k!r} is not an axis of the definition")
        if k in axes and axes[k] != v:
            raise ValueError(f"{defn['name']}: constant axis {k} = {axes[k]}, workload says {v}")
        if v < 0:
            raise ValueError(f"{defn['name']}: axis {k} = {v} is negative")
    if "len_cu_seqlens" in var and "len_cu_seqlens" not in given and "num_seqs" in given:
        given["len_cu_seqlens"] = given["num_seqs"] + 1
    missing = [k for k in var if k not in given]
    if missing:
        raise ValueError(f"{defn['name']}: workload lacks the axes {missing}")
    axes.update(given)
    if "len_cu_seqlens" in axes and axes["len_cu_seqlens"] != axes["num_seqs"] + 1:
        raise ValueError(f"{defn['name']}: len_cu_seqlens = {axes['len_cu_seqlens']} != num_seqs + 1 = "
                         f"{axes['num_seqs'] + 1}")
    return axes


def _shape(spec: dict, axes: dict) -> list[int] | None:
    return None if spec["shape"] is None else [axes[a] for a in spec["shape"]]


def stable_seed(uuid: str, seed: int, stream: str) -> int:
    """A 63-bit generator seed from (uuid, seed, stream name), stable across runs and machines."""
    digest = hashlib.sha256(f"{uuid}\x00{int(seed)}\x00{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _load_safetensors(name: str, spec: dict, shape, dtype, trace_root) -> torch.Tensor:
    from safetensors import safe_open

    path = Path(spec["path"])
    if trace_root is not None and not path.is_absolute():
        path = Path(trace_root) / path
    with safe_open(str(path), framework="pt", device="cpu") as f:
        if spec["tensor_key"] not in f.keys():
            raise ValueError(f"input {name!r}: no tensor {spec['tensor_key']!r} in {path}")
        t = f.get_tensor(spec["tensor_key"])
    if list(t.shape) != shape:
        raise ValueError(f"input {name!r} from {path}: expected shape {shape}, got {list(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"input {name!r} from {path}: expected dtype {dtype}, got {t.dtype}")
    return t.contiguous()


def _device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


@dataclass
class _Context:
    """What a builder needs besides the axes: per-input generators and the shared pools."""

    definition: str
    uuid: str
    seed: int
    device: torch.device

    def rng(self, stream: str) -> torch.Generator:
        """A CPU generator for one input (or group of inputs built together) of this workload."""
        return torch.Generator().manual_seed(stable_seed(self.uuid, self.seed, stream))

    def pooled(self, inp: str, size_key: tuple, build: Callable[[torch.Generator], torch.Tensor]) -> torch.Tensor:
        """A cache pool tensor on the device: it depends on (definition, pool size, seed), not on the
        uuid, like the one KV-cache pool a serving engine keeps across batches. One per slot."""
        slot, key = (self.definition, inp, str(self.device)), (size_key, self.seed)
        hit = _POOLS.get(slot)
        if hit is None or hit[0] != key:
            _POOLS.pop(slot, None)  # free the previous pool before building the next
            g = torch.Generator().manual_seed(stable_seed(f"pool:{self.definition}", self.seed, f"{inp}/{size_key}"))
            _POOLS[slot] = (key, build(g).to(self.device))
        return _POOLS[slot][1]


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def materialize(definition, workload, device="cpu", seed: int = 0, *, trace_root=None) -> tuple:
    """A complete, valid argument tuple for `workload`, in the definition's input order.

    Args:
        definition: a full or short definition name, a definition dict, or a
            flashinfer_bench `Definition`.
        workload: a flashinfer_bench `Workload` or `Trace`, or the JSON dict of either
            ({"axes", "inputs", "uuid"} or a trace line {"definition", "workload", ...}).
            Inputs it does not list are generated ("random").
        device: where the tensors go (generated on the CPU first, so every device gets the same values).
        seed: a second seed besides the uuid: same (uuid, seed) -> identical tensors.
        trace_root: the folder `safetensors` input paths are relative to.

    Returns:
        tuple of tensors and Python scalars (int for int dtypes, float otherwise).
    """
    defn = _definition(definition)
    name = defn["name"]
    if name not in _BUILDERS:
        raise ValueError(f"no input builder for definition {name!r}; known: {sorted(_BUILDERS)}")
    axes_in, specs, uuid = _workload_parts(workload)
    axes = _resolve_axes(defn, axes_in)
    unknown = sorted(set(specs) - set(defn["inputs"]))
    if unknown:
        raise ValueError(f"{name}: workload inputs {unknown} are not inputs of the definition")
    dev = _device(device)

    given: dict[str, Any] = {}
    for inp, ispec in defn["inputs"].items():
        spec = specs.get(inp, {"type": "random"})
        kind = spec.get("type", "random")
        if ispec["shape"] is None:
            value = spec["value"] if kind == "scalar" else MODEL_SCALARS.get(name, {}).get(inp)
            if value is None:
                raise ValueError(f"{name}: scalar input {inp!r} has no value and no model default")
            given[inp] = int(value) if ispec["dtype"].startswith("int") else float(value)
        elif kind == "safetensors":
            given[inp] = _load_safetensors(inp, spec, _shape(ispec, axes), _DTYPES[ispec["dtype"]], trace_root)
        elif kind == "scalar":
            raise ValueError(f"{name}: tensor input {inp!r} given as a scalar")
        elif kind != "random":
            raise ValueError(f"{name}: input {inp!r} has unknown type {kind!r}")

    ctx = _Context(name, uuid, int(seed), dev)
    built = _BUILDERS[name](axes, given, ctx)
    out = []
    for inp, ispec in defn["inputs"].items():
        v = given[inp] if inp in given else built[inp]
        if isinstance(v, torch.Tensor):
            want = _shape(ispec, axes)
            assert list(v.shape) == want and v.dtype == _DTYPES[ispec["dtype"]], (inp, v.shape, v.dtype, want)
            v = v.to(dev)
        out.append(v)
    return tuple(out)


def meta_arguments(definition, axes: dict) -> list:
    """Arguments with the definition's shapes and dtypes as meta tensors (no data, no memory: the
    MoE weights cost nothing), for dispatch tests and overhead benchmarks. Scalars: 1 or 0.5."""
    defn = _definition(definition)
    axes = _resolve_axes(defn, axes)
    args = []
    for spec in defn["inputs"].values():
        if spec["shape"] is None:
            args.append(1 if spec["dtype"].startswith("int") else 0.5)
        else:
            args.append(torch.empty(_shape(spec, axes), dtype=getattr(torch, spec["dtype"]), device="meta"))
    return args


def materialize_all(definition, workloads, device="cpu", seed: int = 0, *, trace_root=None
                    ) -> Iterator[tuple[str, tuple]]:
    """Yields (uuid, args) for each workload in turn (one argument set alive at a time).

    `workloads` is an iterable of workloads, or a trace-set folder to read them from with
    `load_workloads` (which then is also the default `trace_root`).
    """
    if isinstance(workloads, (str, Path)):
        trace_root = workloads if trace_root is None else trace_root
        workloads = load_workloads(workloads, definition)
    for w in workloads:
        yield _workload_parts(w)[2], materialize(definition, w, device, seed, trace_root=trace_root)


def load_workloads(trace_root, definition) -> list:
    """The workloads of one definition in a FlashInfer-Bench trace set (`<root>/workloads/**/*.jsonl`).

    Returns flashinfer_bench `Workload` objects when that package is installed, else
    `SimpleWorkload`s (same `axes`, `inputs`, `uuid` attributes). File order, then line order.
    """
    name = _definition(definition)["name"]
    root = Path(trace_root) / "workloads"
    if not root.is_dir():
        raise FileNotFoundError(f"no workloads folder in {trace_root}")
    try:
        from flashinfer_bench.data import Trace
    except ImportError:
        Trace = None
    out = []
    for p in sorted(root.rglob("*.jsonl")):
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            obj = json.loads(line)
            if obj.get("definition") != name:
                continue
            if Trace is not None:
                out.append(Trace.model_validate(obj).workload)
            else:
                w = obj["workload"]
                out.append(SimpleWorkload(dict(w["axes"]), dict(w.get("inputs", {})), w["uuid"]))
    return out


# ----------------------------------------------------------------------------------------------
# FP8 helpers
# ----------------------------------------------------------------------------------------------

def _to_fp8(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """x * inv_scale (broadcast) rounded to float8_e4m3fn; x is overwritten. With inv_scale =
    448 / amax the products stay within 448 * (1 + 2^-23), which rounds to 448 (NaN starts at 480),
    so no clamp pass is needed."""
    return x.mul_(inv_scale).to(torch.float8_e4m3fn)


def quantize_index_keys(keys: torch.Tensor) -> torch.Tensor:
    """[P, 64, 128] float keys -> [P, 64, 1, 132] int8 FP8 cache in the deep_gemm page layout.

    Per page: 64 * 128 e4m3 bytes (token-major), then 64 little-endian float32 scales; token t's
    scale is amax(|key_t|) / 448, so every key uses the full FP8 range.
    """
    return _pack_index_keys(keys.to(torch.float32).clone())


def _amax_last(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the last dim (aminmax: no |x| temporary)."""
    lo, hi = torch.aminmax(x, dim=-1)
    return torch.maximum(hi, lo.neg_())


def _pack_index_keys(k: torch.Tensor) -> torch.Tensor:
    """`quantize_index_keys` of a float32 tensor it may overwrite."""
    pages, page_size, dim = k.shape
    scale = (_amax_last(k) / FP8_MAX).clamp_min(1e-12)  # [P, 64]
    q = _to_fp8(k, (1.0 / scale)[..., None])
    out = torch.empty(pages, page_size * (dim + 4), dtype=torch.uint8)
    out[:, : page_size * dim] = q.view(torch.uint8).reshape(pages, page_size * dim)
    out[:, page_size * dim:] = scale.contiguous().view(torch.uint8).reshape(pages, page_size * 4)
    return out.view(torch.int8).view(pages, page_size, 1, dim + 4)


def dequantize_index_cache(cache: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_index_keys`: [P, 64, 1, 132] int8 -> [P, 64, 128] float32 keys."""
    pages, page_size, _, width = cache.shape
    dim = width - 4
    raw = cache.contiguous().view(torch.uint8).reshape(pages, page_size * width)
    vals = raw[:, : page_size * dim].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scale = raw[:, page_size * dim:].contiguous().view(torch.float32)  # [P, 64]
    return vals.view(pages, page_size, dim) * scale[..., None]


def _quantize_rows_blocked(x: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, H] float -> ([T, H] e4m3, [T, H/block] float32 scales), amax / 448 per block of a row.
    x is overwritten."""
    t, h = x.shape
    xb = x.view(t, h // block, block)
    scale = (_amax_last(xb) / FP8_MAX).clamp_min(1e-12)  # [T, H/block]
    return _to_fp8(xb, (1.0 / scale)[..., None]).view(t, h), scale


# ----------------------------------------------------------------------------------------------
# GDN
# ----------------------------------------------------------------------------------------------

def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def _gdn_state(n: int, heads: int, dim: int, g: torch.Generator) -> torch.Tensor:
    """[n, H, V, K] float32: sum_i 0.95^i v_i k_i^T over 64 past writes (unit k, N(0,1) v):
    entries ~0.3, S @ k recalls O(1) values, like a state in the middle of a sequence."""
    writes = 64
    k = _unit(torch.randn(n, heads, writes, dim, generator=g))  # [n, H, r, K]
    v = torch.randn(n, heads, dim, writes, generator=g)  # [n, H, V, r]
    w = 0.95 ** torch.arange(writes, dtype=torch.float32)
    return torch.matmul(v * w, k).contiguous()


def _gdn_params(heads: int, ctx) -> dict:
    g = ctx.rng("gdn_params")
    a_log = torch.log(torch.empty(heads).uniform_(1.0, 16.0, generator=g))
    dt = torch.exp(torch.empty(heads).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) == dt
    return {"A_log": a_log, "dt_bias": dt_bias}


def _gdn_common(lead: list[int], n_state: int, axes: dict, given: dict, ctx) -> dict:
    hq, hk, hv, d = axes["num_q_heads"], axes["num_k_heads"], axes["num_v_heads"], axes["head_size"]
    bf16 = torch.bfloat16
    out = {}
    if "q" not in given:
        out["q"] = _unit(torch.randn(*lead, hq, d, generator=ctx.rng("q"))).to(bf16)
    if "k" not in given:
        out["k"] = _unit(torch.randn(*lead, hk, d, generator=ctx.rng("k"))).to(bf16)
    if "v" not in given:
        out["v"] = torch.randn(*lead, hv, d, generator=ctx.rng("v")).to(bf16)
    if "state" not in given:
        out["state"] = _gdn_state(n_state, hv, d, ctx.rng("state"))
    if "a" not in given:
        out["a"] = torch.randn(*lead, hv, generator=ctx.rng("a")).to(bf16)
    if "b" not in given:
        out["b"] = torch.randn(*lead, hv, generator=ctx.rng("b")).to(bf16)
    out.update(_gdn_params(hv, ctx))
    return out


def _build_gdn_decode(axes, given, ctx) -> dict:
    b = axes["batch_size"]
    return _gdn_common([b, axes["seq_len"]], b, axes, given, ctx)


def random_cu_seqlens(total: int, num_seqs: int, g: torch.Generator) -> torch.Tensor:
    """[num_seqs + 1] int64 boundaries splitting `total` tokens into non-empty sequences at
    uniformly random distinct cut points (lengths from 1 to most of `total`)."""
    if num_seqs == 0:
        if total:
            raise ValueError(f"{total} tokens cannot form 0 sequences")
        return torch.zeros(1, dtype=torch.int64)
    if num_seqs > total:
        raise ValueError(f"{total} tokens cannot form {num_seqs} non-empty sequences")
    cuts = torch.randperm(total - 1, generator=g)[: num_seqs - 1].sort().values + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), cuts.to(torch.int64),
                      torch.full((1,), total, dtype=torch.int64)])


def _build_gdn_prefill(axes, given, ctx) -> dict:
    total, n = axes["total_seq_len"], axes["num_seqs"]
    out = _gdn_common([total], n, axes, given, ctx)
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = random_cu_seqlens(total, n, ctx.rng("cu_seqlens"))
    return out


# ----------------------------------------------------------------------------------------------
# DSA top-k indexer
# ----------------------------------------------------------------------------------------------

def _index_seq_lens(batch: int, max_pages: int, num_pages: int, g: torch.Generator) -> torch.Tensor:
    """[B] int32: 1 .. max_pages * 64 tokens each, the longest on the last block-table page; capped
    so that the used pages fit the pool distinctly."""
    if batch == 0:
        return torch.zeros(0, dtype=torch.int32)
    if max_pages == 0:
        return torch.zeros(batch, dtype=torch.int32)
    if num_pages < max_pages + batch - 1:
        raise ValueError(f"a pool of {num_pages} pages cannot hold {batch} sequences with distinct pages "
                         f"when the longest needs {max_pages}")
    width = max_pages * PAGE_SIZE
    lens = torch.randint(1, width + 1, (batch,), generator=g)
    longest = int(torch.randint(0, batch, (1,), generator=g))
    lens[longest] = int(torch.randint(width - PAGE_SIZE + 1, width + 1, (1,), generator=g))
    pages = (lens + PAGE_SIZE - 1) // PAGE_SIZE
    if int(pages.sum()) > num_pages:  # only for tiny synthetic pools: shrink the others' page counts
        others = torch.ones(batch, dtype=torch.bool)
        others[longest] = False
        budget = num_pages - max_pages
        cap = max_pages
        while int(pages[others].clamp(max=cap).sum()) > budget:
            cap -= 1
        lens[others] = lens[others].clamp(max=cap * PAGE_SIZE)
    return lens.to(torch.int32)


def _index_block_table(seq_lens: torch.Tensor, max_pages: int, num_pages: int, g: torch.Generator
                       ) -> torch.Tensor:
    """[B, max_pages] int32 of pool pages: a sequence's used pages are distinct across the batch;
    the unused columns get further distinct pages while the pool lasts, then random valid ones."""
    batch = seq_lens.shape[0]
    if batch * max_pages == 0:
        return torch.zeros(batch, max_pages, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=g)
    if batch * max_pages <= num_pages:
        return perm[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    used = ((seq_lens.to(torch.long) + PAGE_SIZE - 1) // PAGE_SIZE).clamp(max=max_pages)
    is_used = torch.arange(max_pages)[None, :] < used[:, None]  # [B, max_pages]
    n_used = int(is_used.sum())
    if n_used > num_pages:
        raise ValueError(f"sequences use {n_used} pages, more than the pool of {num_pages}")
    table = torch.randint(0, num_pages, (batch, max_pages), generator=g)
    table[is_used] = perm[:n_used]
    return table.to(torch.int32)


def _build_indexer(axes, given, ctx) -> dict:
    b, p, n = axes["batch_size"], axes["max_num_pages"], axes["num_pages"]
    heads, dim = axes["num_index_heads"], axes["index_head_dim"]
    assert axes["page_size"] == PAGE_SIZE and dim == INDEX_HEAD_DIM
    out = {}
    seq_lens = given.get("seq_lens")
    if seq_lens is None:
        seq_lens = out["seq_lens"] = _index_seq_lens(b, p, n, ctx.rng("seq_lens"))
    if "block_table" not in given:
        out["block_table"] = _index_block_table(seq_lens, p, n, ctx.rng("block_table"))
    if "q_index_fp8" not in given or "weights" not in given:
        # SGLang: q quantised per (token, head); weights = weights_proj(x) * H^-0.5 * q_scale * D^-0.5.
        g = ctx.rng("q_index")
        q, q_scale = _quantize_rows_blocked(torch.randn(b * heads, dim, generator=g), block=dim)
        out["q_index_fp8"] = q.view(b, heads, dim)
        proj = torch.randn(b, heads, generator=g)
        out["weights"] = proj * heads ** -0.5 * q_scale.view(b, heads) * dim ** -0.5
    if "k_index_cache_fp8" not in given:
        def build(g):  # N(0, 1) keys (LayerNorm'd + rope in the model), 1024 pages at a time
            cache = torch.empty(n, PAGE_SIZE, 1, dim + 4, dtype=torch.int8)
            for lo in range(0, n, 1024):
                hi = min(lo + 1024, n)
                cache[lo:hi] = _pack_index_keys(torch.randn(hi - lo, PAGE_SIZE, dim, generator=g))
            return cache
        out["k_index_cache_fp8"] = ctx.pooled("k_index_cache_fp8", (n,), build)
    return out


# ----------------------------------------------------------------------------------------------
# DSA sparse attention
# ----------------------------------------------------------------------------------------------

MAX_CONTEXT = 131072  # DeepSeek-V3.2 context length: longest sequence a sparse_indices row comes from


def random_sparse_indices(num_tokens: int, num_pages: int, g: torch.Generator, topk: int = TOPK
                          ) -> torch.Tensor:
    """[num_tokens, topk] int32: row t is the top-k of a sequence of L_t tokens on distinct random
    pages: min(L_t, topk) distinct token ids page * 64 + slot in random (score) order, -1 after.

    L_t is log-uniform in [topk, min(pool, 131072)] (a full row), or for a quarter of the rows, and
    for at least one row when num_tokens >= 2, uniform in [1, topk - 1] (a -1 padded tail)."""
    pool = num_pages * PAGE_SIZE
    out = torch.full((num_tokens, topk), -1, dtype=torch.int32)
    if num_tokens == 0 or pool == 0:
        return out
    short = torch.rand(num_tokens, generator=g) < 0.25
    if num_tokens >= 2 and not bool(short.any()):
        short[int(torch.randint(0, num_tokens, (1,), generator=g))] = True
    long_hi = min(pool, MAX_CONTEXT)
    for t in range(num_tokens):
        u = float(torch.rand(1, generator=g))
        if short[t] or pool < topk:  # a pool under topk tokens holds only short sequences
            short_hi = min(pool, topk - 1)
            length = min(1 + int(u * short_hi), short_hi)
        else:
            length = int(round(math.exp(math.log(topk) + u * (math.log(long_hi) - math.log(topk)))))
            length = max(topk, min(length, long_hi))
        pages = torch.randperm(num_pages, generator=g)[: (length + PAGE_SIZE - 1) // PAGE_SIZE]
        n_valid = min(length, topk)
        pos = torch.randperm(length, generator=g)[:n_valid]
        out[t, :n_valid] = (pages[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE).to(torch.int32)
    return out


def _randn_bf16(shape: tuple, g: torch.Generator, chunk: int = 1 << 24) -> torch.Tensor:
    """N(0, 1) bfloat16, drawn as float32 `chunk` values at a time (torch's bfloat16 randn is several
    times slower on some builds)."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    flat = out.view(-1)
    for lo in range(0, flat.numel(), chunk):
        hi = min(lo + chunk, flat.numel())
        flat[lo:hi] = torch.randn(hi - lo, generator=g)
    return out


def _build_sparse_attention(axes, given, ctx) -> dict:
    t, n, h = axes["num_tokens"], axes["num_pages"], axes["num_qo_heads"]
    ckv, kpe, ps = axes["head_dim_ckv"], axes["head_dim_kpe"], axes["page_size"]
    bf16 = torch.bfloat16
    out = {}
    # q . k has 576 terms of N(0,1) x N(0,1): logits ~ N(0, 576/192 = 3), a moderately peaked softmax.
    if "q_nope" not in given:
        out["q_nope"] = torch.randn(t, h, ckv, generator=ctx.rng("q_nope"), dtype=bf16)
    if "q_pe" not in given:
        out["q_pe"] = torch.randn(t, h, kpe, generator=ctx.rng("q_pe"), dtype=bf16)
    if "ckv_cache" not in given:
        out["ckv_cache"] = ctx.pooled("ckv_cache", (n,), lambda g: _randn_bf16((n, ps, ckv), g))
    if "kpe_cache" not in given:
        out["kpe_cache"] = ctx.pooled("kpe_cache", (n,), lambda g: _randn_bf16((n, ps, kpe), g))
    if "sparse_indices" not in given:
        out["sparse_indices"] = random_sparse_indices(t, n, ctx.rng("sparse_indices"), axes["topk"])
    return out


# ----------------------------------------------------------------------------------------------
# MoE
# ----------------------------------------------------------------------------------------------



def _block_quantized_matrix(rows: int, cols: int, fan_in: int, g: torch.Generator, block: int = 128
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's [rows, cols] weight, N(0, 1/fan_in) with a lognormal(0, 0.25) spread of block
    magnitudes, quantised per 128 x 128 block (amax -> 448): ([rows, cols] e4m3, [rows/128, cols/128])."""
    z = torch.randn(rows, cols, generator=g)
    zb = z.view(rows // block, block, cols // block, block)
    amax = zb.abs().amax(dim=(1, 3)).clamp_min(1e-12)  # [R/128, C/128]
    sigma = fan_in ** -0.5 * torch.exp(0.25 * torch.randn(amax.shape, generator=g))
    q = _to_fp8(zb, (FP8_MAX / amax)[:, None, :, None]).view(rows, cols)
    return q, (sigma * amax / FP8_MAX).to(torch.float32)


def moe_weights(definition=MOE_FP8, device="cpu") -> dict[str, torch.Tensor]:
    """The four shared expert weight tensors of this rank, built once per (definition, device).

    Each expert's matrices come from their own generator (seeded by the definition name and expert),
    built on the CPU one expert at a time (peak ~250 MB of float32 scratch) and copied into the
    preallocated device tensors."""
    defn = _definition(definition)
    dev = _device(device)
    key = (defn["name"], str(dev))
    if key in _MOE_WEIGHTS:
        return _MOE_WEIGHTS[key]
    ax = {k: a["value"] for k, a in defn["axes"].items() if a["type"] == "const"}
    e, h, i2, i = ax["num_local_experts"], ax["hidden_size"], ax["gemm1_out_size"], ax["intermediate_size"]
    fp8 = torch.float8_e4m3fn
    w = {
        "gemm1_weights": torch.empty(e, i2, h, dtype=fp8, device=dev),
        "gemm1_weights_scale": torch.empty(e, i2 // 128, h // 128, dtype=torch.float32, device=dev),
        "gemm2_weights": torch.empty(e, h, i, dtype=fp8, device=dev),
        "gemm2_weights_scale": torch.empty(e, h // 128, i // 128, dtype=torch.float32, device=dev),
    }
    for x in range(e):
        for gemm, (rows, cols) in (("gemm1", (i2, h)), ("gemm2", (h, i))):
            g = torch.Generator().manual_seed(stable_seed(defn["name"], 0, f"{gemm}_weights/{x}"))
            q, s = _block_quantized_matrix(rows, cols, cols, g)
            w[f"{gemm}_weights"][x].copy_(q)
            w[f"{gemm}_weights_scale"][x].copy_(s)
    _MOE_WEIGHTS[key] = w
    return w


def _moe_hits(logits, bias, offset, num_local, scaling) -> torch.Tensor:
    from kdispatch.references.moe_fp8 import _route

    experts, _ = _route(logits, bias, scaling)
    return ((experts >= offset) & (experts < offset + num_local)).sum(dim=1)  # [T] local picks per token


def _build_moe(axes, given, ctx) -> dict:
    t, ne, nl, h = axes["seq_len"], axes["num_experts"], axes["num_local_experts"], axes["hidden_size"]
    out = {}
    if "routing_bias" not in given:
        # Small: with N(0, 0.02) the 8 ranks' loads spread by about +-20%, a realistic imbalance.
        out["routing_bias"] = (0.02 * torch.randn(ne, generator=ctx.rng("routing_bias"))).to(torch.bfloat16)
    if "routing_logits" not in given:
        # Symmetric N(0, 1) logits: every EP rank gets on average 8 * 32 / 256 = 1 expert per token,
        # half the tokens touch this rank. If no token picks a local expert (likely only for tiny
        # batches), one token is steered to two local experts, so the rank always has work.
        g = ctx.rng("routing_logits")
        logits = torch.randn(t, ne, generator=g)
        bias = given.get("routing_bias", out.get("routing_bias"))
        off, scaling = given["local_expert_offset"], given["routed_scaling_factor"]
        lo, hi = max(0, off), min(ne, off + nl)
        if t and hi > lo and int(_moe_hits(logits, bias, off, nl, scaling).sum()) == 0:
            tok = int(torch.randint(0, t, (1,), generator=g))
            picks = lo + torch.randperm(hi - lo, generator=g)[:2]
            logits[tok, picks] += 4.0
        out["routing_logits"] = logits
    if "hidden_states" not in given or "hidden_states_scale" not in given:
        # Activations N(0, 1) with a lognormal(0, 0.5) gain per channel (some channels run hot, as
        # real ones do), quantised per token and 128 channels (amax -> 448).
        g = ctx.rng("hidden_states")
        gain = torch.exp(0.5 * torch.randn(h, generator=g))
        hs = torch.empty(t, h, dtype=torch.float8_e4m3fn)
        scale = torch.empty(h // 128, t, dtype=torch.float32)
        chunk = 2048
        for lo in range(0, t, chunk):
            hi = min(lo + chunk, t)
            q, s = _quantize_rows_blocked(torch.randn(hi - lo, h, generator=g).mul_(gain))
            hs[lo:hi], scale[:, lo:hi] = q, s.t()
        out["hidden_states"], out["hidden_states_scale"] = hs, scale
    weight_names = ("gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale")
    if any(n not in given for n in weight_names):
        shared = moe_weights(MOE_FP8, ctx.device)
        out.update({n: shared[n] for n in weight_names if n not in given})
    return out


_BUILDERS: dict[str, Callable] = {
    GDN_DECODE: _build_gdn_decode,
    GDN_PREFILL: _build_gdn_prefill,
    DSA_INDEXER: _build_indexer,
    DSA_SPARSE: _build_sparse_attention,
    MOE_FP8: _build_moe,
}
