"""GDN decode in the engines' convention (gdn_decode_packed_*), one- and two-warp blocks: the pool
kernel of decode_warp_rows (same rows a warp, same in-place pool update through slot indices, same
strided packed rows) launched in blocks of 32 or 64 threads instead of 128, as SGLang's Triton kernel
runs one warp a program. A variant of its own (`cuda_decode_pool_warps.<config>`) so that
cuda_decode_pool_rows' measured rows stay valid while the tuner decides whether the block size
matters. Its kernels (decode_pool_warps.cuh) are compiled appended to decode_warp_rows.cu.
"""
from __future__ import annotations

from pathlib import Path

from kdispatch import nvrtc
from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name
from kdispatch.kernels.cuda.gdn.decode_warp_rows import CU as ROWS_CU
from kdispatch.kernels.cuda.gdn.decode_warp_rows import DEFAULT_SCALE, DIM, SIGNATURE
from kdispatch.registry import variant

CU = Path(__file__).with_name("decode_pool_warps.cuh")
_kernels: dict[tuple[int, int, int, bool], nvrtc.Kernel] = {}


def source() -> str:
    """decode_warp_rows.cu, then this variant's kernels (one source: NVRTC's cache key hashes it whole)."""
    return ROWS_CU.read_text() + "\n" + CU.read_text()


def kernel_name(rows: int, warps: int, cs: bool) -> str:
    return f"gdn_decode_pool_warps{'_cs' if cs else ''}_r{rows}_w{warps}"


def kernel(heads: int, rows: int, warps: int, cs: bool) -> nvrtc.Kernel:
    kern = _kernels.get((heads, rows, warps, cs))
    if kern is None:
        kern = _kernels[(heads, rows, warps, cs)] = nvrtc.load_kernel(
            source(), kernel_name(rows, warps, cs), signature=SIGNATURE, options=(f"-DPOOL_HV={heads}",))
    return kern


def gdn_decode_pool_warps(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale, rows: int,
                          warps: int, cs: bool):
    """gdn_decode_packed_rows' contract (decode_warp_rows), in blocks of `warps` warps of `rows` rows."""
    B, HV = a.shape
    if B == 0:
        return out, state_pool
    HQ = (mixed_qkv.shape[1] - HV * DIM) // (2 * DIM)
    if mixed_qkv.stride(0) & 3 or mixed_qkv.data_ptr() & 7:  # q/k rows are read 8 bytes a lane
        mixed_qkv = mixed_qkv.contiguous()
    sp = state_pool.stride()
    if (sp[0] | sp[1] | sp[2]) & 3 or state_pool.data_ptr() & 15:
        raise ValueError("gdn_decode_pool_warps: state_pool needs 16-byte aligned slots, heads and rows")
    row, base = mixed_qkv.stride(0), mixed_qkv.data_ptr()
    qk_bytes = HQ * DIM * mixed_qkv.element_size()
    kernel(HV, rows, warps, cs).launch(
        B * HV * DIM // (warps * rows), 32 * warps,
        base, base + qk_bytes, base + 2 * qk_bytes, state_pool, A_log, a, dt_bias, b, out,
        scale or DEFAULT_SCALE, row, DIM, row, DIM, row, DIM, a.stride(0), b.stride(0), sp[0], sp[1], sp[2],
        state_indices, state_pool.shape[0], stream=nvrtc.current_stream(a.get_device()))
    return out, state_pool


# (rows a warp, warps a block, evict-first): the .cu's list
LAYOUTS = ((8, 1, False), (8, 1, True), (16, 1, False), (16, 1, True), (32, 1, True), (8, 2, False), (8, 2, True),
           (16, 2, True))
CONFIGS = {f"r{rows}w{warps}{'cs' if cs else ''}": dict(rows=rows, warps=warps, cs=cs) for rows, warps, cs in LAYOUTS}
for _hq, _hv in PACKED_HEADS.values():
    variant(packed_name(_hq, _hv), "cuda_decode_pool_warps", backend="cuda", archs=("sm90",), requires=("cuda.core",),
            configs=CONFIGS, strided=True)(gdn_decode_pool_warps)
