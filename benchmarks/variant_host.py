"""Where a variant's eager host time goes, on the GPU machine: for each variant named and each shape,
the host time until the call returns with the device idle (benchmarks/hosttime.py), the device time
of the kernels it launches (their count says how many launches the host pays for), and the functions
with the most own host time under cProfile. The tuner stores eager - graph time per row
(`benchmarks/wrapper_overhead.py --host-only` lists it per variant against the 25 us target); this
says why a variant is over it.

    python benchmarks/variant_host.py dsa_topk_indexer triton_fp8_torch_topk triton_fp8_flashinfer_topk \
        --shape batch_size=1,max_num_pages=845,num_pages=16384 --shape batch_size=51,max_num_pages=144 \
        [--json out.json]

A shape lists the definition's variable axes; those it leaves out take the values of the definition's
first contest workload (first coverage workload where it has none).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hosttime import host_breakdown, host_us, kernel_times, write_rows  # noqa: E402
from kdispatch import definitions, registry, workloads  # noqa: E402
from kdispatch.tuner import features  # noqa: E402


def parse_shape(text: str) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants axis=int,axis=int..., got {text!r}") from None


def axes_of(definition: str, given: dict[str, int]) -> dict[str, int]:
    """`given` over the axes of the definition's first contest workload (of its first coverage one, for
    the engine conventions, which have no contest workloads); an axis the definition lacks is an error."""
    first = workloads.load_workloads("traces", definition) or workloads.load_workloads("traces/coverage", definition)
    if not first:
        raise SystemExit(f"{definition}: no workload under traces/ or traces/coverage/ to take the other axes from")
    axes = dict(first[0].axes)
    unknown = set(given) - set(axes)
    if unknown:
        raise SystemExit(f"{definition} has no axes {sorted(unknown)} (its axes: {sorted(axes)})")
    return {**axes, **given}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("definition")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--shape", type=parse_shape, action="append", required=True)
    ap.add_argument("--json")
    opts = ap.parse_args()
    full = definitions.resolve_name(opts.definition)
    rows = []
    for given in opts.shape:
        axes = axes_of(full, given)
        args = workloads.materialize(full, {"axes": axes, "inputs": {}, "uuid": "variant-host"}, device="cuda")
        for name in opts.variants:
            v = registry.get(full, name)
            why = v.why_not("sm90") or v.declines(features.compute(full, axes))
            if why:
                print(f"{name} {given}: skipped, {why}")
                continue
            host = host_us(v.fn, args)
            kernels = kernel_times(v.fn, args)
            rows.append({"variant": name, "axes": axes, "host_us": host, "kernels": kernels,
                         "device_us": sum(kernels.values())})
            print(f"\n== {name} {given}: host {host:.1f} us until it returns, {len(kernels)} kernels, "
                  f"{sum(kernels.values()):.1f} us of device time")
            for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"   {us:8.1f} us  {kname[:110]}")
            print("   host, own time per call (cProfile):")
            for line in host_breakdown(v.fn, args):
                print("   " + line)
    if opts.json:
        write_rows(opts.json, rows)


if __name__ == "__main__":
    main()
