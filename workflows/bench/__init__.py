"""The benchmarks of ``tracerl bench``: allocation, env, rollout, targets, baseline, train, testbeds (with probes and
simulated runs), update, sync (``bench peer`` and ``bench limit`` are in workflows/experiments/). Imports every room
below it except pipeline and cli.

Public face: each module's ``run_<name>_bench`` (targets: ``run_targets``) and ``format_table``.
"""
