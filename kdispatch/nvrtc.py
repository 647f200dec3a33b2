"""CUDA C++ variants compiled at run time through NVRTC (cuda-python), cached on disk as cubins.

No torch extension and no nvcc: `cuda.core`'s `Program` compiles the source for the device's exact
architecture (sm_90a on Hopper), the cubin is cached under `$KDISPATCH_CACHE/cubin/` (default
`~/.cache/kdispatch/cubin/`), and kernels launch on torch's current stream through the driver's
`cuLaunchKernel`, so they compose with torch and are recorded by CUDA-graph capture.

    from kdispatch import nvrtc
    kern = nvrtc.load_kernel(Path(__file__).with_suffix(".cu"), "my_kernel", signature="ppif")
    kern.launch(grid, 128, x, y, n, 0.5)            # tensors (data_ptr), ints, floats

API
    compile_cubin(source, *, arch="sm_90a", options=(), name_expressions=(), include_dirs=()) -> bytes
    compile(...) -> Compiled       the cubin with the NVRTC/ptxas log, lowered names, cache path
    load_kernel(source_or_path, kernel_name, *, arch=None, options=(), signature=None) -> Kernel
    Kernel.launch(grid, block, *args, shmem=0, stream=None)   (also Kernel(...) )
    Kernel.resources() -> {"registers", "local_bytes", "shared_bytes"} of the loaded kernel
    Kernel.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", n)   a CUfunction attribute, by driver name
    current_stream(device=None) -> torch's current stream as a raw cudaStream_t int
    device_arch(device=None) -> "sm_90a" on Hopper;  available() -> None, or why NVRTC is unusable
    ptxas_info(log) -> {kernel: {"registers", "spill_stores", "spill_loads", "stack"}}
    cuda_include_dirs() -> CUDA header folders found (pip wheels, $CUDA_HOME, /usr/local/cuda)
    cache_dir(), cache_path(source, ...), stats {"compiles", "disk_hits"}
    CompileError                   raised on a failed compile; the message holds the NVRTC log

`options` are NVRTC command-line flags (`-DNAME=1`, `-Iinc`, `--use_fast_math`, `-lineinfo`,
`--maxrregcount=128`, `--ptxas-options=-v`, `-std=c++17`, `--fmad=false`, ...): they are mapped onto
`cuda.core.ProgramOptions`, whose fields differ between cuda-core versions, so an unknown flag is
an error rather than silently dropped.  ptxas always runs with `-v`, so `Compiled.log` holds each
kernel's register count and spills (see `ptxas_info`) where NVRTC returns the report (13.5 does;
13.0 through cuda-core 1.2.0 returned an empty log: use `Kernel.resources()` there).

Tested with cuda-core 1.2.2 / NVRTC 13.5 (compile only, CPU) and cuda-core 1.2.0 / cuda-bindings
13.3 / NVRTC 13.0 / driver 580 on an H100 (torch 2.11): compile, load, launch, graph capture.

Importing this module imports no CUDA package; `cuda.core` / `cuda.bindings` load on first use.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE_FORMAT = 1  # bump when the cache layout or the default compile flags change


class CompileError(RuntimeError):
    """NVRTC rejected a source; the message carries the compiler log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


@dataclass
class Compiled:
    cubin: bytes
    log: str  # NVRTC + ptxas -v output
    symbol_mapping: dict = field(default_factory=dict)  # name expression -> lowered (mangled) name
    path: Path | None = None  # the cache file
    cached: bool = False  # True when read from the disk cache
    seconds: float = 0.0  # compile time (of the original compile when cached)


# ---- lazy imports, version shims -------------------------------------------------------------

_core = None


def _cuda_core():
    """cuda.core's public names, whichever version is installed (cuda.core.experimental before 0.3)."""
    global _core
    if _core is None:
        try:
            import cuda.core as core

            core.Program  # noqa: B018 - raises on the old layout
        except (ImportError, AttributeError):
            import cuda.core.experimental as core
        _core = core
    return _core


def core_version() -> str:
    core = _cuda_core()
    v = getattr(core, "__version__", None)
    if v is None:
        import cuda.core

        v = getattr(cuda.core, "__version__", "?")
    return v


_nvrtc_version = None


def nvrtc_version() -> tuple[int, int]:
    global _nvrtc_version
    if _nvrtc_version is None:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        if int(err) != 0:
            raise RuntimeError(f"nvrtcVersion failed: {err}")
        _nvrtc_version = (int(major), int(minor))
    return _nvrtc_version


