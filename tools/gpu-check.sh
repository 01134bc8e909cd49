#!/usr/bin/env bash
# tools/gpu-check.sh — everything a session with a GPU should run, in one go, inside a fixed
# time budget: build (release, -j16), the CUDA tests, mmrt-plugin-check on the CUDA plugin,
# the LLaVA golden test with MMRT_TEST_PLUGIN=cuda, compute-sanitizer passes and mmrt-bench
# where they exist. Full logs go into LOGDIR; a table (step, result, key figure) is printed at
# the end and written to LOGDIR/summary.txt.
#
#   tools/gpu-check.sh LOGDIR             run (LOGDIR is created)
#   tools/gpu-check.sh --dry-run [LOGDIR] print the plan, run nothing
#
# Every step runs under `timeout`, and the whole run under a budget (MMRT_GPU_BUDGET seconds,
# default 450, i.e. under 8 minutes with setup): a step gets min(its cap, what is left), and
# steps that no longer fit are SKIPPED, so one hang cannot eat the session. Steps are ordered
# by value: build, operator tests, device contract, plugin-check, LLaVA, sanitizers, bench.
#
# Knobs (environment): MMRT_GPU_BUILD (build dir, default <repo>/build-gpu-check),
# MMRT_GPU_JOBS (default 16), MMRT_GPU_BUDGET, MMRT_BENCH_ARGS (default "--plugin cuda").
# Debian packages: scripts/install-deps.sh runs only if something is missing, with short apt
# timeouts (no network → it fails fast and the run goes on). If CMake cannot configure (a
# missing package), the CUDA plugin, the CPU plugin and test_cuda_ops are built directly with
# nvcc/gcc instead (needs only the CUDA toolkit and libcmocka).
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dry=0
logdir=""
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) logdir=$a ;;
  esac
done
if [ -z "$logdir" ]; then
  if [ $dry -eq 1 ]; then logdir="<LOGDIR>"; else echo "usage: $0 [--dry-run] LOGDIR" >&2; exit 2; fi
fi
build=${MMRT_GPU_BUILD:-$here/build-gpu-check}
jobs=${MMRT_GPU_JOBS:-16}
budget=${MMRT_GPU_BUDGET:-450}
# mmrt-bench places stages through a deploy.ini ([device.*] only; it has no --plugin flag)
bench_conf="$logdir/bench-cuda.ini"
bench_args=${MMRT_BENCH_ARGS:---conf $bench_conf --shape llava-1.5-7b --layers 4 --dtype f16}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$cuda_home/bin"

if [ $dry -eq 0 ]; then
  mkdir -p "$logdir" || exit 2
  logdir=$(cd "$logdir" && pwd)
fi
start=$(date +%s)
summary=()

left() { echo $(( budget - ($(date +%s) - start) )); }

# run_step NAME CAP COMMAND — runs COMMAND (a bash string) in the repo root with a timeout,
# logging to LOGDIR/NAME.log; sets $rc and $secs.
rc=0
secs=0
run_step() {
  local name=$1 cap=$2 cmd=$3 t
  t=$(left)
  t=$(( t - 10 < cap ? t - 10 : cap ))
  if [ $dry -eq 1 ]; then
    printf '[%-13s] timeout %4ss: %s\n' "$name" "$cap" "$cmd"
    rc=0; secs=0; return 0
  fi
  if [ "$t" -lt 15 ]; then
    rc=200; secs=0
    echo "== $name: skipped, no time left" | tee "$logdir/$name.log"
    return 0
  fi
  echo "== $name (timeout ${t}s)"
  local s0; s0=$(date +%s)
  (cd "$here" && timeout -k 10 "$t" bash -c "set -o pipefail; $cmd") > "$logdir/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - s0 ))
  echo "   rc $rc after ${secs}s (log: $logdir/$name.log)"
}

# result RC → PASS / SKIP / TIMEOUT / FAIL
result() {
  case $1 in
    0) echo PASS ;;
    77) echo SKIP ;;
    124|137) echo TIMEOUT ;;
    200) echo "SKIP(time)" ;;
    *) echo "FAIL($1)" ;;
  esac
}

add() { summary+=("$(printf '%-14s %-11s %5ss  %s' "$1" "$2" "$3" "$4")"); }

env_for_tests="MMRT_PLUGIN_PATH=$build/bin MMRT_SOURCE_DIR=$here MMRT_BUILD_DIR=$build"

