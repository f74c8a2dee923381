#!/usr/bin/env bash
# Install kiln with its test dependencies (CPU torch pinned), lint, and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'
# Lint first: a lint error fails CI before the suite runs (rules in pyproject.toml's [tool.ruff]).
python3 -m ruff check kiln tests benchmarks scripts
# Tools the debug tests use when present: Graphviz's dot (diagrams), and with KILN_FULL_TESTS=1 Chromium (the
# HTML report's screenshot test: most of the two minutes apt takes). Without them those tests use the built-in
# layout or skip.
tools="graphviz"
[ "${KILN_FULL_TESTS:-}" = 1 ] && tools="graphviz chromium"
missing=""
for tool in $tools; do
  command -v "$([ "$tool" = graphviz ] && echo dot || echo "$tool")" >/dev/null || missing="$missing $tool"
done
if [ -n "$missing" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; } \
    || echo "scripts/test.sh: could not install$missing; the tests that need them skip"
fi
# Two workers: CI has two cores, and the suite is mostly single-threaded compiles. Each worker runs torch and
# kiln's OpenMP kernels on one thread: with two workers on two cores a second thread only contends (a parallel
# region waits for the thread the other worker holds). Tests of parallel paths ask for two threads themselves
# (tests/support/threads.py). KILN_FULL_TESTS=1 runs every sweep whole (README's testing section).
# --dist loadgroup: tests sharing a module fixture run on one worker (tests/conftest.py), which sets it up once.
export OMP_NUM_THREADS=1
python3 -m pytest tests -p no:cacheprovider -n 2 --dist loadgroup "$@"
