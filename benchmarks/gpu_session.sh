#!/usr/bin/env bash
# Everything a GPU machine is needed for, in one command run from the repository's root on it:
#
#   bash benchmarks/gpu_session.sh                                    # CUDA tests, then gpt2 and llama3.2-1b
#   STAGES=bench SHAPES=llama3-8b bash benchmarks/gpu_session.sh      # the 8B shape alone
#
# 1. installs the wheels in .whl/ (packages the machine lacks), offline, if there are any
# 2. writes the versions of what runs (Python, torch, CUDA, triton, transformers, the GPU) to $OUT/versions.txt
# 3. the CUDA tests (QUILL_TEST_DEVICE=cuda pytest, tests/conftest.py) in three stages, most telling first, each
#    writing its log and JUnit XML under $OUT as it ends: kernels (the Triton kernels and CUDA graph replay
#    against eager, bf16 included), engine (models, engine, sampling, beams, structured output), api (the routes,
#    live servers, engine processes: the slowest)
# 4. seq2seq (only when named in STAGES): `python -m benchmarks.seq2seq_bench --device $DEVICE --dtype $DTYPE`, the
#    Marian shape against transformers and CTranslate2 on the GPU; its table in $OUT/seq2seq.txt, JSON beside it
# 5. bench: `python -m benchmarks.gpu_bench` once per shape; its JSON (rewritten after every figure), log and
#    decode-step traces under $OUT; then $OUT/gpu_table.md from every JSON there
#
# Every stage has a time limit, and all of them together $BUDGET seconds, so a stage that hangs leaves the
# others' files. At its limit a stage gets SIGTERM, which its Python turns into KeyboardInterrupt
# (benchmarks/interruptible.py): pytest still writes its report, and the benchmark stops its server and
# deletes its checkpoint (SIGKILL 30 s later).
#
# PACK=1 (for the device tool, which brings back at most 8 files from $OUT): at the end every file under $OUT goes
# into $OUT/session.tar.gz, and only it, tests-summary.txt, gpu_table.md and versions.txt stay beside it.
#
# Environment, with defaults: OUT=runs/gpu  STAGES="kernels engine api bench" ("tests": the three test stages;
# "custom": pytest over $TESTS)  SHAPES="gpt2 llama3.2-1b"  PARTS=(all)  DEVICE=cuda  DTYPE=bfloat16
# TEST_WORKERS=0 (pytest-xdist processes, if its wheel is in .whl/)  BUDGET=570  KERNELS_TIMEOUT=90
# ENGINE_TIMEOUT=150  API_TIMEOUT=300  KERNEL_TESTS ENGINE_TESTS API_TESTS (each stage's pytest arguments, below)
# TESTS= TESTS_TIMEOUT=240 (the custom stage)  SEQ2SEQ_ARGS="--sources 1024 --batch-size 64 --concurrency 256"
# SEQ2SEQ_TIMEOUT=240  SHAPE_TIMEOUT=420
# BENCH_ARGS=(more gpu_bench flags, e.g. "--server-arg=--attention-backend=sdpa")  PYTHON=python3  WHEELS=.whl
# (DEVICE=cpu DTYPE=float32 BENCH_ARGS=--smoke STAGES=bench runs the benchmark on a machine without a GPU, in a
# minute; tests/benchmarks/test_gpu_session.py runs the whole script so.)
set -uo pipefail

OUT=${OUT:-runs/gpu}
STAGES=${STAGES:-kernels engine api bench}
STAGES=${STAGES/tests/kernels engine api}
SHAPES=${SHAPES:-gpt2 llama3.2-1b}
PARTS=${PARTS:-}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
TESTS=${TESTS:-}
BUDGET=${BUDGET:-570}
TEST_WORKERS=${TEST_WORKERS:-0}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-240}
KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-90}
ENGINE_TIMEOUT=${ENGINE_TIMEOUT:-150}
API_TIMEOUT=${API_TIMEOUT:-300}
SHAPE_TIMEOUT=${SHAPE_TIMEOUT:-420}
SEQ2SEQ_ARGS=${SEQ2SEQ_ARGS:---sources 1024 --batch-size 64 --concurrency 256}
SEQ2SEQ_TIMEOUT=${SEQ2SEQ_TIMEOUT:-240}
BENCH_ARGS=${BENCH_ARGS:-}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}

start=$SECONDS
mkdir -p "$OUT"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# The benchmark is offline; the tests are not told so: huggingface_hub refuses even a loopback server when offline.

# bounded LIMIT LOG NAME COMMAND...: COMMAND with at most LIMIT seconds (less if the budget has less left),
# its output into LOG; then its exit status and the last lines of LOG.
bounded() {
  local limit=$1 log=$2 name=$3
  shift 3
  local left=$(( BUDGET - (SECONDS - start) - 5 ))
  (( limit > left )) && limit=$left
  if (( limit < 20 )); then
    echo "== $name: skipped, ${left}s of the budget left" | tee "$log"
    return 124
  fi
  echo "== $name (at most ${limit}s): ${*:2}"
  local began=$SECONDS
  timeout --signal=TERM --kill-after=30 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $(( SECONDS - began ))s; the end of $log:"
  tail -n 30 "$log"
  return $rc
}

status=()

if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

