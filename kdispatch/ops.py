"""Drop-in operators: `kdispatch.ops.<op>(...)` where SGLang or vLLM call FlashInfer today.

Arguments and outputs follow the definitions (kdispatch/definitions/); each call goes through the
definition's generated router for the device's architecture (kdispatch/dispatch.py), which the
run-time switches KDISPATCH_DISABLE and KDISPATCH_FORCE_<OP> can override. Bad input (dtype, shape,
device, contiguity, a broken constraint) raises ValueError naming the argument before any kernel runs.
Tensors must be contiguous, except the GDN ops' q, k, v, a, b and sparse attention's q_nope, q_pe,
which may be views whose last dimension is contiguous (split out of one packed projection, as
engines do): variants that read strides take them as they are, others get contiguous copies.
Index values (block tables, sparse indices, sequence boundaries) are not read on the host: no value
makes a kernel read or write outside its tensors, and each op's docstring says what an out-of-range
value means; KDISPATCH_CHECK=1 validates them on every call instead (synchronising).

GDN state contract: when `state` is given it is updated in place and returned as `new_state`
(serving engines keep one state per sequence in a pool, as FlashInfer's decode does); when it
is None, a zero state is allocated and returned.
"""
from __future__ import annotations

import math

import torch

from kdispatch import definitions, workloads
from kdispatch.custom_ops import install
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.definitions.gdn.names import (PACKED_HEADS, packed_name, pool_prefill_name, verify_name,
                                            verify_steps_name)
from kdispatch.dispatch import Dispatcher

# the engine-convention GDN definitions, one per TP degree: value heads -> definition
_PACKED = {hv: packed_name(hq, hv) for hq, hv in PACKED_HEADS.values()}
_POOL_PREFILL = {hv: pool_prefill_name(hq, hv) for hq, hv in PACKED_HEADS.values()}
_VERIFY = {hv: verify_name(hq, hv) for hq, hv in PACKED_HEADS.values()}
_VERIFY_STEPS = {hv: verify_steps_name(hq, hv) for hq, hv in PACKED_HEADS.values()}
_GATHERED_PREFILL = {hv: gathered_prefill_name(hq, hv) for hq, hv in GATHERED_HEADS.values()}

DISPATCHERS = {d.short: d for d in map(Dispatcher, ("moe_fp8", "dsa_topk_indexer", "dsa_sparse_attention",
                                                   "gdn_decode", "gdn_prefill", *_PACKED.values(),
                                                   *_POOL_PREFILL.values(), *_GATHERED_PREFILL.values(),
                                                   *_VERIFY.values(), *_VERIFY_STEPS.values()))}
# what each op calls: its Dispatcher, which runs its custom op kdispatch::<op> while torch.compile traces
_CALL = {short: install(d) for short, d in DISPATCHERS.items()}
# GDN constants, read once here so that the code torch.compile traces below never looks them up
_GDN_STATE = {short: (definitions.get(short).const_axes["num_v_heads"], definitions.get(short).const_axes["head_size"])
              for short in ("gdn_decode", "gdn_prefill")}
_DEFAULT_SCALE = {op: 1.0 / math.sqrt(size) for op, (_, size) in _GDN_STATE.items()}  # scale=None: 1/sqrt(head_size)
_PACKED_CALL = {hv: _CALL[definitions.get(name).short] for hv, name in _PACKED.items()}
_POOL_PREFILL_CALL = {hv: _CALL[definitions.get(name).short] for hv, name in _POOL_PREFILL.items()}
_GATHERED_PREFILL_CALL = {hv: _CALL[definitions.get(name).short] for hv, name in _GATHERED_PREFILL.items()}
_VERIFY_CALL = {hv: _CALL[definitions.get(name).short] for hv, name in _VERIFY.items()}
_VERIFY_STEPS_CALL = {hv: _CALL[definitions.get(name).short] for hv, name in _VERIFY_STEPS.items()}


