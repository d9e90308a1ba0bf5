#!/usr/bin/env bash
# The main job: set up, then run the abs/relu/exp example with fusion on in both modes.
# Each run prints the kernels it ran and the path of its op summary CSV.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
export AUTOFUSE_FLAGS=${AUTOFUSE_FLAGS:---enable_autofuse=true}
for mode in tf1 tf2-compat; do
  "${PYTHON:-python3}" examples/tensorflow/af_tf_eleandele/test_abs_relu_exp.py --mode "$mode"
done
