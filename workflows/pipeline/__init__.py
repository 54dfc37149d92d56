"""The pipelined-rollout model: profiles, the simulator and its report, pool measurements and
``tracerl bench pipeline``. Imports ops, lm, tracking, train.

Public face: ``bench.run_pipeline_bench``, ``sim.run_rounds``, ``report.format_table``.
"""