def _by_value_heads(calls: dict, op: str, v):
    """The call of the engine-convention definition for v's value heads (v: [T, HV, 128])."""
    heads = v.shape[1] if isinstance(v, torch.Tensor) and v.dim() == 3 else None
    call = calls.get(heads)
    if call is None:
        raise ValueError(f"kdispatch.ops.{op}: argument 'v' expected [T, HV, 128] with HV one of "
                         f"{sorted(calls)}, got {tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}")
    return call


def _zero_state(op: str, num_states: int, device) -> torch.Tensor:
    heads, size = _GDN_STATE[op]
    return torch.zeros(num_states, heads, size, size, dtype=torch.float32, device=device)


def _scale(op: str, scale) -> float:
    """A `scale` the caller gave, as given; 0 is refused (the kernels would read it as "use the
    default", which is not what a caller passing 0 means). None, 1/sqrt(head_size), is
    `_DEFAULT_SCALE`, looked up at the call sites (one call less on the hot path)."""
    if scale == 0:
        raise ValueError(f"kdispatch.ops.{op}: argument 'scale' must be nonzero, got {scale!r} "
                         "(pass None for 1/sqrt(head_size))")
    return scale


def prefill_scale(scale) -> float:
    """The GDN prefill ops' `scale` argument as their definitions take it (None: 1/sqrt(128)), for
    engine plugins that build a definition's arguments themselves."""
    return _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale)


def moe_fp8(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
            gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
            routed_scaling_factor):
    """DeepSeek-V3 FP8 block-scale MoE on one expert-parallel rank (32 of 256 experts, top-8 of
    4 of 8 groups).

    Args:
        routing_logits: float32 [T, 256], router logits; scores are sigmoid(logits).
        routing_bias: bfloat16 [256], added to the scores to choose experts, not to weight them.
        hidden_states: float8_e4m3fn [T, 7168], token activations.
        hidden_states_scale: float32 [56, T], one scale per 128 hidden columns of each token
            (block-major).
        gemm1_weights: float8_e4m3fn [32, 4096, 7168], per local expert the gate/up projection:
            rows [0, 2048) times silu of rows [2048, 4096).
        gemm1_weights_scale: float32 [32, 32, 56], per 128 x 128 block of gemm1_weights.
        gemm2_weights: float8_e4m3fn [32, 7168, 2048], per local expert the down projection.
        gemm2_weights_scale: float32 [32, 56, 16], per 128 x 128 block of gemm2_weights.
        local_expert_offset: int, global id of this rank's first expert, in [0, 224] (checked on
            every call: ValueError otherwise).
        routed_scaling_factor: float, multiplies the routing weights after normalisation.

    Returns:
        output: bfloat16 [T, 7168], the sum over each token's chosen local experts of
        routing weight * expert output.
    """
    return _CALL["moe_fp8"](routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                    routed_scaling_factor)


def dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """DeepSeek-V3.2 sparse-attention indexer: the 2048 highest-scoring cached tokens per sequence.

    Args:
        q_index_fp8: float8_e4m3fn [B, 64, 128], indexer query of each sequence's current token.
        k_index_cache_fp8: int8 [num_pages, 64, 1, 132], the paged FP8 key cache as raw bytes in
            deep_gemm layout: per page 64 x 128 FP8 key bytes, then 64 float32 per-token scales.
        weights: float32 [B, 64], per-head weight of relu(q . k) in a token's score.
        seq_lens: int32 [B], cached tokens per sequence (0 gives an all -1 row); values outside
            [0, max_num_pages * 64] are clamped into it.
        block_table: int32 [B, max_num_pages], page ids of each sequence in token order; entries
            past ceil(seq_len / 64) are not read; an id outside [0, num_pages) is padding (its 64
            tokens are never read nor selected).
        With KDISPATCH_CHECK=1 an out-of-range seq_lens or reached block_table entry raises ValueError.

    Returns:
        topk_indices: int32 [B, 2048], global token ids (page * 64 + slot) of the
        min(2048, n) best of the sequence's n valid tokens, then -1 (the order among the selected
        tokens is the variant's: the set is the contract).
    """
    return _CALL["dsa_topk_indexer"](q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)


def dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """DeepSeek-V3.2 sparse MLA attention (16 heads) over the tokens the indexer selected.

    Args:
        q_nope: bfloat16 [T, 16, 512], query in the compressed-KV space (weight-absorbed MLA).
        q_pe: bfloat16 [T, 16, 64], rotary part of the query.
        ckv_cache: bfloat16 [num_pages, 64, 512], paged compressed KV (keys' first 512 dims and values).
        kpe_cache: bfloat16 [num_pages, 64, 64], paged rotary part of the keys.
        sparse_indices: int32 [T, 2048], global cache token ids (page * 64 + slot) per query
            token; -1 entries, and any value outside [0, num_pages * 64), are ignored (never read;
            KDISPATCH_CHECK=1: ValueError for a value other than -1 outside that range).
        sm_scale: float, softmax scale of the logits (1/sqrt(192) in DeepSeek-V3.2).

    Returns:
        (output bfloat16 [T, 16, 512], lse float32 [T, 16]): the attention output and the base-2
        log-sum-exp of the scaled logits; zeros and -inf for a token without a valid index.
    """
    return _CALL["dsa_sparse_attention"](q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)


def gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None):
    """Gated DeltaNet (Qwen3-Next) decode: one new token per sequence.

    Args:
        q: bfloat16 [B, 1, 4, 128], query, L2-normalised per head.
        k: bfloat16 [B, 1, 4, 128], key, L2-normalised per head (each q/k head serves two value heads).
        v: bfloat16 [B, 1, 8, 128], value.
        state: float32 [B, 8, 128, 128] (k-last: [V, K] per head), or None for zeros; updated in place.
        A_log: float32 [8], per-head log decay rate.
        a: bfloat16 [B, 1, 8], decay logit: g = exp(-exp(A_log) * softplus(a + dt_bias)).
        dt_bias: float32 [8], added to a before softplus.
        b: bfloat16 [B, 1, 8], write-gate logit: beta = sigmoid(b).
        scale: float, output scale, honoured as given; None means 1/sqrt(128); 0 raises ValueError.

    Returns:
        (output bfloat16 [B, 1, 8, 128], new_state float32 [B, 8, 128, 128]); new_state is `state`.
    """
    if state is None:
        state = _zero_state("gdn_decode", q.shape[0], q.device)
    return _CALL["gdn_decode"](q, k, v, state, A_log, a, dt_bias, b,
                               _DEFAULT_SCALE["gdn_decode"] if scale is None else _scale("gdn_decode", scale))


def gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *, max_seq_len=None):
    """Gated DeltaNet (Qwen3-Next) prefill over sequences packed along the token axis.

    Args:
        q: bfloat16 [T, 4, 128], queries of all sequences, L2-normalised per head.
        k: bfloat16 [T, 4, 128], keys, L2-normalised per head.
        v: bfloat16 [T, 8, 128], values.
        state: float32 [N, 8, 128, 128] initial state per sequence (k-last), or None for zeros;
            updated in place with each sequence's final state.
        A_log: float32 [8], per-head log decay rate.
        a: bfloat16 [T, 8], per-token decay logit.
        dt_bias: float32 [8], added to a before softplus.
        b: bfloat16 [T, 8], per-token write-gate logit.
        cu_seqlens: int64 [N + 1], sequence boundaries: sequence n owns tokens
            cu_seqlens[n] .. cu_seqlens[n+1] - 1; starts at 0, never decreases, ends at T. Checked
            on the device without a host sync: any other values zero the output and leave every
            state untouched (KDISPATCH_CHECK=1: ValueError naming the first bad entry).
        scale: float, output scale, honoured as given; None means 1/sqrt(128); 0 raises ValueError.
        max_seq_len: int, the longest sequence's token count if the caller knows it on the host, or
            None: routing only, as for `gdn_prefill_pool` (a wrong value costs time, never correctness).

    Returns:
        (output bfloat16 [T, 8, 128], new_state float32 [N, 8, 128, 128]); new_state is `state`.
    """
    if state is None:
        state = _zero_state("gdn_prefill", cu_seqlens.shape[0] - 1, q.device)
    args = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
            _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale))
    call = _CALL["gdn_prefill"]
    return call(*args) if max_seq_len is None else call(*args, max_seq_len=max_seq_len)


