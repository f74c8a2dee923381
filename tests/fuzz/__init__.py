"""kiln's differential fuzzer: random valid programs, run eagerly and compiled, compared (issue 21).

programs.py writes the programs (from the templates in ops.py), compare.py runs and compares them,
minimize.py shrinks a failure, pool.py and __main__.py run thousands in worker subprocesses.
test_fuzz.py runs fixed seeds in CI; test_regressions.py holds minimized failures as named tests.
"""