def available() -> str | None:
    """None when NVRTC compiles are possible here, else the reason (for skips and `why_not`)."""
    try:
        _cuda_core()
        nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - any failure means "not available"
        return f"{type(exc).__name__}: {exc}"
    return None


# ---- CUDA headers ----------------------------------------------------------------------------

_include_dirs = None


def cuda_include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h / cuda_bf16.h: pip wheels (nvidia/cu13/include,
    nvidia/cuda_runtime/include, ...), then $CUDA_HOME, $CUDA_PATH, /usr/local/cuda.  Empty when
    none has them (kernels of this project need none: they handle bf16 as raw bits)."""
    global _include_dirs
    if _include_dirs is None:
        cands = []
        try:
            import nvidia  # namespace package of the pip CUDA wheels

            for root in getattr(nvidia, "__path__", []):
                for sub in sorted(Path(root).iterdir()):
                    cands.append(sub / "include")
        except Exception:  # noqa: BLE001
            pass
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                cands.append(Path(os.environ[var]) / "include")
        cands.append(Path("/usr/local/cuda/include"))
        found = []
        for d in cands:
            if (d / "cuda_fp16.h").is_file() and str(d) not in found:
                found.append(str(d))
        _include_dirs = tuple(found)
    return _include_dirs


# ---- options -----------------------------------------------------------------------------------

_BOOL_FLAGS = {
    "--use_fast_math": "use_fast_math", "-use_fast_math": "use_fast_math",
    "-lineinfo": "lineinfo", "--generate-line-info": "lineinfo",
    "-G": "debug", "--device-debug": "debug",
    "--restrict": "restrict", "-restrict": "restrict",
    "--extra-device-vectorization": "extra_device_vectorization",
    "-w": "disable_warnings", "--disable-warnings": "disable_warnings",
}
_TF_FLAGS = {"--ftz": "ftz", "-ftz": "ftz", "--prec-div": "prec_div", "-prec-div": "prec_div",
             "--prec-sqrt": "prec_sqrt", "-prec-sqrt": "prec_sqrt", "--fmad": "fma", "-fmad": "fma"}


def _program_options(arch: str, options, include_dirs, name: str) -> dict:
    """NVRTC flags -> keyword arguments of cuda.core.ProgramOptions."""
    kw = {"name": name, "arch": arch, "std": "c++17", "ptxas_options": ["-v"]}
    defines, undefines, includes = [], [], list(include_dirs)
    for opt in options:
        if not isinstance(opt, str):
            raise TypeError(f"NVRTC option must be a string, got {opt!r}")
        flag, eq, val = opt.partition("=")
        if opt in _BOOL_FLAGS:
            kw[_BOOL_FLAGS[opt]] = True
        elif flag in _TF_FLAGS and eq:
            kw[_TF_FLAGS[flag]] = val.lower() in ("true", "1")
        elif opt.startswith("-D") and len(opt) > 2:
            n, e, v = opt[2:].partition("=")
            defines.append((n, v) if e else n)
        elif flag in ("--define-macro", "-define-macro") and eq:
            n, e, v = val.partition("=")
            defines.append((n, v) if e else n)
        elif opt.startswith("-U") and len(opt) > 2:
            undefines.append(opt[2:])
        elif opt.startswith("-I") and len(opt) > 2:
            includes.append(opt[2:])
        elif flag in ("--include-path", "-include-path") and eq:
            includes.append(val)
        elif flag in ("-std", "--std") and eq:
            kw["std"] = val
        elif flag in ("--maxrregcount", "-maxrregcount") and eq:
            kw["max_register_count"] = int(val)
        elif flag in ("--ptxas-options", "-Xptxas") and eq:
            kw["ptxas_options"] += [o for o in val.split(",") if o and o not in kw["ptxas_options"]]
        else:
            raise ValueError(f"unsupported NVRTC option {opt!r} (kdispatch.nvrtc maps a fixed set onto "
                             "cuda.core.ProgramOptions; add it there)")
    if defines:
        kw["define_macro"] = defines
    if undefines:
        kw["undefine_macro"] = undefines
    if includes:
        kw["include_path"] = includes
    return kw


# ---- the disk cache --------------------------------------------------------------------------

def cache_dir() -> Path:
    """$KDISPATCH_CACHE/cubin, else $XDG_CACHE_HOME/kdispatch/cubin, else ~/.cache/kdispatch/cubin."""
    root = os.environ.get("KDISPATCH_CACHE")
    if root:
        return Path(root).expanduser() / "cubin"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kdispatch" / "cubin"


def _key(source: str, arch: str, options, name_expressions, include_dirs) -> str:
    blob = json.dumps([CACHE_FORMAT, source, arch, list(options), list(name_expressions),
                       list(include_dirs), list(nvrtc_version())], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cache_path(source: str, *, arch: str = "sm_90a", options=(), name_expressions=(), include_dirs=()) -> Path:
    """Where `compile` keeps (or would keep) this compile's cubin."""
    inc = tuple(include_dirs) + cuda_include_dirs()
    return cache_dir() / f"{_key(source, arch, tuple(options), tuple(name_expressions), inc)}.cubin"


