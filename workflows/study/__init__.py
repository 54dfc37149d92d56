"""Many runs: ``tracerl sweep`` (sweep: Ray Tune + Optuna), ``tracerl study`` (grid, with its baselines and
report), and the statistics of compute-matched learning curves (curves). The reports (report: the study;
curves_report, curve_results, curves_doc: the learning curves) read typed results off one run frame
(tracking.frame), one hierarchical bootstrap (bootstrap) and one table writer (tracking.tables). Imports ops, lm,
tracking, train.

Public face: ``sweep.run_sweep``, ``grid.run_study``, ``report.write_report``, ``curves``.
"""