# ---- 1. environment --------------------------------------------------------------------
run_step env 30 "nvidia-smi; nvidia-smi -q | head -40; nvcc --version; cmake --version | head -1; \
gcc --version | head -1; nproc; free -g; ls \$(dirname \$(command -v nvcc)) | tr '\\n' ' '; git -C '$here' log -1 --oneline 2>/dev/null; \
git -C '$here' status --short | head -50"
[ $dry -eq 0 ] && add env "$(result $rc)" "$secs" "$(grep -m1 -o 'NVIDIA [A-Z0-9 -]*' "$logdir/env.log" | head -1) driver $(grep -m1 -o 'Driver Version: [0-9.]*' "$logdir/env.log" | cut -d' ' -f3)"

# ---- 2. Debian packages (only when something is missing, fast failure without network) --
aptconf="<apt.conf>"
[ $dry -eq 0 ] && aptconf=$(mktemp 2>/dev/null || echo /tmp/gpu-check-apt.conf) && printf 'Acquire::Retries "0";\nAcquire::http::Timeout "8";\nAcquire::https::Timeout "8";\n' > "$aptconf"
run_step deps 100 "APT_CONFIG=$aptconf bash scripts/install-deps.sh"
[ $dry -eq 0 ] && add deps "$(result $rc)" "$secs" "$( [ $rc -eq 0 ] && echo 'packages present' || echo 'install-deps failed: continuing (OpenCL optional)')"

# ---- 3. configure + build --------------------------------------------------------------
# RelWithDebInfo: the project's optimised build (scripts/build.sh), with symbols for a crash.
# (Release's -O3 currently trips -Werror=maybe-uninitialized in other modules.)
run_step configure 90 "cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=RelWithDebInfo"
cfg_rc=$rc
[ $dry -eq 0 ] && add configure "$(result $rc)" "$secs" "$(grep -m1 -i 'CUDA compiler identification\|no CUDA compiler' "$logdir/configure.log" | sed 's/^-- //')"
key_ok=0
if [ $cfg_rc -eq 0 ] || [ $dry -eq 1 ]; then
  # -k: an unrelated target that fails (another module in progress) must not stop the rest.
  run_step build 300 "cmake --build '$build' -j$jobs -- -k"
  if [ $dry -eq 0 ]; then
    # "Built target" is printed for up-to-date targets too, and never for failed ones, so a
    # stale binary from an earlier build is not mistaken for a fresh one.
    key_ok=1
    for t in mmrt_cuda mmrt_cpu test_cuda_ops; do
      grep -q "Built target $t\$" "$logdir/build.log" || key_ok=0
    done
    have="$(for t in mmrt_cuda mmrt_cpu test_cuda_ops test_cuda_device mmrt_cuda_emu_test test_llava test_engine mmrt-plugin-check mmrt-bench; do grep -q "Built target $t\$" "$logdir/build.log" && printf '%s ' "$t"; done)"
    res=$(result $rc)
    [ $rc -ne 0 ] && [ $key_ok -eq 1 ] && res=PARTIAL
    add build "$res" "$secs" "built: $have"
  fi