stats = {"compiles": 0, "disk_hits": 0}  # counters, for tests and reports


class _Log:
    def __init__(self):
        self.parts = []

    def write(self, s):
        self.parts.append(s if isinstance(s, str) else s.decode(errors="replace"))

    def text(self) -> str:
        return "".join(self.parts).replace("\x00", "").strip()


def compile(source: str, *, arch: str = "sm_90a", options=(), name_expressions=(), include_dirs=(),
            name: str = "kdispatch.cu", use_cache: bool = True) -> Compiled:
    """Compile CUDA C++ `source` to a cubin for `arch` (e.g. "sm_90a"), through the disk cache.

    The cache key is sha256 over (source, arch, options, name expressions, include folders, NVRTC
    version); headers reached through `#include` are not hashed, so a changed header needs a changed
    option or source (this project's kernels include none).  Raises CompileError with the log.
    """
    options, name_expressions = tuple(options), tuple(name_expressions)
    inc = tuple(str(d) for d in include_dirs) + cuda_include_dirs()
    path = cache_dir() / f"{_key(source, arch, options, name_expressions, inc)}.cubin"
    meta_path = path.with_suffix(".json")
    if use_cache and path.is_file():
        try:
            cubin = path.read_bytes()
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
            if cubin:
                stats["disk_hits"] += 1
                return Compiled(cubin, meta.get("log", ""), meta.get("symbol_mapping", {}), path, True,
                                meta.get("seconds", 0.0))
        except (OSError, ValueError):
            pass  # unreadable entry: compile again and overwrite it

    core = _cuda_core()
    kw = _program_options(arch, options, inc, name)
    log = _Log()
    t0 = time.perf_counter()
    try:
        prog = core.Program(source, "c++", options=core.ProgramOptions(**kw))
        obj = prog.compile("cubin", name_expressions=name_expressions, logs=log)
    except Exception as exc:
        msg = str(exc).replace("\x00", "").strip()
        if log.text():
            msg += "\n" + log.text()
        if type(exc).__name__ in ("NVRTCError", "CUDAError", "nvrtcError") or "NVRTC" in msg:
            raise CompileError(f"NVRTC failed to compile {name} for {arch}:\n{msg}", msg) from exc
        raise
    seconds = time.perf_counter() - t0
    stats["compiles"] += 1
    cubin = bytes(obj.code) if not isinstance(obj.code, bytes) else obj.code
    mapping = {}
    for expr in name_expressions:
        try:
            mapping[expr] = obj.symbol_mapping[expr]
        except (AttributeError, KeyError, TypeError):
            pass
    mapping = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in mapping.items()}
    try:
        prog.close()
    except Exception:  # noqa: BLE001
        pass
    text = log.text()
    if use_cache:
        try:
            meta = {"log": text, "symbol_mapping": mapping, "seconds": round(seconds, 4), "arch": arch,
                    "options": list(options), "nvrtc": list(nvrtc_version()), "cuda_core": core_version(),
                    "name": name}
            _atomic_write(meta_path, json.dumps(meta, indent=1).encode())
            _atomic_write(path, cubin)  # last: a present cubin means a complete entry
        except OSError:
            pass  # a read-only cache only costs compile time
    return Compiled(cubin, text, mapping, path, False, seconds)


def compile_cubin(source: str, *, arch: str = "sm_90a", options=(), name_expressions=(), include_dirs=()) -> bytes:
    """Compile CUDA C++ source to cubin bytes for `arch` (NVRTC, disk-cached; see `compile`)."""
    return compile(source, arch=arch, options=options, name_expressions=name_expressions,
                   include_dirs=include_dirs).cubin


