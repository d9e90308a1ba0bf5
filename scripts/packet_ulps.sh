#!/bin/bash
# Exhaustive fp32 accuracy of one of the kernel's own packet functions against Eigen's, over every
# float32, then both's ns an element (scripts/packet_timing.h): ErfcPacket or ExpPacket, pasted
# from tf_autofuse/cc/cpu/packet_math.h into scripts/<name>_ulps.cc. About 100 s (erfc) or 150 s
# (exp) a run on one core.
# Usage: scripts/packet_ulps.sh erfc|exp [ftz]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: scripts/packet_ulps.sh erfc|exp [ftz]}
shift
case $name in erfc) fn=ErfcPacket ;; exp) fn=ExpPacket ;;
  *) echo "scripts/packet_ulps.sh: unknown function '$name' (erfc or exp)" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the function and the packet helpers it calls (ExpReducedMinus1, TimesPowerOfTwo), in the
# file's order
awk -v fn="$fn" '/^template <.*typename Packet>$/ {held = $0; next}
     held != "" && (index($0, " " fn "(const Packet& x)") ||
                    index($0, " ExpReducedMinus1(const Packet& r)") ||
                    index($0, " TimesPowerOfTwo(const Packet& x, const Packet& k)")) {
       on = 1; print held
     }
     {held = ""} on {print} on && /^}$/ {on = 0}' \
  "$here/../tf_autofuse/cc/cpu/packet_math.h" > "$work/${name}_packet.inc"
include=$(python -c "import tensorflow as tf; print(tf.sysconfig.get_include())" 2>/dev/null)
extra=""  # as tf_autofuse/_build.py: TF 2.21's Eigen does not build with AVX512-FP16
case $(g++ -march=native -dM -E -x c++ /dev/null) in *__AVX512FP16__*) extra=-mno-avx512fp16 ;; esac
g++ -O3 -march=native $extra --std=c++17 -DEIGEN_MAX_ALIGN_BYTES=64 -Wno-ignored-attributes \
    -Wno-deprecated-declarations -I"$include" -I"$work" "$here/${name}_ulps.cc" -o "$work/ulps"
"$work/ulps" "$@"
