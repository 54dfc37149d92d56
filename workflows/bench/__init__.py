"""The daily benchmarks of ``tracerl bench``: allocation (with its simulated runs, sim_runs), env, rollout, train
(``bench pipeline`` has its own room; the one-study benches are experiments). Imports every room below it except
pipeline and cli.

Public face: each module's ``run_<name>_bench`` and ``format_table``; ``sim_runs.run_allocator``.
"""
