#!/usr/bin/env bash
# Install kiln with its test dependencies and run the tests (the README's test command).
set -euo pipefail
python3 -m pip install -q torch==2.13.0 triton==3.6.0
python3 -m pip install -q -e '.[test]'
python3 -m pytest tests -x -q -p no:cacheprovider "$@"
