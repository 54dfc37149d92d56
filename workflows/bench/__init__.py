"""The benchmarks of ``tracerl bench``: allocation, env, rollout, targets, train, testbeds (with probes and
simulated runs). Imports every room below it except pipeline and cli.

Public face: each module's ``run_<name>_bench`` (targets: ``run_targets``) and ``format_table``.
"""