def gdn_decode_packed(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out=None, scale=None):
    """Gated DeltaNet (Qwen3-Next-80B) decode as SGLang and vLLM call it: one new token per request,
    q/k/v packed in one row, the states in a pool of slots (definitions gdn_decode_packed_*, one per
    TP degree: 32, 16, 8 or 4 value heads, half as many q/k heads, 128 wide).

    Args:
        mixed_qkv: bfloat16 [B, (2 HQ + HV) * 128], per row the q heads, the k heads, the v heads;
            q and k raw (L2-normalised here, eps 1e-6). Rows may be strided (last dim contiguous).
        a: bfloat16 [B, HV], decay logit: g = exp(-exp(A_log) * softplus(a + dt_bias)).
        b: bfloat16 [B, HV], write-gate logit: beta = sigmoid(b).
        A_log: float32 [HV].   dt_bias: float32 [HV].
        state_pool: float32 [num_slots, HV, 128, 128] (k-last), updated in place; the slot pitch
            (stride 0) may exceed a slot's size, each slot is contiguous.
        state_indices: int32 [B], each row's slot; a value outside [0, num_slots) (-1) is a padding
            row: output zero, no state read or written (KDISPATCH_CHECK=1: two rows naming one slot
            raise ValueError).
        out: bfloat16 [B, 1, HV, 128] to write the output into, or None to allocate it.
        scale: float, output scale; None means 1/sqrt(128); 0 raises ValueError.

    Returns:
        (output bfloat16 [B, 1, HV, 128], state_pool): output is `out` when given.
    """
    heads = a.shape[-1] if isinstance(a, torch.Tensor) else None
    call = _PACKED_CALL.get(heads)
    if call is None:
        raise ValueError(f"kdispatch.ops.gdn_decode_packed: argument 'a' expected [B, HV] with HV one of "
                         f"{sorted(_PACKED_CALL)}, got {tuple(a.shape) if heads is not None else type(a).__name__}")
    if out is None:
        out = torch.empty(a.shape[0], 1, heads, 128, dtype=torch.bfloat16, device=a.device)
    return call(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out,
                _DEFAULT_SCALE["gdn_decode"] if scale is None else _scale("gdn_decode", scale))


def gdn_prefill_pool(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out=None,
                     scale=None, *, max_seq_len=None):
    """Gated DeltaNet (Qwen3-Next-80B) prefill as SGLang and vLLM call it: sequences packed along the
    token axis, gates already activated, the states in a pool of slots (definitions
    gdn_prefill_pool_*, one per TP degree: 32, 16, 8 or 4 value heads, half as many q/k heads).

    Args:
        q, k: bfloat16 [T, HQ, 128], L2-normalised here (eps 1e-6; normalised input is unchanged).
        v: bfloat16 [T, HV, 128].
        g: float32 [T, HV], log decay (the state is multiplied by exp(g)).   beta: float32 [T, HV].
        state_pool: float32 [num_slots, HV, 128, 128] (k-last); each sequence's final state is
            written into its slot in place.
        state_indices: int32 [N], each sequence's slot; a value outside [0, num_slots) is a padding
            sequence: output zero, nothing read or written.
        has_initial_state: bool [N], whether a sequence continues its slot's state (else zeros).
        cu_seqlens: int32 [N + 1], boundaries; checked on the device without a host sync: any
            malformed values zero the output and leave the pool untouched (KDISPATCH_CHECK=1:
            ValueError naming the first bad entry, or a slot named twice).
        out: bfloat16 [T, HV, 128] to write the output into, or None to allocate it.
        scale: float, output scale; None means 1/sqrt(128); 0 raises ValueError.
        max_seq_len: int, the longest sequence's token count, as the engine knows it on the host
            (SGLang: max(extend_seq_lens_cpu)), or None. Routing only (never read by a kernel): the
            chunked kernels walk a sequence's chunks one after another, so one long sequence among
            short ones decides their time, which the shapes do not show; with it the router chooses
            among the measurements of such batches too (`route_hinted`). A wrong value costs time,
            never correctness.

    Returns:
        (output bfloat16 [T, HV, 128], state_pool): output is `out` when given.
    """
    call = _by_value_heads(_POOL_PREFILL_CALL, "gdn_prefill_pool", v)
    if out is None:
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
    args = (q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
            _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale))
    return call(*args) if max_seq_len is None else call(*args, max_seq_len=max_seq_len)