fi
if [ $dry -eq 1 ] || [ $key_ok -eq 0 ]; then
  # Fallback without CMake: the CUDA plugin (sm_90 only, for time), the CPU plugin and the
  # operator test, straight from the compilers.
  d="$build/bin"
  run_step direct_build 240 "set -e; mkdir -p '$d' '$build/direct'; cd '$build/direct'; \
for f in cuda_kernels cuda_gemm cuda_attention; do nvcc -std=c++17 -O3 -Xcompiler -fPIC -arch=sm_90 \
-I'$here/core/include' -I'$here/plugins/cuda' -c '$here/plugins/cuda/'\$f.cu -o \$f.o; done; \
for f in cuda_plugin cuda_args cuda_ops cuda_ops_gemm; do gcc -std=c11 -O2 -fPIC -fvisibility=hidden \
-D_GNU_SOURCE -DMMRT_PLUGIN_VERSION='\"gpu-check\"' -I'$here/core/include' -I'$here/plugins/common' -I'$cuda_home/include' \
-c '$here/plugins/cuda/'\$f.c -o \$f.o; done; \
g++ -shared -o '$d/libmmrt_cuda.so' cuda_*.o -L'$cuda_home/lib64' -lcudart -lcublas -Wl,-rpath,'$cuda_home/lib64'; \
cf=\"-std=c11 -O2 -fPIC -fvisibility=hidden -D_GNU_SOURCE -I$here/core/include -I$here/plugins/common\"; \
for f in '$here'/plugins/cpu/cpu_*.c; do case \$f in *_kern_*) continue;; esac; \
gcc \$cf -c \$f -o cpu_\$(basename \$f .c).o; done; \
x5=\"-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq\"; \
gcc \$cf -mavx2 -mfma -mf16c -c '$here/plugins/cpu/cpu_kern_avx2.c' -o cpu_k2.o; \
gcc \$cf \$x5 -c '$here/plugins/cpu/cpu_kern_avx512.c' -o cpu_k5.o; \
gcc \$cf \$x5 -mavx512bf16 -c '$here/plugins/cpu/cpu_kern_avx512bf16.c' -o cpu_k6.o; \
gcc -shared -o '$d/libmmrt_cpu.so' cpu_cpu_*.o cpu_k2.o cpu_k5.o cpu_k6.o -pthread -lm; \
gcc -std=c11 -O2 -D_GNU_SOURCE -I'$here/core/include' -I'$here/core' -I'$here/tests' '$here/tests/test_cuda_ops.c' \
'$here/tests/ref_ops.c' '$here/tests/op_cases.c' '$here/tests/plugin_harness.c' '$here/core/quant.c' \
-o '$d/test_cuda_ops' -lcmocka -ldl -lm"
  [ $dry -eq 0 ] && add direct_build "$(result $rc)" "$secs" "fallback build (CMake failed)"
fi

# ---- 4. what the binary carries ----------------------------------------------------------
cuobj=$(command -v cuobjdump || true)
if [ $dry -eq 1 ] || [ -n "$cuobj" ]; then
  run_step fatbin 20 "${cuobj:-cuobjdump} --list-elf '$build/bin/libmmrt_cuda.so'; ${cuobj:-cuobjdump} --list-ptx '$build/bin/libmmrt_cuda.so'"
  [ $dry -eq 0 ] && add fatbin "$(result $rc)" "$secs" "$(grep -o 'sm_[0-9]*\.\(cubin\|ptx\)' "$logdir/fatbin.log" | sort -u | tr '\n' ' ')"
else
  add fatbin SKIP 0 "no cuobjdump"
fi

# ---- 5. operator tests: every op vs the CPU plugin and the double reference -------------
run_step cuda_ops 240 "env $env_for_tests MMRT_TEST_VERBOSE=1 '$build/bin/test_cuda_ops'"
if [ $dry -eq 0 ] && [ ! -x "$build/bin/test_cuda_ops" ]; then
  add cuda_ops MISSING 0 "test_cuda_ops was not built (see build.log)"
elif [ $dry -eq 0 ]; then
  fails=$(grep -c '^\[  FAILED  \] test_' "$logdir/cuda_ops.log")
  passed=$(grep -m1 -o 'PASSED  \] [0-9]* test' "$logdir/cuda_ops.log" | grep -o '[0-9]*')
  att=$(grep 'OPSTAT ATTENTION ' "$logdir/cuda_ops.log" | awk '{print $4}')
  paged=$(grep 'OPSTAT ATTENTION_PAGED ' "$logdir/cuda_ops.log" | awk '{print $4}')
  mm=$(grep 'OPSTAT MATMUL ' "$logdir/cuda_ops.log" | awk '{print $4}')
  # GATHER_HEADS is exact: its err_vs_ref column is 1 when any case was not bit-exact, else 0.
  gather=$(grep 'OPSTAT GATHER_HEADS ' "$logdir/cuda_ops.log" | awk '{print $4}')
  l2=$(grep 'OPSTAT L2_NORM ' "$logdir/cuda_ops.log" | awk '{print $4}')
  add cuda_ops "$(result $rc)" "$secs" "${passed:-0} tests passed, $fails failed; worst err attention ${att:-?} paged ${paged:-?} matmul ${mm:-?} l2_norm ${l2:-?}; gather_heads inexact: ${gather:-?}"
  grep '^OPSTAT' "$logdir/cuda_ops.log" > "$logdir/opstat.txt" 2>/dev/null
  grep -B2 -A8 '\[  FAILED  \]\|\[  ERROR   \]\|Failure\|failed:' "$logdir/cuda_ops.log" | head -80 > "$logdir/cuda_ops.failures.txt"
fi

