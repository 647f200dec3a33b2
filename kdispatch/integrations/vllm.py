"""kdispatch inside vLLM: GDN (Qwen3-Next, Qwen3.5) decode and speculative verification served by
kdispatch's routed ops.

Turn it on: install kdispatch in vLLM's environment and set `KDISPATCH_VLLM=1` (decode and
verification), and `KDISPATCH_VLLM_PREFILL=1` for the prefill swaps too (off by default until the
routed op is measured against vLLM's own call, see PREFILL_SWITCH). vLLM calls every `vllm.general_plugins`
entry point in each worker before it builds the model (kdispatch's is `register` below, declared in
setup.py); with KDISPATCH_VLLM unset the plugin does nothing.

What it replaces: two kernels vLLM's GDN layer module calls, its references to them swapped for
kdispatch's functions, which serve what kdispatch's definitions cover and hand every other call to
vLLM's function:
- `fused_recurrent_gated_delta_rule_packed_decode` (decode-only batches; its default with
  VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1) -> `packed_decode_call`, serving the
  `gdn_decode_packed` definitions (bf16 rows, an fp32 pool of 128 x 128 states, 4, 8, 16 or 32
  value heads, int32 slots, L2 norm in the kernel). Padding: a slot outside the pool (-1) is a
  padding row for kdispatch; vLLM versions that mark padding with slot 0 (their null block) get
  slot 0 updated as a real slot, which no request reads.
- `fused_sigmoid_gating_delta_rule_update` (vLLM >= 0.20) -> `sigmoid_gating_call`, serving its
  speculative-verify calls (per-step slots [N, S] and accepted counts; the `gdn_verify_steps`
  definitions, whose slot 0 is vLLM's null block as in vLLM >= 0.20) where their router for the GPU
  was fitted against an engine's kernel (serving.not_served): not yet, their baseline being the
  torch reference, so today these calls stay vLLM's, as do its 1-D-slot decode calls and the rest.
- `fi_chunk_gated_delta_rule` (its prefill with FlashInfer, the default on sm_90) and
  `fla_chunk_gated_delta_rule` (with `--gdn-prefill-backend triton`) -> `fi_chunk_call` /
  `fla_chunk_call`, serving the `gdn_prefill_gathered` definitions (vLLM's convention, their
  baseline FlashInfer as vLLM calls it): vLLM hands them the states it gathered for the prefill's
  sequences (`ssm_state[indices]`, a copy, zeroed where a sequence has no initial state) and
  scatters the returned final states back; kdispatch writes the final states over the gathered ones
  and returns them (bf16 states, Qwen3-Next's default, are converted to fp32 first, as vLLM's
  FlashInfer path does). vLLM's layer normalises q/k before the call, as the definitions want (a
  call asking the kernel to normalise them, `use_qk_l2norm_in_kernel=True`, stays vLLM's). vLLM 0.34
  hands its FlashInfer function the gate exp(g) where the definitions take the log decay, and an
  `output` slice to write (read from vLLM 0.34.0's source, 2026-12-02; `_gates_taken` tells the two
  apart): a call kdispatch serves gets the log back first (`_log_decay`, two elementwise launches
  more, the clamp and the log; calls its router gives back reach vLLM's function as they came) and its output written into
  `output`. Calls with FlashInfer state checkpoints (prefix caching's "align" mode) stay vLLM's, as
  does every call where those definitions have no router for the GPU yet (`serving.not_served`). They are
  routed with the batch's longest query as `max_seq_len`: `build` of vLLM's
  `GDNAttentionMetadataBuilder` is wrapped to note the batch's prefill count and
  `common_attn_metadata.max_query_len` (host-side, no sync) for the prefill calls with as many
  sequences. That is the longest prefill exactly, unless a speculative-decode request of the same
  batch (num_speculative_tokens + 1 tokens) is longer than every prefill, when it is an upper bound.
The layer keeps its convolution and metadata paths; a `PluggableLayer.register_oot` subclass would
have had to re-implement the layer's methods around the same calls (and `ChunkGatedDeltaRule`
picks its forward method in `__init__`, past `forward_oot`).

Check it is active: each worker logs "kdispatch: vLLM GDN kernels replaced in <module>", and
`kdispatch.integrations.vllm.STATS` / `VERIFY_STATS` / `PREFILL_STATS` count the calls kdispatch
served and those it passed to vLLM.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os

import torch

from kdispatch.integrations import packed_decode, pool_prefill, serving, verify

SWITCH = "KDISPATCH_VLLM"
# The prefill swaps, opt-in on top of SWITCH until the gdn_prefill_gathered routers (first fitted
# 2026-11-27) are measured against vLLM's call with benchmarks/vllm_kernels.py (before those, the
# swaps served the gdn_prefill_pool routers, fitted against SGLang's prefill: gather, FlashInfer,
# scatter; vLLM gathers and scatters around the swapped call either way, so kernels that won only
# by skipping the gather lost to vLLM's bare FlashInfer call: H100, 2026-11-27,
# benchmarks/vllm_kernels.py, 8 of 20 shapes 0.78-0.95x in graphs, mean 1.24x). Measured with the
# gathered routers on an H200 (2026-11-30, benchmarks/results/vllm-kernels-prefill-H200.json), once
# those definitions took vLLM's v, a view into its projection row (every call had raised and gone
# back to vLLM) and the swap's own checks were trimmed (benchmarks/results/vllm-prefill-parts-H200.json),
# no shape is slower than vLLM's call beyond the paired spread in graphs or eagerly at a repeated
# token count; with a new count every call, as a forward's first GDN layer sees it, none either since
# the served path routes once and allocates and views cheaply (2026-12-02, the same file; 0.91x at 32
# value heads x 4 x 512 before). Opt-in until an H100 run agrees.
PREFILL_SWITCH = "KDISPATCH_VLLM_PREFILL"
PREFILL_KIND = "prefill_gathered"  # the definitions the prefill swaps serve (serving.gdn_short)
KERNEL = "fused_recurrent_gated_delta_rule_packed_decode"
VERIFY_KERNEL = "fused_sigmoid_gating_delta_rule_update"
FI_PREFILL = "fi_chunk_gated_delta_rule"
FLA_PREFILL = "fla_chunk_gated_delta_rule"
METADATA_BUILDER = "vllm.v1.attention.backends.gdn_attn.GDNAttentionMetadataBuilder"  # its build() notes lengths
# where vLLM's GDN layer has lived (newest first); the first that imports and holds KERNEL is patched
LAYER_MODULES = ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
                 "vllm.model_executor.layers.mamba.gdn_linear_attn",
                 "vllm.model_executor.models.qwen3_next")
STATS = {"served": 0, "passed": 0, "first_pass_reason": None}  # packed decode
VERIFY_STATS = {"served": 0, "passed": 0, "first_pass_reason": None}
PREFILL_STATS = {"served": 0, "passed": 0, "first_pass_reason": None}
PREFILL_POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # gathered states, converted to fp32

logger = logging.getLogger(__name__)
_originals: dict = {}  # kernel name -> vLLM's function


def enabled(switch: str = SWITCH) -> bool:
    return os.environ.get(switch, "").strip() not in ("", "0")


def register() -> str | None:
    """The `vllm.general_plugins` entry point: with KDISPATCH_VLLM set, swaps the GDN layer module's
    packed decode for `packed_decode_call` and, where the module has it, its sigmoid-gating kernel
    for `sigmoid_gating_call`; with KDISPATCH_VLLM_PREFILL set too, its prefill functions for
    `fi_chunk_call` / `fla_chunk_call`, and wraps the GDN metadata builder's `build`
    (`note_lengths`). Returns the patched module's name (None: nothing done)."""
    if not enabled():
        return None
    for name in LAYER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, KERNEL, None) is None:
            continue
        prefill = enabled(PREFILL_SWITCH)
        for kernel, ours in SWAPS:
            if kernel in (FI_PREFILL, FLA_PREFILL) and not prefill:
                continue
            current = getattr(module, kernel, None)
            if current is not None and current is not ours:
                _originals[kernel] = current
                setattr(module, kernel, ours)
        why_not = ("" if not prefill or _wrap_metadata_build()
                   else f"; no {METADATA_BUILDER}: prefill routed without its longest sequence")
        gates = _gates_taken(_originals[FI_PREFILL]) if FI_PREFILL in _originals else "log"
        why_not += ("" if gates == "log" else
                    f"; {FI_PREFILL} takes exp(g) in this vLLM: kdispatch takes its log where it serves a call"
                    if gates == "exp" else f"; {FI_PREFILL}'s gates unknown (code unreadable): its calls stay vLLM's")
        logger.info("kdispatch: vLLM GDN kernels replaced in %s: %s (%s=%s, %s=%s)%s", name,
                    ", ".join(k for k, _ in SWAPS if k in _originals), SWITCH, os.environ[SWITCH], PREFILL_SWITCH,
                    os.environ.get(PREFILL_SWITCH, ""), why_not)
        return name
    logger.warning("kdispatch: no vLLM GDN layer module with %s found (%s): nothing replaced", KERNEL,
                   ", ".join(LAYER_MODULES))
    return None


