#!/usr/bin/env bash
# DeepGEMM's first-kernel-call segfault (kernels/library/deepgemm_gate.py), diagnosed in one GPU-machine
# call (< 5 min), after .kd-wheels/deepgemm/gpu-setup.sh built /tmp/kd-deepgemm/src in an earlier call
# of the same hold (benchmarks/stage_deepgemm.sh). Writes $OUT/diag.log.
#
# Found on 2026-11-27 (H100 host: torch 2.11+cu130, system g++ 13.3): every call that reaches DeepGEMM's
# JIT crashes before any compile or CUDA call, fresh cache or not, NVCC or NVRTC, indexer metadata or MoE
# GEMM alike: inside std::regex's compiler (IncludeParser::get_includes, the JIT cache key, compiles
# `#\s*include...`; a character class, `_BracketMatcher::_M_ready`), at a program counter that the
# symbol table places in an unrelated libstdc++ function: a wrong call target. Building the extension
# with -Wl,-Bsymbolic, with -fno-gnu-unique (its regex statics had bound to libtorch_python.so's
# copies) or with -static-libstdc++ changed nothing. The cases below separate DeepGEMM from the
# toolchain: the same regex in a plain program, in a shared library loaded after `import torch`, and in
# a torch extension built as _C.so is; DeepGEMM (staged since with its regexes replaced by string scans,
# benchmarks/deepgemm_without_regex.py: the metadata call shows whether that is enough) alone and with
# the system libstdc++ preloaded; then a debugger's view of any faulting instruction. Each case is its
# own process, with a native backtrace on SIGSEGV / SIGBUS / SIGABRT (an LD_PRELOADed handler) and
# unbuffered C output.
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
# where _C.so's C++ runtime symbols bind outside _C.so and the runtime itself (a torch copy of a
# locale facet id or of a regex static would be the bug)
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=$W/ldb python3 -c 'import torch, deep_gemm' >/dev/null 2>&1
cat $W/ldb.* 2>/dev/null | grep "binding file $R/deep_gemm/_C.so" | grep -v -e "to $R/deep_gemm/_C.so" -e "/libstdc++.so" -e "/libc.so" -e "/libgcc_s" \
  | grep -E 'locale|collate|ctype|__detail|filesystem|fmt' | cut -c1-300 | head -12; rm -f $W/ldb.*
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
import ctypes, sys
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
say("before exit")
PY
t() { local label=$1 mode=$2; shift 2; echo; echo "=== $label (t=${SECONDS}s)"
  env LD_PRELOAD=$W/bt.so "$@" timeout 200 python3 -X faulthandler $W/t.py "$mode"; echo "=== $label rc=$?"; }
t exception exc DG_JIT_CACHE_DIR=$W/c1
t meta meta DG_JIT_CACHE_DIR=$W/c1
t meta-system-libstdcxx meta DG_JIT_CACHE_DIR=$W/c1 LD_PRELOAD="$W/bt.so $(g++ -print-file-name=libstdc++.so.6)"
# the include parser's regex alone: a program, a library loaded after torch, a torch extension
cat > $W/rx.cpp <<'CPP'
#include <regex>
#include <string>
extern "C" int rx_scan() {
  const std::string code = "#include <a.h>\n# include \"b.h\"\n";
  const std::regex pattern(R"(#\s*include\s*[<"][^>"]+[>"])");
  int n = 0;
  for (std::sregex_iterator it(code.begin(), code.end(), pattern), end; it != end; ++it) ++n;
  return n;
}
#ifdef RX_MAIN
#include <cstdio>
int main() { std::printf("regex matches %d\n", rx_scan()); }
#endif
CPP
echo; echo "=== regex-program"; g++ -O2 -std=c++17 -DRX_MAIN -o $W/rx $W/rx.cpp && $W/rx; echo "=== regex-program rc=$?"
g++ -O2 -std=c++17 -shared -fPIC -o $W/rx.so $W/rx.cpp
echo; echo "=== regex-library-after-torch"
LD_PRELOAD=$W/bt.so timeout 60 python3 -c "import torch, ctypes; print('regex matches', ctypes.CDLL('$W/rx.so').rx_scan())"
echo "=== regex-library-after-torch rc=$?"
echo; echo "=== regex-torch-extension"
LD_PRELOAD=$W/bt.so timeout 200 python3 - <<PY
import torch
from torch.utils.cpp_extension import load_inline
src = open("$W/rx.cpp").read() + "int scan() { return rx_scan(); }"
m = load_inline("rx_ext", cpp_sources=[src], functions=["scan"], build_directory="$W", verbose=False)
print("regex matches", m.scan())
PY
echo "=== regex-torch-extension rc=$?"
# resolve DeepGEMM frames of any native backtrace
grep -o '_C\.so(+0x[0-9a-f]*)' "$O/diag.log" | sed 's/.*(+\(0x[0-9a-f]*\))/\1/' | sort -u | head -20 \
  | xargs -r addr2line -C -f -e "$R/deep_gemm/_C.so" | paste - - | head -20
if grep -q '=== meta rc=139' "$O/diag.log"; then
  echo "=== debugger on the metadata call: the faulting instruction, its registers, the call chain"
  gdb=$(command -v gdb || command -v cuda-gdb)
  DG_JIT_CACHE_DIR=$W/c1 timeout 180 "$gdb" -q -batch -ex 'set pagination off' -ex run -ex 'p $_siginfo.si_code' \
    -ex 'p $_siginfo._sifields._sigfault.si_addr' -ex 'info symbol $pc' -ex 'x/12i $pc-24' -ex 'info registers' \
    -ex 'bt 25' --args python3 $W/t.py meta 2>&1 | grep -v '^\[New Thread\|^\[Thread\|^\[Detaching' | head -90
fi
echo "done in ${SECONDS}s"