# ---- 6. device contract (memory, transfers, options) -------------------------------------
if [ $dry -eq 1 ] || [ -x "$build/bin/test_cuda_device" ]; then
  run_step cuda_device 60 "env $env_for_tests '$build/bin/test_cuda_device'"
  [ $dry -eq 0 ] && add cuda_device "$(result $rc)" "$secs" "$(grep -m1 -o 'PASSED  \] [0-9]* test(s)' "$logdir/cuda_device.log")"
else
  add cuda_device MISSING 0 "test_cuda_device was not built (see build.log)"
fi

# ---- 7. mmrt-plugin-check ----------------------------------------------------------------
if [ $dry -eq 1 ] || [ -x "$build/bin/mmrt-plugin-check" ]; then
  run_step plugin_check 120 "env $env_for_tests '$build/bin/mmrt-plugin-check' --json '$build/bin/libmmrt_cuda.so' > '$logdir/plugin_check.json'; rc=\$?; tail -c 4000 '$logdir/plugin_check.json'; exit \$rc"
  if [ $dry -eq 0 ]; then
    key=$(python3 - "$logdir/plugin_check.json" 2>/dev/null <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as e:
    print("unparsed json: %s" % e); sys.exit()
items = []
def walk(o):
    if isinstance(o, dict):
        s = o.get("status", o.get("result"))
        if isinstance(s, str): items.append(s.lower())
        for v in o.values(): walk(v)
    elif isinstance(o, list):
        for v in o: walk(v)
walk(doc)
print("%d pass, %d fail, %d other" % (items.count("pass"), items.count("fail"),
      len(items) - items.count("pass") - items.count("fail")))
EOF
)
    add plugin_check "$(result $rc)" "$secs" "${key:-see log}"
  fi
else
  add plugin_check "SKIP" 0 "no $build/bin/mmrt-plugin-check"
fi

# ---- 8. LLaVA golden test on CUDA ----------------------------------------------------------
if [ $dry -eq 1 ] || [ -x "$build/bin/test_llava" ]; then
  run_step llava_cuda 150 "env $env_for_tests MMRT_TEST_PLUGIN=cuda '$build/bin/test_llava'"
  if [ $dry -eq 0 ]; then
    if grep -q MMRT_TEST_PLUGIN "$here/tests/test_llava.c"; then how="both stages on cuda"; else how="test_llava.c ignores MMRT_TEST_PLUGIN: ran on cpu"; fi
    # llava-tiny-swa is Mistral with sliding_window 12: the window's kernels against transformers
    swa=$(grep -m1 -o 'llava-tiny-swa: 12 cases, worst relative error: [^;]*' "$logdir/llava_cuda.log" | sed 's/.*error: //')
    add llava_cuda "$(result $rc)" "$secs" "$how; $(grep -m1 -o 'PASSED  \] [0-9]* test(s)' "$logdir/llava_cuda.log"); sliding window: ${swa:-not run}"
  fi
else
  add llava_cuda "SKIP" 0 "no test_llava"
fi

# ---- 8b. the other models' golden tests on CUDA (both stages on the GPU) -----------------
for model_test in test_llava_next test_fuyu test_qwen2vl; do
  if [ $dry -eq 1 ] || [ -x "$build/bin/$model_test" ]; then
    run_step "${model_test}_cuda" 120 "env $env_for_tests MMRT_TEST_PLUGIN=cuda '$build/bin/$model_test'"
    [ $dry -eq 0 ] && add "${model_test}_cuda" "$(result $rc)" "$secs" \
      "$(grep -m1 -o 'PASSED  \] [0-9]* test(s)' "$logdir/${model_test}_cuda.log")"
  else
    add "${model_test}_cuda" "SKIP" 0 "no $model_test"
  fi
done