def _wrap_metadata_build() -> bool:
    """Wraps METADATA_BUILDER's `build` once so that each batch's lengths are noted (`note_lengths`);
    False where vLLM has no such class."""
    module, name = METADATA_BUILDER.rsplit(".", 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    build = cls.__dict__.get("build")
    if build is None:
        return False
    if getattr(build, "_kdispatch_notes_lengths", False):
        return True

    @functools.wraps(build)
    def build_noting_lengths(self, *args, **kwargs):
        metadata = build(self, *args, **kwargs)
        note_lengths(metadata, kwargs["common_attn_metadata"] if "common_attn_metadata" in kwargs else
                     args[1] if len(args) > 1 else None)
        return metadata

    build_noting_lengths._kdispatch_notes_lengths = True
    cls.build = build_noting_lengths
    return True


def note_lengths(metadata, common_attn_metadata) -> None:
    """Keeps a built batch's prefill count and longest query (host-side ints) for its prefill calls."""
    pool_prefill.note_batch(getattr(metadata, "num_prefills", 0) or 0,
                            getattr(common_attn_metadata, "max_query_len", None))


def packed_decode_call(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                       use_qk_l2norm_in_kernel=False):
    """vLLM's packed decode contract: writes [B, 1, HV, V] into `out`, the states into the pool in
    place; returns (out, initial_state)."""
    heads, width = out.shape[-2], out.shape[-1]
    short = serving.gdn_short("decode_packed", heads)
    why = ("no L2 norm in the kernel" if not use_qk_l2norm_in_kernel else
           f"out {tuple(out.shape)} {out.dtype}" if out.dim() != 4 or out.dtype != mixed_qkv.dtype
           or not out.is_contiguous() else
           f"{short}: routed to the baseline for this shape"
           if serving.given_back(short, heads, mixed_qkv.device,
                                 lambda: packed_decode.axes(mixed_qkv.shape[0], initial_state),
                                 serving.strided_views(mixed_qkv, a, b, initial_state)) else
           packed_decode.not_covered(mixed_qkv, a, b, initial_state, ssm_state_indices, heads, width))
    if why is not None:
        serving.passed(STATS, why)
        return _originals[KERNEL](mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                         initial_state=initial_state, out=out, ssm_state_indices=ssm_state_indices,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    def ours():
        packed_decode.serve(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, ssm_state_indices, out)
        return out, initial_state

    return serving.attempt(STATS, short, mixed_qkv.device, ours,
                           lambda: _originals[KERNEL](mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                                                      scale=scale, initial_state=initial_state, out=out,
                                                      ssm_state_indices=ssm_state_indices,
                                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel))


def sigmoid_gating_call(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None, initial_state=None,
                        inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                        use_qk_l2norm_in_kernel=False, **kwargs):
    """vLLM's fused_sigmoid_gating_delta_rule_update contract: returns (output [1, T, HV, V],
    initial_state), the states written into the pool in place. Speculative-verify calls (2-D slots,
    accepted counts) that `gdn_verify_steps` covers are kdispatch's; the rest vLLM's. A CUDA-graph
    bucket's slots and counts may have more rows than requests: the first len(cu_seqlens) - 1 count."""
    if cu_seqlens is not None and ssm_state_indices is not None and num_accepted_tokens is not None:
        n = cu_seqlens.shape[0] - 1
        slots, accepted = ssm_state_indices[:n], num_accepted_tokens[:n]
    why = ("not a speculative-verify call" if ssm_state_indices is None or ssm_state_indices.dim() != 2
           or num_accepted_tokens is None or cu_seqlens is None else
           "KDA gates" if kwargs.get("is_kda") else
           "no L2 norm in the kernel, or states not written in place" if not (use_qk_l2norm_in_kernel and
                                                                               inplace_final_state) else
           f"softplus beta {beta}, threshold {threshold}" if (beta, threshold) != (1.0, 20.0) else
           "inputs not [1, T, ...]" if q.dim() != 4 or q.shape[0] != 1 else
           verify.not_covered_steps(q[0], k[0], v[0], a, b, initial_state, slots, accepted, cu_seqlens))
    if why is not None:
        serving.passed(VERIFY_STATS, why)
        return _originals[VERIFY_KERNEL](
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, beta=beta, threshold=threshold, scale=scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

    def ours():
        out = verify.serve_steps(q[0], k[0], v[0], a, b, A_log, dt_bias, initial_state, slots, accepted, cu_seqlens,
                                 scale)
        return out[None], initial_state

    return serving.attempt(
        VERIFY_STATS, serving.gdn_short("verify_steps", v.shape[2]), v.device, ours,
        lambda: _originals[VERIFY_KERNEL](
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, beta=beta, threshold=threshold, scale=scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs))


def _prefill_call(engine, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, l2norm_in_kernel,
                  scale=None, core_attn_out=None, why=None, linear_gates=False):
    """A prefill call of vLLM's served by kdispatch (gdn_prefill_gathered) where its definitions cover
    it and `why` (the caller's own reason not to) is None, else by `engine()`; `linear_gates`: g is
    exp(g), FlashInfer's convention (vLLM >= 0.34's FlashInfer calls). Asked on every eager
    prefill: the checks read attributes only, the [T, ...] views are built once, past the router's
    hand-back (what that saved an eager call: benchmarks/results/vllm-prefill-parts*-H200.json)."""
    if why is None:
        why = ("no final state asked for, no initial states, or no boundaries"
               if not output_final_state or initial_state is None or cu_seqlens is None else
               "q/k to be L2-normalised in the kernel (the definitions take them normalised)" if l2norm_in_kernel else
               "inputs not [1, T, ...]" if q.dim() != 4 or q.shape[0] != 1 or v.dim() != 4 or g.dim() != 3
               or beta.dim() != 3 or initial_state.dim() != 4 else
               f"initial states {tuple(initial_state.shape)} for {cu_seqlens.shape[0] - 1} sequences"
               if initial_state.shape[0] != cu_seqlens.shape[0] - 1 else None)
    if why is None:
        n, hv = initial_state.shape[0], v.shape[2]
        short = serving.gdn_short(PREFILL_KIND, hv)
        features = pool_prefill.axes(v.shape[1], n, max_seq_len=pool_prefill.batch_longest(n))
        strided = serving.strided_views(q, k, v)
        decided = serving.decision(short, hv, v.device, lambda: features, strided)
        if decided is not None and decided[1]:
            why = f"{short}: routed to the baseline for this shape"
        else:
            q, k, v, g, beta = q.squeeze(0), k.squeeze(0), v.squeeze(0), g.squeeze(0), beta.squeeze(0)
            why = pool_prefill.not_covered(q, k, v, g, beta, initial_state, None, cu_seqlens, PREFILL_POOL_DTYPES,
                                           kind=PREFILL_KIND)
    if why is not None:
        serving.passed(PREFILL_STATS, why)
        return engine()
    return serving.attempt(PREFILL_STATS, short, v.device,
                           lambda: _prefill(short, features, strided, decided[0], q, k, v,
                                            _log_decay(g) if linear_gates else g, beta, scale, initial_state,
                                            cu_seqlens, core_attn_out),
                           engine)


def _prefill(short, features, strided, variant, q, k, v, g, beta, scale, initial_state, cu_seqlens, core_attn_out):
    """The gathered states' prefill on [T, ...] inputs by the `variant` that `serving.decision` named
    for `features` and `strided`: (o [1, T, HV, V], final states fp32)."""
    states = initial_state if initial_state.dtype == torch.float32 else initial_state.float()
    if core_attn_out is None:
        out = torch.empty_like(v, memory_format=torch.contiguous_format)  # v is bf16, as checked
    else:  # its leading elements, as fla fills it
        out = core_attn_out.reshape(-1)[:v.numel()].view(v.shape)
    pool_prefill.serve_gathered(short, features, strided, variant, q, k, v, g, beta, states, cu_seqlens, out, scale)
    return out[None], states


def fi_chunk_call(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, use_qk_l2norm_in_kernel=True,
                  state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0, use_cp="auto",
                  output=None):
    """vLLM's fi_chunk_gated_delta_rule contract: (o [1, T, HV, V] (in `output` where given, vLLM >= 0.34),
    final states [N, HV, V, K] fp32)."""
    original = _originals[FI_PREFILL]

    def engine():
        given = {} if output is None else {"output": output}  # earlier vLLMs' function takes no `output`
        return original(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_checkpoints=state_checkpoints,
            checkpoint_cu_starts=checkpoint_cu_starts, checkpoint_every_n_tokens=checkpoint_every_n_tokens,
            use_cp=use_cp, **given)

    gates = _gates_taken(original)
    why = ("FlashInfer state checkpoints" if state_checkpoints is not None or checkpoint_every_n_tokens else
           "context parallel asked for" if use_cp is True else
           "gates of an unknown kind (the function's code unreadable)" if gates is None else
           _unusable_buffer(output, v))
    return _prefill_call(engine, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                         use_qk_l2norm_in_kernel, core_attn_out=output, why=why, linear_gates=gates == "exp")


@functools.lru_cache(maxsize=8)
def _gates_taken(fi_chunk) -> str | None:
    """What vLLM's fi_chunk_gated_delta_rule takes as g: "log", the definitions' log decay, which it
    exponentiates for FlashInfer itself (vLLM <= 0.33: `torch.exp` in its code); "exp", FlashInfer's
    exp(g), handed on as it came (vLLM 0.34: its `fused_post_conv_prep(output_g_exp=True)` makes it);
    None where its code cannot be read (its calls stay vLLM's)."""
    code = getattr(inspect.unwrap(fi_chunk), "__code__", None)
    return None if code is None else "log" if "exp" in code.co_names else "exp"


def _log_decay(gate: torch.Tensor) -> torch.Tensor:
    """The definitions' log decay g from FlashInfer's gate exp(g). A gate that underflowed to 0 (g below
    about -103) becomes log of the smallest normal float, about -87.3, not -inf, whose differences in
    the kernels' cumulative decays would be NaN; exp(-87.3) is as much 0 beside 1 in fp32."""
    return torch.log(gate.float().clamp_min(torch.finfo(torch.float32).tiny))


def _unusable_buffer(buffer, v) -> str | None:
    """Why kdispatch cannot write the output into vLLM's `buffer` (None: it can, or there is none)."""
    if buffer is None or (buffer.dtype == torch.bfloat16 and buffer.is_contiguous() and buffer.numel() >= v.numel()):
        return None
    return "an output buffer that is not a contiguous bf16 one of at least the output's size"


def fla_chunk_call(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                   chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False, core_attn_out=None):
    """vLLM's fla_chunk_gated_delta_rule contract: (o [1, T, HV, V] (in `core_attn_out` where
    given), final states [N, HV, V, K] fp32)."""
    def engine():
        return _originals[FLA_PREFILL](
            q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
            chunk_offsets=chunk_offsets, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out)

    return _prefill_call(engine, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                         use_qk_l2norm_in_kernel, scale, core_attn_out, _unusable_buffer(core_attn_out, v))


SWAPS = ((KERNEL, packed_decode_call), (VERIFY_KERNEL, sigmoid_gating_call), (FI_PREFILL, fi_chunk_call),
         (FLA_PREFILL, fla_chunk_call))