def gdn_prefill_gathered(q, k, v, g, beta, initial_state, cu_seqlens, out=None, scale=None, *, max_seq_len=None):
    """Gated DeltaNet (Qwen3-Next-80B) prefill as vLLM's GDN layer calls it: the engine gathered each
    sequence's state out of its pool before the call and scatters the final states back after it
    (definitions gdn_prefill_gathered_*, one per TP degree: 32, 16, 8 or 4 value heads, half as many
    q/k heads). Its baseline is FlashInfer as vLLM calls it; `gdn_prefill_pool` serves an engine
    that hands over the pool itself.

    Args:
        q, k: bfloat16 [T, HQ, 128], L2-normalised by the caller (not normalised here).
        v: bfloat16 [T, HV, 128].
        g: float32 [T, HV], log decay (the state is multiplied by exp(g)).   beta: float32 [T, HV].
        initial_state: float32 [N, HV, 128, 128] (k-last), each sequence's state before the batch
            (zeros for a fresh one); the final states are written over it in place.
        cu_seqlens: int32 [N + 1], boundaries; checked on the device without a host sync: any
            malformed values zero the output and leave the states untouched (KDISPATCH_CHECK=1:
            ValueError naming the first bad entry).
        out: bfloat16 [T, HV, 128] to write the output into, or None to allocate it.
        scale: float, output scale; None means 1/sqrt(128); 0 raises ValueError.
        max_seq_len: int, the longest sequence's token count as the engine knows it on the host, or
            None; routing only, as in `gdn_prefill_pool`.

    Returns:
        (output bfloat16 [T, HV, 128], initial_state holding the final states).
    """
    call = _by_value_heads(_GATHERED_PREFILL_CALL, "gdn_prefill_gathered", v)
    if out is None:
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
    args = (q, k, v, g, beta, initial_state, cu_seqlens, out,
            _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale))
    return call(*args) if max_seq_len is None else call(*args, max_seq_len=max_seq_len)


def gdn_verify(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, cu_seqlens, intermediate_states,
               cache_indices, scale=None):
    """Gated DeltaNet (Qwen3-Next-80B) speculative verification as SGLang calls it (MTP / EAGLE draft
    tokens): each request's tokens run from its slot's state without writing the pool, and the state
    after every step is stored for the engine to commit the accepted one (definitions gdn_verify_*,
    one per TP degree: 32, 16, 8 or 4 value heads, half as many q/k heads).

    Args:
        q, k: bfloat16 [T, HQ, 128], L2-normalised here (eps 1e-6).   v: bfloat16 [T, HV, 128].
        a, b: bfloat16 [T, HV], the raw gates (decay exp(-exp(A_log) * softplus(a + dt_bias)),
            write strength sigmoid(b)).   A_log, dt_bias: float32 [HV].
        state_pool: float32 [num_slots, HV, 128, 128] (k-last), read only.
        state_indices: int32 [N], each request's slot; a value outside [0, num_slots) starts the
            request from zeros (padding).
        cu_seqlens: int32 [N + 1], request boundaries (malformed values are read as the even
            partition n * T // N; KDISPATCH_CHECK=1: ValueError naming the first bad entry).
        intermediate_states: float32 [num_cache_rows, cache_steps, HV, 128, 128]: the state of a
            request of at most cache_steps tokens after its step j is stored at [cache_indices[n], j],
            in place.
        cache_indices: int32 [N], each request's row; a value outside [0, num_cache_rows) stores nothing.
        scale: float, output scale; None means 1/sqrt(128); 0 raises ValueError.

    Returns:
        (output bfloat16 [T, HV, 128], intermediate_states).
    """
    call = _by_value_heads(_VERIFY_CALL, "gdn_verify", v)
    return call(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, cu_seqlens, intermediate_states,
                cache_indices, _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale))


