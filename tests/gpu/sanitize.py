"""Every CUDA and Triton variant (and the library ones guarded by a kernel of ours) under
compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on small contest shapes and on fuzzed
hostile index tensors (tests/hostile.py). Run on the GPU machine:

    python tests/gpu/sanitize.py [--tools memcheck racecheck ...] [--definitions moe_fp8 ...] [--json OUT.json]

It runs the payload once plainly (compiling every kernel into the Triton and NVRTC caches, so the
sanitized runs compile nothing), then once per tool under `compute-sanitizer --tool T`, and prints
per tool the errors found and the kernels they name; exit status 1 if any tool found one. Do it
again whenever a kernel changes. `--payload` runs the variants alone (what the sanitizer wraps).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: hostile.py
from hostile import (GATHERED_PREFILL, PACKED, POOL_PREFILL, VERIFY, VERIFY_STEPS,  # noqa: E402
                     sparse_attention_shapes)

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
SHAPES = {  # small contest-like shapes, sparse attention one per CUDA kernel; indexed ones also get hostile seeds
    "gdn_decode": [{"batch_size": 3}],
    "gdn_prefill": [{"total_seq_len": 37, "num_seqs": 3}, {"total_seq_len": 1500, "num_seqs": 3}],  # 2nd: CP
    "dsa_topk_indexer": [{"batch_size": 3, "max_num_pages": 20, "num_pages": 200},
                         {"batch_size": 3, "max_num_pages": 60, "num_pages": 200}],
    "dsa_sparse_attention": sparse_attention_shapes(num_pages=100),
    "moe_fp8": [{"seq_len": 3}],
    **{short: [{"batch_size": 5, "num_slots": 8}] for short in PACKED},
    **{short: [{"total_seq_len": 37, "num_seqs": 9, "num_slots": 12}, {"total_seq_len": 1500, "num_seqs": 3, "num_slots": 5}]
       for short in POOL_PREFILL},
    **{short: [{"total_seq_len": 37, "num_seqs": 9}, {"total_seq_len": 1500, "num_seqs": 3}] for short in GATHERED_PREFILL},
    **{short: [{"num_seqs": 9, "cache_steps": 3, "total_seq_len": 27, "num_slots": 12, "num_cache_rows": 10}]
       for short in VERIFY},
    **{short: [{"num_seqs": 9, "num_steps": 3, "total_seq_len": 27, "num_slots": 30}] for short in VERIFY_STEPS},
}
HOSTILE_SEEDS = range(7)  # on a definition's first shape; its other shapes get the first two
SANITIZED_BACKENDS = ("cuda", "triton")
# library variants whose index handling is a kernel of ours in front of the library call (the library's
# own kernels run under the tool with it)
SANITIZED_LIBRARY = ("flashinfer_pool_inplace", "flashinfer_direct")


def payload(only: list[str] | None = None) -> list[str]:
    """Calls every CUDA and Triton variant that runs here (of the definitions `only` names by short
    name, if given); returns what it ran."""
    import torch

    from hostile import INDEXED, hostile
    from kdispatch import arch, definitions, registry
    from kdispatch.workloads import materialize

    here = arch.local_arch()
    ran = []
    for d in definitions.all_definitions():
        if only and d.short not in only:
            continue
        for v in registry.variants(d.name):
            if (v.backend not in SANITIZED_BACKENDS and v.name not in SANITIZED_LIBRARY) or v.why_not(here) is not None:
                continue
            for k, axes in enumerate(SHAPES[d.short]):
                if v.declines(axes) is not None:
                    continue
                w = {"uuid": f"sanitize-{d.short}-{'-'.join(map(str, axes.values()))}", "axes": axes, "inputs": {}}
                args = list(materialize(d.short, w, device="cuda"))
                calls = [("valid", args)]
                if d.short in INDEXED:
                    seeds = HOSTILE_SEEDS if k == 0 else HOSTILE_SEEDS[:2]
                    calls += [(f"hostile{s}", hostile(d.short, [a.clone() if isinstance(a, torch.Tensor) else a
                                                                  for a in args], s)) for s in seeds]
                for label, call_args in calls:
                    v.fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in call_args])
                    torch.cuda.synchronize()
                    ran.append(f"{d.short}/{v.name}/{axes}/{label}")
    return ran


def errors(text: str) -> int | None:
    """The error count of a compute-sanitizer report; racecheck's counts every hazard, warnings too."""
    if m := re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed", text):
        return int(m.group(1))
    m = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
    return int(m.group(1)) if m else None


def sanitize(tool: str, timeout: float, only: list[str] | None) -> dict:
    # API errors are not reported: kdispatch.nvrtc counts a kernel's parameters by probing
    # cuKernelGetParamInfo until it fails, by design.
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", "--print-limit", "50",
           "--report-api-errors", "no",
           sys.executable, str(Path(__file__).resolve()), "--payload", *(["--definitions", *only] if only else [])]
    start = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        text, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = b"".join(x if isinstance(x, bytes) else (x or "").encode() for x in (exc.stdout, exc.stderr))
        text, code = f"{out.decode(errors='replace')}\ntimed out after {timeout} s", "timeout"
    findings = list(dict.fromkeys(line.strip("= ") for line in text.splitlines() if line.startswith("=========")
                                  and any(w in line for w in ("Invalid", "Race", "hazard", "Uninitialized",
                                                              "Barrier", "Error", "by thread", "Program hit"))))
    ran = int(m2.group(1)) if (m2 := re.search(r"payload ran (\d+) calls", text)) else 0
    return {"tool": tool, "exit": code, "errors": errors(text), "calls": ran,
            "seconds": round(time.time() - start, 1), "findings": findings[:20],
            "tail": "\n".join(text.splitlines()[-40:]) if code else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--payload", action="store_true", help="run the variants (what the sanitizer wraps)")
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per tool")
    ap.add_argument("--definitions", nargs="+", choices=sorted(SHAPES), metavar="SHORT",
                    help="these definitions only (short names: moe_fp8, gdn_decode, ...)")
    args = ap.parse_args()
    if args.payload:
        ran = payload(args.definitions)
        print(f"payload ran {len(ran)} calls")
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    start = time.time()
    ran = payload(args.definitions)  # warm the kernel caches, and fail fast on a plain error
    print(f"plain run: {len(ran)} calls in {time.time() - start:.0f} s", flush=True)
    results = []
    for t in args.tools:
        results.append(r := sanitize(t, args.timeout, args.definitions))
        print(f"{r['tool']:<10} errors {r['errors']}  exit {r['exit']}  calls {r['calls']}  {r['seconds']} s"
              + "".join(f"\n    {f}" for f in r["findings"]))
        if r["tail"]:
            print(r["tail"])
        sys.stdout.flush()
        if args.json:  # after every tool: a later one may outlast the caller's patience
            Path(args.json).write_text(json.dumps({"calls": ran, "results": results}, indent=1) + "\n")
    return 0 if all(r["errors"] == 0 and r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
