"""The engine-convention GDN definitions' names and head counts: what kernels need to register
their variants, kept apart from spec.py so that its coverage grids, tolerances and builders can change
without changing every GDN kernel's provenance (kdispatch/provenance.py hashes the files a kernel
imports)."""

PACKED_HEADS = {1: (16, 32), 2: (8, 16), 4: (4, 8), 8: (2, 4)}  # Qwen3-Next-80B per TP degree: (q/k, v) heads


def packed_name(hq: int, hv: int) -> str:
    return f"gdn_decode_packed_qk{hq}_v{hv}_d128_k_last"


def pool_prefill_name(hq: int, hv: int) -> str:
    return f"gdn_prefill_pool_qk{hq}_v{hv}_d128_k_last"


def verify_name(hq: int, hv: int) -> str:
    return f"gdn_verify_qk{hq}_v{hv}_d128_k_last"


def verify_steps_name(hq: int, hv: int) -> str:
    return f"gdn_verify_steps_qk{hq}_v{hv}_d128_k_last"