# ---- 8c. the decode step as a CUDA graph: captured once, replayed per token --------------
if [ $dry -eq 1 ] || [ -x "$build/bin/mmrt" ]; then
  gconf="$logdir/graph-decode.ini"
  [ $dry -eq 0 ] && printf '[model]\npath = %s/tests/fixtures/llava-tiny\n\n[device.gpu0]\nplugin = cuda\npool_mb = 256\n\n[run]\nimage = %s/tests/fixtures/llava-images/grad_45x90.png\nprompt = What is shown in this image?\nmax_tokens = 16\n' "$here" "$here" > "$gconf"
  run_step graph_decode 60 "env $env_for_tests MMRT_LOG=debug '$build/bin/mmrt' --conf '$gconf' --json"
  [ $dry -eq 0 ] && add graph_decode "$(result $rc)" "$secs" "$(grep -o '"decode_graph": *[a-z]*' "$logdir/graph_decode.log" | head -1); $(grep -m1 -o 'graph capture failed[^"]*' "$logdir/graph_decode.log" | cut -c1-60)"
  # The same with the INT8 KV store (ABI 1.7): SET_ROWS writes codes and row scales, paged
  # attention reads its scales as sources 6 and 7 (op_args.src_ext) inside the captured step.
  # The operator tests check the kernels; this checks the store end to end through a graph.
  gconf8="$logdir/graph-decode-int8.ini"
  [ $dry -eq 0 ] && sed 's/^\[model\]$/[model]\nkv_dtype = int8/' "$gconf" > "$gconf8"
  run_step graph_decode_int8 60 "env $env_for_tests MMRT_LOG=debug '$build/bin/mmrt' --conf '$gconf8' --json"
  [ $dry -eq 0 ] && add graph_decode_int8 "$(result $rc)" "$secs" "$(grep -o '"decode_graph": *[a-z]*' "$logdir/graph_decode_int8.log" | head -1); $(grep -m1 -o 'graph capture failed[^"]*' "$logdir/graph_decode_int8.log" | cut -c1-60)"
fi

# ---- 8d. the engine on CUDA: batched, chunked, preempted requests against their solo bits -
# (cuBLAS picks GEMM algorithms by shape, so a failure here measures how far batch
# invariance is from holding on the GPU; the log names the first differing step.)
if [ $dry -eq 1 ] || [ -x "$build/bin/test_engine" ]; then
  # image-token KV compression: compacted page stores row by row against the host plan
  run_step kv_compress_cuda 60 "env $env_for_tests '$build/bin/test_kv_compress'"
  [ $dry -eq 0 ] && add kv_compress_cuda "$(result $rc)" "$secs" "$(grep -m1 -o 'PASSED  \] [0-9]* test(s)' "$logdir/kv_compress_cuda.log")"
  run_step engine_cuda 150 "env $env_for_tests MMRT_TEST_PLUGIN=cuda '$build/bin/test_engine'"
  [ $dry -eq 0 ] && add engine_cuda "$(result $rc)" "$secs" "$(grep -m1 -o 'PASSED  \] [0-9]* test(s)' "$logdir/engine_cuda.log"); $(grep -m1 -o 'differ from its solo run (rel [^)]*)' "$logdir/engine_cuda.log")"
else
  add engine_cuda "SKIP" 0 "no test_engine"
fi

# ---- 9. compute-sanitizer: out-of-bounds / races in the kernels (quick case list) --------
san=$(command -v compute-sanitizer || ls "$cuda_home"/compute-sanitizer/compute-sanitizer 2>/dev/null || true)
if [ $dry -eq 1 ] || [ -n "$san" ]; then
  run_step memcheck 150 "env $env_for_tests MMRT_TEST_QUICK=1 ${san:-compute-sanitizer} --tool memcheck --leak-check no --error-exitcode 9 '$build/bin/test_cuda_ops'"
  [ $dry -eq 0 ] && add memcheck "$(result $rc)" "$secs" "$(grep -m1 'ERROR SUMMARY' "$logdir/memcheck.log")"
  run_step racecheck 90 "env $env_for_tests MMRT_TEST_QUICK=1 MMRT_TEST_FILTER='test_attention*' ${san:-compute-sanitizer} --tool racecheck --error-exitcode 9 '$build/bin/test_cuda_ops'"
  [ $dry -eq 0 ] && add racecheck "$(result $rc)" "$secs" "$(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' "$logdir/racecheck.log")"
else
  add sanitizers "SKIP" 0 "no compute-sanitizer in PATH or $cuda_home"
fi

