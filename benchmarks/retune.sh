# The re-tune and held-out check, in steps that each fit one GPU-machine call (after the setup of the engines
# bundle, benchmarks/stage_engines.sh, then of shared/device's, benchmarks/rebundle.sh: a tune stops where a
# store's rows were measured against a library baseline the machine lacks, such as SGLang's, unless TUNE_ARGS
# has --stand-in-baseline). From the project root:
#
#   bash benchmarks/retune.sh tune MINUTES     measure what the main store lacks (contest + coverage), refit routers
#                                              (TUNE_ARGS adds tune options: --device cuda:0, --definitions ...,
#                                              --no-route; the archive is $OUT/tune$TUNE_TAG.tgz; new rows take
#                                              their eager times as the store's rows did, in turns on the H200;
#                                              with TUNE_ARGS="--eager-turns-only --definitions ...", the eager
#                                              turns alone, which route warns for where a store mixes protocols:
#                                              a call of its own, ~25 pairs a second on the H200, 2026-12-02)
#   bash benchmarks/retune.sh heldout MINUTES  measure every variant on traces/heldout (never fitted on; TUNE_ARGS too)
#   bash benchmarks/retune.sh check MINUTES    the routed op against the baseline on the held-out set (BENCH_ARGS adds
#                                              bench options, e.g. --definitions; TUNE_TAG names the JSON's part)
#   bash benchmarks/retune.sh reported MINUTES every variant on the shapes the issues reported
#   bash benchmarks/retune.sh contest          bench the baseline, the reference and the routed op on the contest
#                                              workloads (CONTEST_ARGS replaces the variant and definition options)
#   bash benchmarks/retune.sh peers MINUTES    the routed op against every peer (each library-backed variant, the
#                                              baseline among them) in one run, contest workloads and the coverage
#                                              sweep (PEER_DEFS picks definitions; the part is bench-peers$TUNE_TAG-$GPU.json,
#                                              default -part: merge it into bench-peers-$GPU.json with merge_bench.py)
#   bash benchmarks/retune.sh wrapper          library-backed variants against the bare library calls
#   bash benchmarks/retune.sh prefill-host     the contest prefill's library calls, host against device time
#                                              (benchmarks/gdn_prefill_host.py; after FlashQLA's bundles)
#   bash benchmarks/retune.sh engines          the engine-convention GPU tests (pool decode / prefill, verify,
#                                              hostile indices) and every variant's GPU conformance, after
#                                              .kd-wheels/engines' setup; failures listed in $OUT/engines$ENGINES_TAG.txt
#                                              (ENGINES_FILES="file:seconds ..." picks files, e.g. to split
#                                              them over two GPUs with ENGINES_TAG naming the list;
#                                              ENGINES_SHARDS=N runs each file as N processes at once)
#   bash benchmarks/retune.sh sanitize         compute-sanitizer memcheck over every CUDA / Triton variant
#   bash benchmarks/retune.sh layer            SGLang's GDN kernel classes with and without the plugin
#                                              (benchmarks/sglang_layer.py; after the engines-deps bundle's setup)
#   bash benchmarks/retune.sh vllm-layer       vLLM's GDN layer calls with and without the plugin (benchmarks/vllm_kernels.py:
#                                              packed decode and the prefill segment; after the engines-deps and
#                                              engines-vllm bundles' setup)
#   bash benchmarks/retune.sh engine-bench     pool and gathered (vLLM) prefill and both verify contracts: every
#                                              variant and the routed op against the engine's default path
#                                              (benchmarks/gdn_engine.py)
#   bash benchmarks/retune.sh indexer-host     where the indexer variants' eager host time goes (benchmarks/variant_host.py:
#                                              host until return, kernels launched, cProfile), at decode-size and
#                                              long-context shapes (after the fi-aot or fi-jit setup: FlashInfer's top-k)
#   bash benchmarks/retune.sh moe              MoE on the contest workloads against the baseline and the floor, with
#                                              each candidate's host time (benchmarks/moe.py), then the per-kernel
#                                              profile at decode sizes with host times (benchmarks/moe_profile.py)
#
# On a machine with several GPUs, benchmarks/on_gpus.sh runs several steps at once, one GPU each (give each a
# distinct TUNE_TAG); `tune --device cuda` spreads one tune over all of them by itself.
#
# A step with MINUTES stops itself within MINUTES * 60 + 90 s and archives last: an outer `timeout` shorter than
# that kills it before the archive (a call's whole measurement lost that way, H200 2026-12-02).
# Each step archives what it wrote (stores' twins, routers, report, bench JSONs) as $OUT/<step>.tgz
# (default OUT=/tmp/kd-out), repository paths inside; the sqlite stores stay on the machine, and a
# carried twin older than its sqlite merges in harmlessly (per key, the later measurement wins).
# Every call copies the working tree afresh, so the routers a tune wrote there are gone by the next call:
# extract its archive here and refit (`kdispatch route`) before `check`, `contest` or `layer` measure them.
set -u
# Without the bundles' packages (a bundle refused or not sent) FlashInfer is missing: every row would be
# measured again under another environment, against other baselines.
[ -f /tmp/kd-site/env.sh ] || { echo "retune.sh: /tmp/kd-site/env.sh missing: the GPU setup is incomplete" >&2; exit 1; }
. benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kd-out}
DEVICE_SLUG=$(python -c "import torch; from kdispatch.tuner.store import slug; print(slug(torch.cuda.get_device_name()))")
# results files name the GPU model (H100, H200), as the README's per-device tables read them
GPU=${GPU:-$(python -c "import torch; print(torch.cuda.get_device_name().split()[1])")}
MAIN_STORE=tuner/results/$DEVICE_SLUG.sqlite
HELDOUT_STORE=tuner/results/heldout/$DEVICE_SLUG.sqlite
step=${1:?step}
minutes=${2:-9}
limit=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 90 }')  # seconds: whole or fractional minutes, plus the write-up
mkdir -p "$OUT"
keep() { tar czf "$OUT/$step${TUNE_TAG:-}.tgz" "$@" 2>/dev/null || true; }  # one archive a step: few files come back