_PTXAS_FN = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_info(log: str) -> dict:
    """{kernel: {"registers", "stack", "spill_stores", "spill_loads"}} read from a ptxas -v log."""
    info, cur = {}, None
    for line in log.splitlines():
        m = _PTXAS_FN.search(line)
        if m:
            cur = info.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = _PTXAS_STACK.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = _PTXAS_REGS.search(line)
        if m:
            cur["registers"] = int(m.group(1))
    return info


# ---- loading and launching -------------------------------------------------------------------

def device_arch(device: int | None = None) -> str:
    """NVRTC target of a CUDA device: "sm_90a" on Hopper (arch-specific features on for cc >= 9)."""
    major, minor = _capability(_device_index(device))
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _device_index(device) -> int:
    if device is not None:
        return int(getattr(device, "index", device) or 0)
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except ImportError:
        pass
    return 0


def _capability(index: int) -> tuple[int, int]:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_capability(index)
    except ImportError:
        pass
    cc = _cuda_core().Device(index).compute_capability
    return int(cc[0]), int(cc[1])


# signature codes -> struct format (native size, no padding; padding is added explicitly)
_CODES = {"p": "Q", "i": "i", "I": "I", "l": "q", "L": "Q", "f": "f", "d": "d"}


def _layout(signature: str):
    """(struct format with explicit padding, byte offsets, total size) of kernel parameters."""
    fmt, offsets, off = "=", [], 0
    for c in signature:
        size = struct.calcsize("=" + _CODES[c])
        pad = (-off) % size
        fmt += "x" * pad
        off += pad
        offsets.append(off)
        fmt += _CODES[c]
        off += size
    return fmt, offsets, max(off, 8)