{
  "$PYTHON" - <<'PY'
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU:", p.name, f"{p.total_memory / 2**30:.0f} GiB", f"capability {p.major}.{p.minor}")
for name in ("triton", "transformers", "tokenizers", "fastapi", "uvicorn", "pydantic", "httpx", "openai"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError:
        print(name, "MISSING")
PY
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
} | tee "$OUT/versions.txt"

# The test stages' paths: what a GPU changes most comes first, the slow live-server tests last.
KERNEL_TESTS=${KERNEL_TESTS:-tests/models/kernels tests/models/attention tests/server/engine/test_graphs.py \
tests/server/engine/test_graph_buckets.py}
ENGINE_TESTS=${ENGINE_TESTS:-tests/models --ignore=tests/models/kernels --ignore=tests/models/attention \
tests/server/engine --ignore=tests/server/engine/test_graphs.py --ignore=tests/server/engine/test_graph_buckets.py \
tests/server/sampling tests/server/structured}
API_TESTS=${API_TESTS:-tests/server/api tests/server/test_config.py tests/server/test_hosting.py}

# test_stage NAME LIMIT PATHS...: QUILL_TEST_DEVICE=$DEVICE pytest over PATHS, into $OUT/tests-NAME.{log,xml};
# its summary line and failures are added to $OUT/tests-summary.txt
test_stage() {
  local name=$1 limit=$2
  shift 2
  local workers=()
  (( TEST_WORKERS > 0 )) && workers=(-n "$TEST_WORKERS")
  bounded "$limit" "$OUT/tests-$name.log" "tests-$name" env QUILL_TEST_DEVICE="$DEVICE" \
    "$PYTHON" -m benchmarks.interruptible pytest -q -p no:cacheprovider --continue-on-collection-errors -rfE \
    --durations=10 --junitxml="$OUT/tests-$name.xml" ${workers[@]+"${workers[@]}"} "$@"
  status+=("tests-$name: exit $?")
  { echo "tests-$name:"; grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|error)" "$OUT/tests-$name.log"; } \
    >> "$OUT/tests-summary.txt"
}

# shellcheck disable=SC2086  # the paths are lists of words
if [[ " $STAGES " == *" kernels "* ]]; then test_stage kernels "$KERNELS_TIMEOUT" $KERNEL_TESTS; fi
# shellcheck disable=SC2086
if [[ " $STAGES " == *" engine "* ]]; then test_stage engine "$ENGINE_TIMEOUT" $ENGINE_TESTS; fi
# shellcheck disable=SC2086
if [[ " $STAGES " == *" api "* ]]; then test_stage api "$API_TIMEOUT" $API_TESTS; fi
# shellcheck disable=SC2086
if [[ " $STAGES " == *" custom "* ]]; then test_stage custom "$TESTS_TIMEOUT" $TESTS; fi

if [[ " $STAGES " == *" seq2seq "* ]]; then
  # shellcheck disable=SC2086  # SEQ2SEQ_ARGS is a list of words
  bounded "$SEQ2SEQ_TIMEOUT" "$OUT/seq2seq.log" seq2seq env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$PYTHON" -m benchmarks.interruptible benchmarks.seq2seq_bench --device "$DEVICE" --dtype "$DTYPE" \
    --cache-dir "$OUT/seq2seq-models" --out "$OUT/seq2seq.json" $SEQ2SEQ_ARGS
  status+=("seq2seq: exit $?")
  rm -rf "$OUT/seq2seq-models"  # a 300 MB checkpoint and its conversion: not results
  sed -n '/^Seq2seq benchmark/,$p' "$OUT/seq2seq.log" > "$OUT/seq2seq.txt"
fi

if [[ " $STAGES " == *" bench "* ]]; then
  for shape in $SHAPES; do
    # shellcheck disable=SC2086  # PARTS and BENCH_ARGS are lists of words
    bounded "$SHAPE_TIMEOUT" "$OUT/gpu_bench-$shape.log" "$shape" \
      env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PYTHON" -m benchmarks.interruptible benchmarks.gpu_bench \
      --device "$DEVICE" --dtype "$DTYPE" --shapes "$shape" ${PARTS:+--parts $PARTS} --no-progress \
      --out "$OUT/gpu_bench-$shape.json" \
      --trace-dir "$OUT/traces" $BENCH_ARGS
    status+=("$shape: exit $?")
  done
  if compgen -G "$OUT/gpu_bench-*.json" > /dev/null; then
    "$PYTHON" -m benchmarks.gpu_report "$OUT"/gpu_bench-*.json > "$OUT/gpu_table.md" 2>&1
    cat "$OUT/gpu_table.md"
  fi
fi

if [[ ${PACK:-0} == 1 ]]; then
  tar -czf "$OUT.tar.gz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$OUT.tar.gz" "$OUT/session.tar.gz"
  tar -xzf "$OUT/session.tar.gz" -C "$OUT" ./tests-summary.txt ./gpu_table.md ./versions.txt \
    ./seq2seq.txt 2>/dev/null
  echo "== packed: $(ls "$OUT")"
fi

echo "== after $(( SECONDS - start ))s:"
failed=0
for line in "${status[@]}"; do
  echo "   $line"
  [[ $line == *"exit 0" ]] || failed=1
done
exit $failed