# ---- 10. mmrt-bench -----------------------------------------------------------------------
if [ $dry -eq 1 ] || [ -x "$build/bin/mmrt-bench" ]; then
  [ $dry -eq 0 ] && printf '[device.gpu0]\nplugin = cuda\n' > "$bench_conf"
  run_step bench 120 "env $env_for_tests '$build/bin/mmrt-bench' $bench_args"
  [ $dry -eq 0 ] && add bench "$(result $rc)" "$secs" "$(grep -v '^\s*$' "$logdir/bench.log" | tail -1 | cut -c1-90)"
  # 10a. drafts (docs/ENGINE.md "Drafts"): one sequence's decode with three drafted tokens
  # checked per step, against the step above; on the CPU a row more was free for F16.
  run_step bench_drafts 90 "env $env_for_tests '$build/bin/mmrt-bench' $bench_args --gen-tokens 64 --repeat 2 --draft-tokens 3"
  [ $dry -eq 0 ] && add bench_drafts "$(result $rc)" "$secs" "$(grep -m1 'decode per token' "$logdir/bench_drafts.log" | tr -s ' ' | cut -c1-50); $(grep -m1 -o 'drafts (draft_tokens 3): [^,]*, [0-9]* taken' "$logdir/bench_drafts.log")"
  # 10a'. a prediction (docs/ENGINE.md "Drafts"): each request carries its own answer as
  # prediction; on the CPU F16 decoded 3.1-3.8 x faster (docs/BENCHMARKS.md "Predicted outputs").
  run_step bench_prediction 90 "env $env_for_tests '$build/bin/mmrt-bench' $bench_args --gen-tokens 64 --repeat 2 --prediction"
  [ $dry -eq 0 ] && add bench_prediction "$(result $rc)" "$secs" "$(grep -m1 'decode per token' "$logdir/bench_prediction.log" | tr -s ' ' | cut -c1-50); $(grep -m1 -o '[0-9]* of its [0-9]* tokens taken' "$logdir/bench_prediction.log")"
  # 10b. vision batches (docs/ENGINE.md "The vision stage"): eight requests' images one tower
  # pass each against shared passes, on the checkpoint the bench step wrote (on the CPU plugin
  # shared passes of a 7B tower were 0-10 % slower, so the default stays 1 until a GPU
  # measures otherwise).
  ckpt="$HOME/.cache/mmrt-bench/llava-1.5-7b-L4-f16"
  run_step vision_batch 120 "env $env_for_tests '$build/bin/mmrt-vision-batch' --plugin cuda '$ckpt' 3 $(for i in 0 1 2 3 4 5 6 7; do printf "'%s/image-336-%d.png' " "$ckpt" "$i"; done)"
  [ $dry -eq 0 ] && add vision_batch "$(result $rc)" "$secs" "$(tail -2 "$logdir/vision_batch.log" | sed 's/ images in [0-9]* ms,//' | tr '\n' ';' | cut -c1-90)"
else
  add bench "SKIP" 0 "no mmrt-bench yet"
fi

# ---- 11. the kernels on the host emulator, then everything else, if time is left ---------
if [ $dry -eq 1 ] || [ -x "$build/bin/mmrt_cuda_emu_test" ]; then
  run_step emu 60 "'$build/bin/mmrt_cuda_emu_test' | tail -5"
  [ $dry -eq 0 ] && add emu "$(result $rc)" "$secs" "$(tail -1 "$logdir/emu.log")"
fi
if [ $dry -eq 1 ] || [ -f "$build/CTestTestfile.cmake" ]; then
  run_step ctest_rest 120 "cd '$build' && ctest -j$jobs -E 'cuda|llava' --output-on-failure"
  [ $dry -eq 0 ] && add ctest_rest "$(result $rc)" "$secs" "$(grep -m1 'tests passed' "$logdir/ctest_rest.log")"
fi

if [ $dry -eq 1 ]; then
  echo "logs would go to $logdir; budget ${budget}s; build dir $build; -j$jobs"
  exit 0
fi
rm -f "$aptconf"
{
  echo
  echo "gpu-check summary ($(date -u +%FT%TZ), $(( $(date +%s) - start ))s of ${budget}s budget, logs in $logdir)"
  printf '%-14s %-11s %6s  %s\n' step result time "key figure"
  for l in "${summary[@]}"; do echo "$l"; done
  if [ -s "$logdir/opstat.txt" ]; then
    echo
    echo "per-op worst error (relative to max |ref|) — op, cases, vs reference, vs CPU plugin, tolerance:"
    sed 's/^OPSTAT /  /' "$logdir/opstat.txt"
  fi
  if [ -s "$logdir/cuda_ops.failures.txt" ]; then
    echo
    echo "first failures of test_cuda_ops (full log: cuda_ops.log):"
    head -30 "$logdir/cuda_ops.failures.txt"
  fi
} | tee "$logdir/summary.txt"
