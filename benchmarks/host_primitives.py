"""Host microseconds of the torch calls a served prefill makes per call (views, allocations, stream
and device look-ups, tensor attributes), on the GPU machine's host with CUDA tensors: what each
costs where the engines' eager prefill is host-bound, so that the plugins' and the variants' host
paths take the cheaper form (e.g. `torch.empty_like` over `torch.empty(shape, device=...)`, a
kept slice over a new one per call). Prints one line per statement (timeit, 20,000 calls), then
the Python, torch and CPU.

    python benchmarks/host_primitives.py > benchmarks/results/host-primitives-H200.txt
"""
from __future__ import annotations

import datetime
import platform
import timeit

import torch

STATEMENTS = (
    "torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)",
    "torch.empty(shape, dtype=torch.bfloat16, device=dev)",
    "torch.empty(512, 32, 128, dtype=torch.bfloat16, device=v.device)",
    "v.new_empty(shape)", "v.new_empty(shape, dtype=torch.float32)", "v.new_empty(v.shape)",
    "torch.empty_like(v)", "torch.empty_like(v, memory_format=torch.contiguous_format)",
    "torch.empty_like(v, dtype=torch.float32)",
    "x[0]", "x.select(0, 0)", "x.squeeze(0)", "x.view(x.shape[1:])",
    "buf[:4]", "buf.narrow(0, 0, 4)",
    "torch.cuda.current_device()", "torch._C._cuda_getDevice()", "torch._C._cuda_getCurrentRawStream(0)",
    "torch.cuda.current_stream()",
    "v.get_device()", "v.device", "v.data_ptr()", "v.stride()", "v.shape", "v.size()", "v.numel()",
    "v.is_contiguous()", "x.dim()", "x.shape[1]", "x.size(1)",
)


def main() -> None:
    dev = torch.device("cuda")
    names = {"dev": dev, "shape": (512, 32, 128), "torch": torch,
             "x": torch.empty(1, 512, 48, 128, dtype=torch.bfloat16, device=dev)[..., :16, :],  # a q row view
             "v": torch.empty(512, 32, 128, dtype=torch.bfloat16, device=dev),
             "buf": torch.arange(256, dtype=torch.int32, device=dev)}
    n = 20000
    print(f"# benchmarks/host_primitives.py on {torch.cuda.get_device_name()}, "
          f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='minutes')}: host us per call")
    for stmt in STATEMENTS:
        print(f"{timeit.timeit(stmt, globals=names, number=n) / n * 1e6:7.3f} us  {stmt}")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"# Python {platform.python_version()}, torch {torch.__version__}, {cpu}")


if __name__ == "__main__":
    main()
