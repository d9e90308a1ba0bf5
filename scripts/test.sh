#!/usr/bin/env bash
# The test command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
exec "${PYTHON:-python3}" -m pytest tests -q "$@"
