"""The reduced-size MoE inputs of the CPU MoE tests (tests/test_moe_triton.py, tests/test_moe_sglang.py):
hidden 7168 -> 256, intermediate 2048 -> 128, the routing unchanged (256 experts, 8 groups, top 8)
and 32 local experts; the expected value is the reference's formula, dense, in float64."""
import torch

from kdispatch.references import moe_fp8 as ref

HIDDEN, INTER, LOCAL = 256, 128, 32
FP8 = torch.float8_e4m3fn


def blockq(x, rows_block, cols_block):
    """FP8 quantisation with one scale per block; returns (fp8, scale[R/rb, C/cb])."""
    r, c = x.shape[-2:]
    xb = x.view(*x.shape[:-2], r // rows_block, rows_block, c // cols_block, cols_block)
    amax = xb.abs().amax(dim=(-3, -1)).clamp_min(1e-6)
    scale = amax / 448.0
    q = (xb / scale[..., :, None, :, None]).to(FP8).view(x.shape)
    return q, scale.float()


def inputs(T, seed, offset=64, inter=INTER):
    """Inputs of T tokens; `inter` (a multiple of 128) for kernels whose intermediate size matters."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, 256, generator=g)
    bias = (0.02 * torch.randn(256, generator=g)).to(torch.bfloat16)
    x, xs = blockq(torch.randn(T, HIDDEN, generator=g), 1, 128)  # xs [T, H/128]
    w1, w1s = blockq(torch.randn(LOCAL, 2 * inter, HIDDEN, generator=g) * HIDDEN ** -0.5, 128, 128)
    w2, w2s = blockq(torch.randn(LOCAL, HIDDEN, inter, generator=g) * inter ** -0.5, 128, 128)
    return [logits, bias, x, xs.t().contiguous(), w1, w1s, w2, w2s, offset, 2.5]


def expected(logits, bias, x, xs, w1, w1s, w2, w2s, offset, scaling, fp8_down=False):
    """The reference's formula, dense over all local experts, in float64; with fp8_down the down
    projection's input is first quantised as SGLang does (FP8 e4m3, one scale per 128 columns)."""
    inter = w1.shape[1] // 2
    experts, weights = ref._route(logits, bias, scaling)
    xd = (x.double().view(-1, HIDDEN // 128, 128) * xs.t().double()[:, :, None]).view(-1, HIDDEN)
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float64)
    for e in range(LOCAL):
        w_tok = (weights.double() * (experts == offset + e)).sum(dim=1)  # [T]
        if not w_tok.any():
            continue
        a = (w1[e].double().view(2 * inter // 128, 128, HIDDEN // 128, 128)
             * w1s[e].double()[:, None, :, None]).view(2 * inter, HIDDEN)
        b = (w2[e].double().view(HIDDEN // 128, 128, inter // 128, 128)
             * w2s[e].double()[:, None, :, None]).view(HIDDEN, inter)
        h = xd @ a.t()
        y = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
        if fp8_down:
            blocks = y.view(-1, inter // 128, 128)
            scale = (blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0).float().double()
            y = ((blocks / scale).float().to(FP8).double() * scale).view(-1, inter)
        out += w_tok[:, None] * (y @ b.t())
    return out