class Kernel:
    """A loaded kernel with a pre-packed launch path.

    `signature` has one code per kernel parameter: p (pointer: a tensor, whose data_ptr() is
    passed, an int address, or None), i / I (int32 / uint32), l / L (int64 / uint64), f (float32),
    d (float64).

        kern.launch(grid, block, *args, shmem=0, stream=None)

    packs the values into a per-thread parameter buffer allocated once (one struct.pack_into; the
    function is generated per signature) and calls the driver's cuLaunchKernel on torch's current
    stream, or `stream` (a raw cudaStream_t int), so CUDA-graph capture records it.  Grid and block
    are ints or tuples of up to 3.  No per-call allocation beyond the driver binding's own.

    `pdl=True` launches through cuLaunchKernelEx as a programmatic dependent of the stream's previous
    kernel: it may start once every CTA of that kernel has executed `griddepcontrol.launch_dependents`
    (or exited), so it must execute `griddepcontrol.wait` before reading anything that kernel writes
    (the wait returns at once in a normal launch). CUDA-graph capture records the dependency.
    """

    def __init__(self, core_kernel, name: str, signature: str, compiled: Compiled | None = None):
        from cuda.bindings import driver

        bad = set(signature) - set(_CODES)
        if bad:
            raise ValueError(f"{name}: unknown signature codes {sorted(bad)}; use {''.join(_CODES)}")
        self.name = name
        self.signature = signature
        self.core = core_kernel  # the cuda.core Kernel (attributes, occupancy)
        self.compiled = compiled
        self._fn = driver.CUfunction(int(core_kernel.handle))  # a CUkernel, launched as a CUfunction
        self._launch = driver.cuLaunchKernel
        self._fmt, self._offsets, self._size = _layout(signature)
        self._tls = threading.local()
        self._check_signature()
        self.launch = self._make_launch()

    def _check_signature(self):
        try:
            info = self.core.arguments_info
        except Exception:  # noqa: BLE001 - older cuda.core or driver: nothing to check against
            return
        sizes = [int(getattr(p, "size", p[1] if isinstance(p, tuple) else 0)) for p in info]
        want = [struct.calcsize("=" + _CODES[c]) for c in self.signature]
        if sizes and sizes != want:
            raise ValueError(f"{self.name}: signature {self.signature!r} has parameter sizes {want}, "
                             f"the kernel has {sizes}")

    def _buffers(self):
        import ctypes

        buf = ctypes.create_string_buffer(self._size)
        base = ctypes.addressof(buf)
        ptrs = (ctypes.c_void_p * max(1, len(self.signature)))(*[base + o for o in self._offsets])
        self._tls.keep = ptrs  # the void* array lives as long as the thread's buffer
        pack = (buf, ctypes.addressof(ptrs))
        self._tls.pack = pack
        return pack

    def _make_launch(self):
        """launch(grid, block, a0, a1, ..., shmem=0, stream=None), generated for this signature so
        that a call is one struct.pack_into and one driver call, with no loop over arguments."""
        names = [f"a{i}" for i in range(len(self.signature))]
        vals = [f"({n} if {n}.__class__ is int else _ptr({n}))" if c == "p" else n
                for n, c in zip(names, self.signature)]
        src = (
            f"def launch(grid, block, {', '.join(names + [''])}shmem=0, stream=None, pdl=False):\n"
            "    try:\n"
            "        buf, params = _tls.pack\n"
            "    except AttributeError:\n"
            "        buf, params = _buffers()\n"
            f"    _pack(buf, 0, {', '.join(vals)})\n"
            "    if grid.__class__ is int:\n"
            "        gx = grid; gy = gz = 1\n"
            "    else:\n"
            "        gx, gy, gz = _dims(grid)\n"
            "    if block.__class__ is int:\n"
            "        bx = block; by = bz = 1\n"
            "    else:\n"
            "        bx, by, bz = _dims(block)\n"
            "    if stream is None:\n"
            "        stream = _stream()\n"
            "    if pdl:\n"
            "        err = _launch_pdl(gx, gy, gz, bx, by, bz, shmem, stream, params)\n"
            "    else:\n"
            "        err, = _launch(_fn, gx, gy, gz, bx, by, bz, shmem, stream, params, 0)\n"
            "    if err:\n"
            "        _failed(err, (gx, gy, gz), (bx, by, bz), shmem, stream, params)\n"
        )
        ns = {"_tls": self._tls, "_buffers": self._buffers, "_pack": struct.Struct(self._fmt).pack_into,
              "_ptr": _ptr, "_dims": _dims, "_stream": current_stream, "_launch": self._launch,
              "_fn": self._fn, "_failed": self._failed, "_launch_pdl": self._launch_pdl}
        exec(src, ns)  # noqa: S102 - generated from the validated signature codes only
        fn = ns["launch"]
        fn.__doc__ = (f"Launch {self.name}({self.signature}): grid, block (int or tuple of up to 3), then "
                      f"the {len(self.signature)} kernel arguments; shmem=0, stream=None (torch's current), "
                      f"pdl=False (see Kernel).")
        return fn

    def __call__(self, *args, **kwargs):
        return self.launch(*args, **kwargs)

    def _launch_pdl(self, gx, gy, gz, bx, by, bz, shmem, stream, params):
        """cuLaunchKernelEx with programmatic stream serialization (a per-thread config, built once)."""
        from cuda.bindings import driver

        cfg = getattr(self._tls, "pdl_config", None)
        if cfg is None:
            cfg = driver.CUlaunchConfig()
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            self._tls.pdl_config = cfg
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
        cfg.sharedMemBytes = shmem
        cfg.hStream = driver.CUstream(stream)
        err, = driver.cuLaunchKernelEx(cfg, self._fn, params, 0)
        return err

    def _failed(self, err, grid, block, shmem, stream, params):
        from cuda.bindings import driver

        if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
            # a thread that never touched CUDA: make the device's primary context current, retry once
            _cuda_core().Device(_device_index(None)).set_current()
            err, = self._launch(self._fn, *grid, *block, shmem, stream, params, 0)
            if not err:
                return
        raise RuntimeError(f"cuLaunchKernel({self.name}, grid={grid}, block={block}, shmem={shmem}) "
                           f"failed: {err!r}")

    def set_attribute(self, attribute: str, value: int, device: int | None = None) -> None:
        """Set a CUfunction attribute by its driver name without the prefix, e.g.
        ("MAX_DYNAMIC_SHARED_SIZE_BYTES", 160 * 1024) before launching with more than 48 KiB of
        dynamic shared memory, or ("NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1) for clusters over 8 CTAs.
        The loaded handle is a CUkernel (library loading): cuKernelSetAttribute sets it for `device`
        (default: the current one), cuFuncSetAttribute is the fallback for a plain CUfunction."""
        from cuda.bindings import driver

        attr = getattr(driver.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_" + attribute)
        err, = driver.cuKernelSetAttribute(attr, int(value), driver.CUkernel(int(self.core.handle)),
                                           driver.CUdevice(_device_index(device)))
        if err:
            err2, = driver.cuFuncSetAttribute(self._fn, attr, int(value))
            if err2:
                raise RuntimeError(f"{self.name}: setting {attribute}={value} failed: {err!r} / {err2!r}")

    def resources(self) -> dict:
        """{"registers", "local_bytes" (spills + stack, per thread), "shared_bytes"} read from the
        loaded kernel (works where the NVRTC log carries no ptxas report)."""
        attrs = self.core.attributes
        out = {}
        for key, attr in (("registers", "num_regs"), ("local_bytes", "local_size_bytes"),
                          ("shared_bytes", "shared_size_bytes")):
            val = getattr(attrs, attr)
            out[key] = int(val() if callable(val) else val)  # methods in older cuda.core
        return out

    def __repr__(self):
        return f"<kdispatch.nvrtc.Kernel {self.name}({self.signature})>"


def _ptr(a) -> int:
    return 0 if a is None else a.data_ptr()


def _dims(d) -> tuple[int, int, int]:
    d = tuple(d)
    return (d + (1, 1, 1))[:3] if len(d) < 3 else d


def current_stream(device: int | None = None) -> int:
    """torch's current CUDA stream of `device` (default: current device) as a raw cudaStream_t."""
    global _raw_stream, _current_device
    if _raw_stream is None:
        import torch

        # Triton's fast path: no torch.cuda.Stream object per call; the public API otherwise
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda d: torch.cuda.current_stream(d).cuda_stream)
        _current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    return _raw_stream(_current_device() if device is None else device)


