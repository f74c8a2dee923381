#!/usr/bin/env bash
# Install kiln with its test dependencies (CPU torch pinned) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'
python3 -m pytest tests -q -p no:cacheprovider "$@"
