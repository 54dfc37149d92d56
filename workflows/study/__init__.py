"""Many runs: ``tracerl sweep`` (sweep: Ray Tune + Optuna), ``tracerl study`` (grid, with its baselines and
report), and the statistics of compute-matched learning curves (curves). Imports ops, lm, tracking, train.

Public face: ``sweep.run_sweep``, ``grid.run_study``, ``report.write_report``, ``curves``.
"""
