#!/usr/bin/env bash
# Build the kernel library with AddressSanitizer + UndefinedBehaviorSanitizer and run the kernel
# tests and an odd-shape fuzz against it. Fails on any sanitizer report.
#
#   bash scripts/sanitize.sh            # kernel tests + odd-shape fuzz + 60 + 60 random graphs
#   FUZZ_GRAPHS=300 bash scripts/sanitize.sh
#
# The instrumented library is cached apart from the normal one (TF_AUTOFUSE_SANITIZE=1 changes
# the cache key and the file name). TensorFlow itself is not instrumented and leaks at exit, so
# leak detection is off; every other ASan/UBSan finding aborts the run and is logged under
# $LOG_DIR (default ./.cache/sanitize_logs, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2
export TF_AUTOFUSE_SANITIZE=1
unset AUTOFUSE_FLAGS AUTOFUSE_DFX_FLAGS
CXX_BIN=${CXX:-g++}
LOG_DIR=${LOG_DIR:-$ROOT/.cache/sanitize_logs}
FUZZ_GRAPHS=${FUZZ_GRAPHS:-60}
rm -rf "$LOG_DIR"; mkdir -p "$LOG_DIR"

ASAN_RT=$("$CXX_BIN" -print-file-name=libasan.so)
UBSAN_RT=$("$CXX_BIN" -print-file-name=libubsan.so)
for rt in "$ASAN_RT" "$UBSAN_RT"; do
  [[ -f $rt ]] || { echo "sanitize.sh: $rt not found (install the compiler's sanitizer runtimes)"; exit 2; }
done

export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:alloc_dealloc_mismatch=0:log_path=$LOG_DIR/asan"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$LOG_DIR/ubsan"
run() {
  echo "== $*"
  LD_PRELOAD="$ASAN_RT $UBSAN_RT" "$@"
}

echo "== building (or finding) the instrumented library"
run python -c "from tf_autofuse import _build; print(_build.library_path())"

status=0
run python -m pytest -q -p no:cacheprovider tests/test_kernel.py || status=$?
run python -m pytest -q -p no:cacheprovider tests/test_robustness.py -k odd_shape || status=$?
TF_AUTOFUSE_FUZZ_EXAMPLES=$FUZZ_GRAPHS TF_AUTOFUSE_FUZZ_REDUCE_EXAMPLES=$FUZZ_GRAPHS \
  run python -m pytest -q -p no:cacheprovider tests/test_random_graphs.py \
  -k "match_unfused or reductions or broadcast" || status=$?

reports=$(ls "$LOG_DIR" 2>/dev/null | wc -l)
if (( reports > 0 )); then
  echo "sanitize.sh: FAILED, $reports sanitizer report(s):"
  for f in "$LOG_DIR"/*; do echo "--- $f"; head -60 "$f"; done
  exit 1
fi
if (( status != 0 )); then
  echo "sanitize.sh: FAILED (tests failed, no sanitizer report)"
  exit "$status"
fi
echo "sanitize.sh: OK, no ASan/UBSan report"