_raw_stream = _current_device = None


_loaded: dict = {}
_load_lock = threading.Lock()


def _read_source(source_path_or_text) -> tuple[str, str]:
    """(source text, a display name)."""
    if isinstance(source_path_or_text, Path) or (
            isinstance(source_path_or_text, str) and "\n" not in source_path_or_text
            and source_path_or_text.endswith((".cu", ".cuh"))):
        p = Path(source_path_or_text)
        return p.read_text(), p.name
    return str(source_path_or_text), "kdispatch.cu"


def load_kernel(source_path_or_text, kernel_name: str, *, arch: str | None = None, options=(),
                signature: str | None = None, device: int | None = None) -> Kernel:
    """Compile (disk-cached) and load `kernel_name` (an extern "C" name, or a name expression of a
    template instance) into the current CUDA context; cached in-process per (source, name, arch,
    options, signature).  `arch` defaults to the current device's ("sm_90a" on Hopper).

    `signature` (codes p, i, I, l, L, f, d; see Kernel) is required to launch through the packed
    fast path; without it every parameter is taken as a pointer (p).
    """
    text, label = _read_source(source_path_or_text)
    idx = _device_index(device)
    if arch is None:
        arch = device_arch(idx)
    key = (hashlib.sha256(text.encode()).hexdigest(), kernel_name, arch, tuple(options), signature)
    k = _loaded.get(key)
    if k is not None:
        return k
    with _load_lock:
        k = _loaded.get(key)
        if k is not None:
            return k
        core = _cuda_core()
        exprs = () if _is_identifier(kernel_name) else (kernel_name,)
        compiled = compile(text, arch=arch, options=options, name_expressions=exprs, name=label)
        core.Device(idx).set_current()  # the primary context, which torch also uses
        if hasattr(core.ObjectCode, "from_cubin"):
            obj = core.ObjectCode.from_cubin(compiled.cubin, symbol_mapping=compiled.symbol_mapping or None)
        else:  # cuda.core < 0.2
            obj = core.ObjectCode(compiled.cubin, "cubin", symbol_mapping=compiled.symbol_mapping or None)
        core_kernel = obj.get_kernel(kernel_name)
        if signature is None:
            try:
                signature = "p" * int(core_kernel.num_arguments)
            except Exception:  # noqa: BLE001
                raise ValueError(f"{kernel_name}: pass signature= (the kernel's parameter types)") from None
        k = Kernel(core_kernel, kernel_name, signature.replace(" ", ""), compiled)
        k._module = obj  # keep the library loaded as long as the kernel lives
        _loaded[key] = k
        return k


def _is_identifier(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name) is not None