case "$step" in
  tune)
    # shellcheck disable=SC2086  # TUNE_ARGS is a list of options
    timeout "$limit" python -m kdispatch.cli tune --max-minutes "$minutes" ${TUNE_ARGS:-} 2>&1 | tail -40
    keep tuner/results/traces routers tuner/results/report ;;
  heldout)
    # shellcheck disable=SC2086  # TUNE_ARGS as for tune (--skip-variants, --definitions ...)
    timeout "$limit" python -m kdispatch.cli tune --workloads traces/heldout \
      --store "$HELDOUT_STORE" --no-route --max-minutes "$minutes" ${TUNE_ARGS:-} 2>&1 | tail -20
    keep tuner/results/heldout/traces ;;
  check)
    # the regret on the held-out store is `kdispatch route --check` here, on the CPU, after extracting; this
    # times the routed op itself (456 pairs took ~9 min on 2026-11-27: BENCH_ARGS="--definitions ..." splits
    # them over two calls; --max-minutes keeps what was measured when time runs out)
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    timeout "$limit" python -m kdispatch.cli bench --workloads traces/heldout --variants routed \
      --max-minutes "$minutes" ${BENCH_ARGS:-} --json "benchmarks/results/bench-heldout-routed${TUNE_TAG:-}-$GPU.json" \
      2>&1 | grep -v "^\[bench\] \[" | tail -40
    keep "benchmarks/results/bench-heldout-routed${TUNE_TAG:-}-$GPU.json" ;;
  reported)
    python benchmarks/reported_shapes.py --out /tmp/reported
    timeout "$limit" python -m kdispatch.cli bench --workloads /tmp/reported --max-minutes "$minutes" \
      --json benchmarks/results/bench-reported-$GPU.json 2>&1 | grep -v "^\[bench\] \[" | tail -40
    keep benchmarks/results/bench-reported-$GPU.json ;;
  contest)
    # with the project's reference timed in the same run (the README's second speedup column) where it is
    # quick enough: not for gdn_prefill, whose reference takes up to 1.7 s a call (CONTEST_ARGS overrides)
    # shellcheck disable=SC2086  # CONTEST_ARGS is a list of options
    # (a part of the definitions: merge it into bench-all-$GPU.json with benchmarks/merge_bench.py)
    timeout 560 python -m kdispatch.cli bench --workloads traces ${CONTEST_ARGS:---variants reference \
      --definitions dsa_sparse_attention dsa_topk_indexer gdn_decode moe_fp8} --max-minutes 8 \
      --json "benchmarks/results/bench-all${TUNE_TAG:--part}-$GPU.json" 2>&1 | tail -30
    keep "benchmarks/results/bench-all${TUNE_TAG:--part}-$GPU.json" ;;
  peers)
    defs=${PEER_DEFS:-moe_fp8 dsa_sparse_attention dsa_topk_indexer gdn_prefill}
    # shellcheck disable=SC2086  # lists of names
    peers=$(python -c "import sys; from kdispatch import definitions as d, registry as r
print(*sorted({v.name for n in sys.argv[1:] for v in r.variants(d.resolve_name(n)) if v.backend == 'library'}))" $defs)
    # shellcheck disable=SC2086
    timeout "$limit" python -m kdispatch.cli bench --workloads traces traces/coverage --definitions $defs \
      --variants routed $peers --max-minutes "$minutes" --json "benchmarks/results/bench-peers${TUNE_TAG:--part}-$GPU.json" \
      2>&1 | grep -v "^\[bench\] \[" | tail -40
    keep "benchmarks/results/bench-peers${TUNE_TAG:--part}-$GPU.json" ;;
  wrapper)
    timeout 300 python benchmarks/wrapper_overhead.py --json benchmarks/results/wrapper-overhead-$GPU.json \
      > /tmp/wrapper.txt 2>&1
    cat /tmp/wrapper.txt
    cp /tmp/wrapper.txt benchmarks/results/wrapper-overhead-$GPU.txt
    keep benchmarks/results/wrapper-overhead-$GPU.json benchmarks/results/wrapper-overhead-$GPU.txt ;;
  prefill-host)
    timeout 540 python benchmarks/gdn_prefill_host.py --json benchmarks/results/gdn-prefill-host-$GPU.json 2>&1 \
      | grep -v TileLang | tail -80
    keep benchmarks/results/gdn-prefill-host-$GPU.json ;;
  engines)
    log="$OUT/engines${ENGINES_TAG:-}.txt"
    : > "$log"
    # one file at a time, each with its own time limit (seconds): one that runs out still leaves the others'
    # results; ENGINES_FILES picks some (e.g. to split them over two GPUs)
    for entry in ${ENGINES_FILES:-test_oracles_gpu:60 test_gdn_packed_gpu:60 test_gdn_pool_prefill_gpu:90 test_gdn_gathered_prefill_gpu:90 test_gdn_verify_gpu:60 test_prefill_guard_gpu:60 \
                 test_hostile_gpu:320 test_gpu_conformance:360 test_triton_dsa_moe:120 test_moe_experts_gpu:120}; do
      t=${entry%%:*}
      n=${ENGINES_SHARDS:-1}  # processes per file at once (KD_TEST_SHARD, tests/conftest.py): compiles overlap
      for ((i = 0; i < n; i++)); do
        ( KD_TEST_SHARD=$i/$n timeout "${entry##*:}" python -m pytest -q -rf -p no:cacheprovider "tests/gpu/$t.py" \
            > "$log.$i" 2>&1 || echo "== $t shard $i/$n: exit $?" >> "$log.$i" ) &
      done
      wait
      for ((i = 0; i < n; i++)); do echo "== $t shard $i/$n" >> "$log"; cat "$log.$i" >> "$log"; rm -f "$log.$i"; done
    done
    grep -E "^== |^(FAILED|ERROR)|passed|failed" "$log" | cut -c1-300 | tail -60 ;;
  layer)
    timeout 500 python benchmarks/sglang_layer.py --json benchmarks/results/sglang-layer-$GPU.json 2>&1 | tail -75
    keep benchmarks/results/sglang-layer-$GPU.json ;;
  vllm-layer)
    timeout 500 python benchmarks/vllm_kernels.py --json benchmarks/results/vllm-kernels-$GPU.json 2>&1 | tail -50
    keep benchmarks/results/vllm-kernels-$GPU.json ;;
  sanitize)
    timeout 240 python tests/gpu/sanitize.py --tools memcheck --timeout 200 --json "$OUT/sanitize.json" > "$OUT/sanitize.txt" 2>&1
    tail -25 "$OUT/sanitize.txt" ;;
  engine-bench)
    for family in prefill gathered verify verify_steps; do
      timeout 180 python benchmarks/gdn_engine.py $family --json benchmarks/results/gdn-engine-$family-$GPU.json \
        2>&1 | tail -25
    done
    keep benchmarks/results/gdn-engine-*-$GPU.json ;;
  indexer-host)
    timeout 300 python benchmarks/variant_host.py dsa_topk_indexer triton_fp8_torch_topk triton_fp8_flashinfer_topk \
      cuda_wgmma_radix triton_passthrough --shape batch_size=1,max_num_pages=845,num_pages=16384 \
      --shape batch_size=51,max_num_pages=144,num_pages=16384 --shape batch_size=8,max_num_pages=30,num_pages=4096 \
      --shape batch_size=64,max_num_pages=91,num_pages=8192 \
      --json benchmarks/results/indexer-host-$GPU.json 2>&1 | tail -120
    keep benchmarks/results/indexer-host-$GPU.json ;;
  moe)
    timeout 420 python benchmarks/moe.py --out benchmarks/results/moe-$GPU.json 2>&1 | tail -30
    (cd benchmarks && timeout 170 python moe_profile.py --host) > benchmarks/results/moe-profile-$GPU.txt 2>&1
    cat benchmarks/results/moe-profile-$GPU.txt
    keep benchmarks/results/moe-$GPU.json benchmarks/results/moe-profile-$GPU.txt ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
