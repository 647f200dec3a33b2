"""CPU tests of kdispatch.nvrtc: every CUDA kernel source under kernels/cuda/ compiles for sm_90a
through NVRTC (no GPU needed), without register spills; compile errors carry the NVRTC log; the
disk cache returns the same cubin without recompiling; options map onto cuda.core; importing the
module and the CUDA variants touches no CUDA package.

Skipped where cuda-python (cuda.core, cuda.bindings) or the NVRTC library is not installed.
A source may opt out of the spill check with the comment `// kdispatch: allow-spills`; one that is
another's continuation (`// kdispatch: continues <file>`) is compiled after that file's text.
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kdispatch import nvrtc

ROOT = Path(__file__).resolve().parents[1]
CU_FILES = sorted((ROOT / "kernels" / "cuda").rglob("*.cu"))
ARCH = "sm_90a"

_why = nvrtc.available()
needs_nvrtc = pytest.mark.skipif(_why is not None, reason=f"cuda.core / NVRTC not usable: {_why}")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_CACHE", str(tmp_path))
    return tmp_path / "cubin"


def test_there_are_cuda_sources():
    assert CU_FILES, "no .cu files under kernels/cuda/"


@needs_nvrtc
@pytest.mark.parametrize("path", CU_FILES, ids=[str(p.relative_to(ROOT)) for p in CU_FILES])
def test_compiles_for_sm90a(path, cache):
    src = path.read_text()
    if m := re.search(r"^// kdispatch: continues (\S+)", src, re.M):  # compiled after another file's text
        src = (path.parent / m.group(1)).read_text() + "\n" + src
    c = nvrtc.compile(src, arch=ARCH, name=path.name)
    assert isinstance(c.cubin, bytes) and len(c.cubin) > 1000
    assert c.cubin[:4] == b"\x7fELF"
    assert not c.cached and c.path.is_file()
    for name in _kernel_names(src):
        assert name.encode() + b"\x00" in c.cubin, f"kernel {name} missing from the cubin"
    info = nvrtc.ptxas_info(c.log)
    print(f"\n{path.name}: {len(c.cubin)} B cubin in {c.seconds:.2f} s (NVRTC {nvrtc.nvrtc_version()})")
    if not info:  # NVRTC 13.0 (cuda.core 1.2.0) returned no ptxas report; 13.5 does
        print("  no ptxas report in the NVRTC log: register and spill check skipped")
        return
    for name, k in sorted(info.items()):
        print(f"  {name}: {k.get('registers')} registers, stack {k.get('stack')} B, "
              f"spills {k.get('spill_stores')}/{k.get('spill_loads')} B")
    if "kdispatch: allow-spills" not in src:
        spilled = {n: k for n, k in info.items() if k.get("spill_stores") or k.get("spill_loads")}
        assert not spilled, f"{path.name}: register spills {spilled}"


def _kernel_names(src):
    """Names of the extern "C" kernels a source spells out (kernels defined inside macros are left out)."""
    import re

    src = src.replace("\\\n", " ")  # macro line continuations: one line per #define, dropped below
    src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("#define"))
    names = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(', src))
    return {n for n in names if not n.startswith("__")}


@needs_nvrtc
def test_gdn_kernels_are_the_expected_ones(cache):
    """The wrappers launch these names; they must exist in the cubins. The staged prefill's CUDA walk:
    every registered configuration in both conventions, its stages fit in an SM's shared memory, and
    config() picks registered ones."""
    from kdispatch.kernels.cuda.gdn import decode_warp_rows as D
    from kdispatch.kernels.cuda.gdn import pool_states as PS
    from kdispatch.kernels.cuda.gdn import prefill_thread_rows as P
    from kdispatch.kernels.cuda.gdn import prefill_walk as W

    # the eleven programs below compiled into the disk cache at once first (NVRTC releases the GIL)
    programs = [(cu, opts) for cu in (D.CU, P.CU) for opts in ((), *((f"-DPOOL_HV={h}",) for h in (4, 8, 16, 32)))]
    programs.append((W.CU, ()))
    with ThreadPoolExecutor(os.cpu_count() or 1) as workers:
        list(workers.map(lambda prog: nvrtc.compile(prog[0].read_text(), arch=ARCH, options=prog[1]), programs))
    dcubin = nvrtc.compile_cubin(D.CU.read_text(), arch=ARCH)
    for b in (1, 2, 3, 4, 8, 16, 33, 64, 256, 1024):
        rows, cs = D.config(b)
        name = f"gdn_decode_warp_rows{'_cs' if cs else ''}_r{rows}"
        assert name.encode() + b"\x00" in dcubin, name
    for heads in (4, 8, 16, 32):  # the engines' packed pool decode, one cubin per head count
        pool = nvrtc.compile(D.CU.read_text(), arch=ARCH, options=(f"-DPOOL_HV={heads}",))
        for label, cfg in D.POOL_CONFIGS.items():
            name = f"gdn_decode_pool_rows{'_cs' if cfg['cs'] else ''}_r{cfg['rows']}"
            assert name.encode() + b"\x00" in pool.cubin, name
        for label, cfg in D.VERIFY_CONFIGS.items():  # speculative verification, built with them
            for contract in ("", "_steps"):
                assert f"gdn_verify{contract}_rows_r{cfg['rows']}".encode() + b"\x00" in pool.cubin, label
        info = nvrtc.ptxas_info(pool.log)
        assert all(r["spill_stores"] == 0 and r["stack"] == 0 for r in info.values()), info
    pc = nvrtc.compile(P.CU.read_text(), arch=ARCH)
    compiled = [(ks, rows, c) for c, layouts in P.CHUNKS.items() for ks, rows in layouts]
    for ks, rows, c in compiled:
        assert f"gdn_prefill_thread_rows_k{ks}_r{rows}_c{c}".encode() + b"\x00" in pc.cubin
    for n in (1, 2, 3, 4, 8, 15, 16, 31, 32, 64, 1000):
        for t in (1, 8, 15 * n, 16 * n, 100, 10000):
            assert P.config(n, t) in compiled
    assert P.config(1, 15)[2] == 8 and P.config(1, 16)[2] == 16  # 16-token chunks from 16 tokens per sequence
    with pytest.raises(ValueError, match="no kernel"):
        P.kernel(1, 128, 16)  # not compiled: 255 registers already at 8
    pinfo = nvrtc.ptxas_info(pc.log)
    if pinfo:  # one thread per V row holds its 128 fp32 state values in registers; nothing spills
        assert pinfo["gdn_prefill_thread_rows_k1_r128_c8"]["registers"] >= 128
        assert all(r["spill_stores"] == 0 and r["stack"] == 0 for r in pinfo.values()), pinfo
    for heads in (4, 8, 16, 32):  # the engines' pool prefill, one cubin per head count
        pool = nvrtc.compile(P.CU.read_text(), arch=ARCH, options=(f"-DPOOL_HV={heads}",))
        for label, kw in P.LAUNCH_CONFIGS.items():
            ks, rows, c = kw["cfg"]
            assert f"gdn_prefill_pool_rows_k{ks}_r{rows}_c{c}".encode() + b"\x00" in pool.cubin, label
        info = nvrtc.ptxas_info(pool.log)
        assert all(r["spill_stores"] == 0 and r["stack"] == 0 for r in info.values()), info
    states = nvrtc.compile(PS.CU.read_text(), arch=ARCH)
    for name in ("gdn_pool_gather", "gdn_pool_scatter"):
        assert name.encode() + b"\x00" in states.cubin
    c = nvrtc.compile(W.CU.read_text(), arch=ARCH)
    for label, kw in W.LAUNCH_CONFIGS.items():
        warps, stages = kw["cfg"]
        assert label == f"r{16 * warps}s{stages}"
        assert stages * W.stage_bytes(warps) <= 227 * 1024
        for kind in ("pool", "contest"):
            assert f"gdn_prefill_walk_w{warps}_s{stages}_{kind}".encode() + b"\x00" in c.cubin, label
    winfo = nvrtc.ptxas_info(c.log)
    for kind in ("pool", "contest"):  # the first launch, the engines' conventions and the contest's
        name = f"gdn_prefill_algebra_{kind}"
        assert name.encode() + b"\x00" in c.cubin
        if winfo:
            assert winfo[name]["spill_stores"] == 0, winfo[name]
    for n in (1, 2, 8, 64, 256):
        for hv in (4, 8, 16, 32):
            assert W.config(n, hv) in W.KERNELS
    with pytest.raises(ValueError, match="no walk kernel"):
        W.kernel(8, 4, True)
    # context parallel: prefill_walk.cu's text and prefill_cp.cu's as one program, every kernel its host
    # code loads there, none spilling
    from kdispatch.kernels.cuda.gdn import prefill_cp as CP

    cp = nvrtc.compile(CP.source(), arch=ARCH)
    cinfo = nvrtc.ptxas_info(cp.log)
    warps, stages = CP.CP_WALK
    assert stages * W.stage_bytes(warps) <= 227 * 1024
    for kind in ("pool", "contest"):
        for name in (f"gdn_prefill_walk_w{warps}_s{stages}_{kind}_cp", f"gdn_prefill_cp_chain_{kind}",
                     f"gdn_prefill_cp_correct_{kind}", f"gdn_prefill_algebra_cp_{kind}"):
            assert name.encode() + b"\x00" in cp.cubin, name
            if cinfo:
                assert cinfo[name]["spill_stores"] == 0, cinfo[name]


@needs_nvrtc
def test_dsa_sparse_attention_kernels_are_the_expected_ones(cache):
    """Every (splits, stages) the wrapper may launch is in the cubin, fits in shared memory and
    does not spill; config() only picks compiled ones."""
    from kdispatch.kernels.cuda.dsa import sparse_attention_splitk as S

    c = nvrtc.compile(S.CU.read_text(), arch=ARCH)
    for ns, st, g in S.CONFIGS:
        assert f"dsa_sparse_attn_partial_ns{ns}_s{st}_g{g}".encode() + b"\x00" in c.cubin
        assert S.shared_bytes(ns, st, g) <= 227 * 1024  # sm_90's opt-in maximum per block
    for t in list(range(1, 300)) + [4096, 65536]:  # every token count: a compiled kernel, bounded workspace
        ns = S.config(t)[0]
        assert S.config(t) in S.CONFIGS and (t <= 4 or ns * t <= S.MAX_CTAS or ns == 1)
    with pytest.raises(ValueError, match="no kernel"):
        S.kernel(64, 1, 2)
    info = nvrtc.ptxas_info(c.log)
    if info:
        assert all(r["spill_stores"] == 0 and r["stack"] == 0 for r in info.values()), info


@needs_nvrtc
def test_compile_error_has_the_log(cache):
    bad = 'extern "C" __global__ void broken(float* x) { x[0] = undeclared_thing; }\n'
    with pytest.raises(nvrtc.CompileError) as exc:
        nvrtc.compile_cubin(bad, arch=ARCH)
    msg = str(exc.value)
    assert "undeclared_thing" in msg and "error" in msg
    assert "undeclared_thing" in exc.value.log
    assert not cache.exists() or not list(cache.glob("*.cubin"))


@needs_nvrtc
def test_cache_returns_same_bytes_without_recompiling(cache):
    src = 'extern "C" __global__ void add1(float* x) { x[threadIdx.x] += 1.0f; }\n'
    before = nvrtc.stats["compiles"]
    first_c = nvrtc.compile(src, arch=ARCH)
    first = first_c.cubin
    assert nvrtc.stats["compiles"] == before + 1
    path = nvrtc.cache_path(src, arch=ARCH)
    assert path.is_file() and path.read_bytes() == first and path.parent == cache
    assert path.with_suffix(".json").is_file()
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave no temp files

    again = nvrtc.compile(src, arch=ARCH)
    assert again.cached and again.cubin == first
    assert nvrtc.stats["compiles"] == before + 1  # no second compile
    assert again.log == first_c.log  # the NVRTC/ptxas log survives the cache

    # a different arch, option or source is a different entry
    assert nvrtc.cache_path(src, arch="sm_80") != path
    assert nvrtc.cache_path(src, arch=ARCH, options=("-DX=1",)) != path
    other = nvrtc.compile(src, arch="sm_80")
    assert not other.cached and other.cubin != first


@needs_nvrtc
def test_options_map_onto_program_options(cache):
    src = ('#if !defined(NEED) || NEED != 3\n#error NEED must be 3\n#endif\n'
           'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n')
    with pytest.raises(nvrtc.CompileError, match="NEED must be 3"):
        nvrtc.compile_cubin(src, arch=ARCH)
    assert nvrtc.compile_cubin(src, arch=ARCH, options=("-DNEED=3", "-lineinfo", "--use_fast_math",
                                                       "--maxrregcount=64", "-std=c++17"))
    with pytest.raises(ValueError, match="unsupported NVRTC option"):
        nvrtc.compile_cubin(src, arch=ARCH, options=("--no-such-flag",))


@needs_nvrtc
def test_name_expressions_for_templates(cache):
    src = 'template <int N> __global__ void fill(float* x) { x[threadIdx.x] = N; }\n'
    c = nvrtc.compile(src, arch=ARCH, name_expressions=("fill<3>",))
    assert c.cubin and c.symbol_mapping.get("fill<3>", "").startswith("_Z")
    again = nvrtc.compile(src, arch=ARCH, name_expressions=("fill<3>",))
    assert again.cached and again.symbol_mapping == c.symbol_mapping


def test_ptxas_info_parses_a_log():
    log = ("ptxas info    : Compiling entry function 'kern' for 'sm_90a'\n"
           "ptxas info    : Function properties for kern\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 200 registers, used 1 barriers, 2064 bytes smem\n")
    assert nvrtc.ptxas_info(log) == {"kern": {"stack": 16, "spill_stores": 8, "spill_loads": 4, "registers": 200}}


def test_signature_layout():
    fmt, offsets, size = nvrtc._layout("pifp")
    assert offsets == [0, 8, 12, 16] and size == 24
    fmt, offsets, size = nvrtc._layout("ip")
    assert offsets == [0, 8] and size == 16


def test_launch_packs_arguments(monkeypatch):
    """The generated launcher packs tensors (data_ptr), ints, None and floats at the kernel's
    parameter offsets and passes grid, block, shmem and stream through (driver call faked)."""
    import ctypes

    pytest.importorskip("cuda.bindings")
    from cuda.bindings import driver

    calls = []

    def fake_launch(fn, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        arr = (ctypes.c_void_p * 4).from_address(params)
        vals = [ctypes.c_uint64.from_address(arr[0]).value, ctypes.c_int32.from_address(arr[1]).value,
                ctypes.c_uint64.from_address(arr[2]).value, ctypes.c_float.from_address(arr[3]).value]
        calls.append(((gx, gy, gz), (bx, by, bz), shmem, stream, vals))
        return (0,)

    class FakeCoreKernel:
        handle = 1234
        arguments_info = [(0, 8), (8, 4), (16, 8), (24, 4)]

    class FakeTensor:
        def data_ptr(self):
            return 0xDEAD0000

    monkeypatch.setattr(driver, "cuLaunchKernel", fake_launch)
    kern = nvrtc.Kernel(FakeCoreKernel(), "fake", "pipf")
    kern.launch(7, (32, 2), FakeTensor(), -5, None, 2.5, stream=99)
    kern(3, 64, 0x10, 3, FakeTensor(), 0.25, shmem=16, stream=5)
    assert calls == [((7, 1, 1), (32, 2, 1), 0, 99, [0xDEAD0000, -5, 0, 2.5]),
                     ((3, 1, 1), (64, 1, 1), 16, 5, [0x10, 3, 0xDEAD0000, 0.25])]
    with pytest.raises(TypeError):
        kern.launch(1, 1, 0, 1, 2)  # one argument short
    with pytest.raises(ValueError, match="parameter sizes"):
        nvrtc.Kernel(FakeCoreKernel(), "fake", "ppff")  # does not match the kernel's parameters


def test_imports_stay_light():
    """`import kdispatch.nvrtc` and the CUDA variant modules load no cuda.* package and compile nothing."""
    code = ("import sys, kdispatch, kdispatch.nvrtc\n"
            "assert not [m for m in sys.modules if m == 'cuda' or m.startswith('cuda.')], 'cuda imported'\n"
            "import kdispatch.kernels.cuda.gdn.decode_warp_rows as d, kdispatch.kernels.cuda.gdn.prefill_thread_rows as p\n"
            "assert not d._kernels and not p._kernels\n"
            "import kdispatch.kernels.cuda.dsa.indexer_wgmma as w, kdispatch.kernels.cuda.dsa.indexer_select as s\n"
            "assert w.kernel.cache_info().currsize == 0 and s.kernel.cache_info().currsize == 0\n"
            "assert 'cuda.core' not in sys.modules  # (torch itself may import cuda.bindings)\n"
            "from kdispatch import nvrtc\n"
            "assert nvrtc.stats['compiles'] == 0 and nvrtc._core is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_cuda_variants_are_registered():
    from kdispatch import registry

    d = registry.get("gdn_decode", "cuda_decode_warp_rows.r4cs")
    p = registry.get("gdn_prefill", "cuda_prefill_thread_rows.k8c16")
    a = registry.get("dsa_sparse_attention", "cuda_splitk.s16")
    r = registry.get("dsa_topk_indexer", "cuda_radix_select")
    w = registry.get("dsa_topk_indexer", "cuda_wgmma_radix")
    for v, cu in ((d, "decode_warp_rows.cu"), (p, "prefill_thread_rows.cu"), (a, "sparse_attention_splitk.cu"),
                  (r, "topk_select.cu"), (w, "indexer_score.cu"), (w, "topk_select.cu")):
        assert v.backend == "cuda" and v.archs == ("sm90",)
        assert any(s.name == cu for s in v.files)  # the kernel source is in the provenance hash
