#!/bin/bash
# Exhaustive fp32 erfc accuracy, ours (ErfcPacket, pasted from interpreter.cc) vs Eigen's; about
# 100 s a run on one core. Usage: scripts/erfc_ulps.sh [ftz]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^template <typename Packet>$/ {held = $0; next}
     held != "" && /ErfcPacket\(const Packet& x\)/ {on = 1; print held}
     {held = ""} on {print} on && /^}$/ {exit}' "$here/../tf_autofuse/cc/interpreter.cc" > "$work/erfc_packet.inc"
include=$(python -c "import tensorflow as tf; print(tf.sysconfig.get_include())" 2>/dev/null)
extra=""  # as tf_autofuse/_build.py: TF 2.21's Eigen does not build with AVX512-FP16
case $(g++ -march=native -dM -E -x c++ /dev/null) in *__AVX512FP16__*) extra=-mno-avx512fp16 ;; esac
g++ -O3 -march=native $extra --std=c++17 -DEIGEN_MAX_ALIGN_BYTES=64 -Wno-ignored-attributes \
    -Wno-deprecated-declarations -I"$include" -I"$work" "$here/erfc_ulps.cc" -o "$work/erfc_ulps"
"$work/erfc_ulps" "$@"
