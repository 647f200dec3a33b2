#!/usr/bin/env bash
# DeepGEMM's first-JIT-call segfault (kernels/library/deepgemm_gate.py), diagnosed in one GPU-machine
# call (< 10 min), after .kd-wheels/deepgemm/gpu-setup.sh built /tmp/kd-deepgemm/src in an earlier call
# of the same hold (benchmarks/stage_deepgemm.sh). Writes $OUT/diag.log.
#
# Reading DeepGEMM 2.6.1's source found no host path that crashes (its failures throw); the candidates
# are: only the process that compiles crashes (nvcc child, cache rename, first load), a fault inside
# libcuda at the first load or launch, a crash at exit (its runtimes' destructors), or exceptions that
# cannot unwind. Each case below is its own process, C stdout unbuffered (DeepGEMM prints with printf)
# and a native backtrace on SIGSEGV / SIGBUS / SIGABRT (an LD_PRELOADed handler): the last "PY:" or
# DeepGEMM line before a crash places it (before "Running NVCC command": compiler set-up; before
# "Loading CUBIN": compile or cache; after "Launch kernel": libcuda; after "PY: before exit": teardown).
# A fresh-cache crash with a passing cache hit: the compile path; NVRTC passing: the nvcc child.
set -u
R=/tmp/kd-deepgemm/src; W=/tmp/dgdiag; O=${OUT:-$W/out}; mkdir -p "$W" "$O"
export PYTHONPATH="$R${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
exec > >(tee "$O/diag.log") 2>&1
[ -f "$R/deep_gemm/_C.so" ] || { echo "no build at $R: run gpu-setup.sh first"; exit 1; }
echo "== env"; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "stack $(ulimit -s)"; ldd --version | head -1; gcc --version | head -1; "$CUDA_HOME/bin/nvcc" --version | tail -2
echo "HOME=$HOME"; env | grep -E '^(DG_|CUDA|LD_|TMPDIR)' ; ls ~/.deep_gemm/cache 2>/dev/null | head -5
python3 -c 'import sys,torch;print(sys.version.split()[0],torch.__version__,torch.version.cuda)'
readelf -p .comment "$R/deep_gemm/_C.so" | grep -i gcc | head -2
ldd "$R/deep_gemm/_C.so" | grep -E 'cuda|nvrtc|cublas|stdc\+\+|not found'
# which library each of _C.so's libstdc++/fmt template symbols binds to (expect _C.so itself)
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=$W/ldb python3 -c 'import torch, deep_gemm' >/dev/null 2>&1
cat $W/ldb.* 2>/dev/null | grep "binding file $R/deep_gemm/_C.so" | grep -v "to $R/deep_gemm/_C.so" \
  | grep -E '__detail|filesystem|random_device|fmt' | head -5; rm -f $W/ldb.*
cat > $W/bt.c <<'C'
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static void h(int s, siginfo_t *si, void *u) {
  char m[160]; void *b[64];
  int l = snprintf(m, sizeof m, "\n=== native signal %d addr %p pid %d, backtrace:\n", s, si->si_addr, getpid());
  write(2, m, l); backtrace_symbols_fd(b, backtrace(b, 64), 2);
  signal(s, SIG_DFL); raise(s);
}
__attribute__((constructor)) static void init(void) {
  static char stk[1 << 16]; void *d[1]; backtrace(d, 1);
  stack_t ss = {.ss_sp = stk, .ss_size = sizeof stk}; sigaltstack(&ss, 0);
  struct sigaction sa = {0}; sa.sa_sigaction = h; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0); sigaction(SIGBUS, &sa, 0); sigaction(SIGABRT, &sa, 0);
}
C
gcc -shared -fPIC -o $W/bt.so $W/bt.c || echo "bt.so not built"
cat > $W/t.py <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None)
libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, 2, 0)  # DeepGEMM's printf unbuffered
def say(*a): print("PY:", *a, flush=True)
import torch, deep_gemm
say("deep_gemm", deep_gemm.__file__, deep_gemm.__version__)
n = deep_gemm.get_num_sms(); say("sms", n); mode = sys.argv[1]
if mode == "exc":  # a DG_HOST_ASSERT before any JIT: must be a RuntimeError, not a crash
    try: deep_gemm.get_paged_mqa_logits_metadata(torch.tensor([100], dtype=torch.int32, device="cuda"), 64, n)
    except Exception as e: say("exception translated:", type(e).__name__, str(e)[:160])
elif mode == "meta":
    ctx = torch.tensor([[100]], dtype=torch.int32, device="cuda"); say("calling metadata")
    m = deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, n); say("returned")
    torch.cuda.synchronize(); say("synced", m[:2].tolist())
elif mode == "moe":
    E, N, K, M = 2, 512, 512, 256
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn); sa = torch.ones(M, K // 128, device="cuda")
    b = torch.randn(E, N, K, device="cuda").to(torch.float8_e4m3fn); sb = torch.ones(E, N // 128, K // 128, device="cuda")
    d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    idx = (torch.arange(M, device="cuda", dtype=torch.int32) // 128) % E; say("calling m_grouped")
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, idx); say("returned")
    torch.cuda.synchronize(); say("synced")
say("before exit")
if os.environ.get("HARD_EXIT"): os._exit(0)
PY
t() { local label=$1 mode=$2; shift 2; echo; echo "=== $label (t=${SECONDS}s)"
  env LD_PRELOAD=$W/bt.so "$@" timeout 200 python3 -X faulthandler $W/t.py "$mode"; echo "=== $label rc=$?"; }
t exception exc DG_JIT_CACHE_DIR=$W/c1
t meta-nvcc-fresh meta DG_JIT_CACHE_DIR=$W/c1 DG_JIT_DEBUG=1
find $W/c1 -maxdepth 3 | sed "s|$W/||" | head -20
t meta-nvcc-cachehit meta DG_JIT_CACHE_DIR=$W/c1 DG_JIT_DEBUG=1
t meta-hard-exit meta DG_JIT_CACHE_DIR=$W/c1 HARD_EXIT=1
t meta-nvrtc-fresh meta DG_JIT_CACHE_DIR=$W/c2 DG_JIT_USE_NVRTC=1 DG_JIT_PRINT_COMPILER_COMMAND=1
t moe-nvcc-fresh moe DG_JIT_CACHE_DIR=$W/c3 DG_JIT_PRINT_COMPILER_COMMAND=1
t moe-nvcc-cachehit moe DG_JIT_CACHE_DIR=$W/c3
# resolve DeepGEMM frames of any native backtrace
grep -o '_C\.so(+0x[0-9a-f]*)' "$O/diag.log" | sed 's/.*(+\(0x[0-9a-f]*\))/\1/' | sort -u | head -20 \
  | xargs -r addr2line -C -f -e "$R/deep_gemm/_C.so" | paste - - | head -20
if [ "$SECONDS" -lt 380 ] && grep -q 'rc=139' "$O/diag.log"; then
  echo "=== cuda-gdb on a fresh-cache metadata call"
  DG_JIT_CACHE_DIR=$W/c4 timeout 180 cuda-gdb -q -batch -ex 'set pagination off' -ex run -ex bt \
    -ex 'info sharedlibrary' --args python3 $W/t.py meta 2>&1 | grep -v '^\[New Thread\|^\[Thread' | tail -60
fi
echo "done in ${SECONDS}s"