def gdn_verify_steps(q, k, v, a, b, A_log, dt_bias, state_pool, step_slots, num_accepted, cu_seqlens, scale=None):
    """Gated DeltaNet (Qwen3-Next-80B, Qwen3.5) speculative verification as vLLM calls it: each request
    reads its state from the slot of its last accepted step and writes the state after each of its
    draft steps into that step's own slot (definitions gdn_verify_steps_*, one per TP degree: 32,
    16, 8 or 4 value heads, half as many q/k heads).

    Args:
        q, k: bfloat16 [T, HQ, 128], L2-normalised here (eps 1e-6).   v: bfloat16 [T, HV, 128].
        a, b: bfloat16 [T, HV], the raw gates.   A_log, dt_bias: float32 [HV].
        state_pool: float32 [num_slots, HV, 128, 128] (k-last), updated in place; slot 0 is vLLM's
            null block, never read or written.
        step_slots: int32 [N, S], each request's slot per draft step (outside [1, num_slots): none).
        num_accepted: int32 [N], the request's state is read from step_slots[n, num_accepted[n] - 1];
            a request without that slot is padding (zero output, nothing read or written).
        cu_seqlens: int32 [N + 1], request boundaries (malformed values are read as the even
            partition n * T // N; KDISPATCH_CHECK=1: ValueError naming the first bad entry).
        scale: float, output scale; None means 1/sqrt(128); 0 raises ValueError.

    Returns:
        (output bfloat16 [T, HV, 128], state_pool).
    """
    call = _by_value_heads(_VERIFY_STEPS_CALL, "gdn_verify_steps", v)
    return call(q, k, v, a, b, A_log, dt_bias, state_pool, step_slots, num_accepted, cu_seqlens,
                _DEFAULT_SCALE["gdn_prefill"] if scale is None else _scale("gdn_prefill", scale))


def warmup(op: str, shapes, device="cuda") -> list[tuple[dict, str, str]]:
    """Routes and compiles op `op` for each shape before an engine captures CUDA graphs, so that no
    kernel is compiled and no decision is made during capture.

    Args:
        op: an op name (`"gdn_decode"`) or its definition's full name.
        shapes: an iterable of {variable axis: size}, e.g. [{"batch_size": b} for b in (1, 2, 4, 8)];
            axes the definition derives (len_cu_seqlens) or sizes a pool (num_pages) may be left out.
        device: where the calls run.

    Each shape is called with valid inputs of its own (the definition's input builder, contiguous:
    the layout a call must have to reuse the decision), once per call mode whose variant differs.
    Returns [(axes, graph variant, eager variant)] for logs and tests.
    """
    d = DISPATCHERS.get(op) or DISPATCHERS.get(definitions.get(op).short)
    done = []
    for axes in shapes:
        args = workloads.materialize(d.definition, workloads.SimpleWorkload(dict(axes), uuid="warmup"), device)
        resolved = workloads.resolve_axes(d.definition, dict(axes))
        done.append(({a: resolved[a] for a in definitions.get(d.definition).var_axes}, *d.warm(*args)))
    return done
