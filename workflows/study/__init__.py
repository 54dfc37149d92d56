"""Many runs: ``tracerl sweep`` (sweep: Ray Tune + Optuna) and ``tracerl study`` (grid, with its baselines and
report). The report reads typed results off one run frame (tracking.frame), one hierarchical bootstrap (bootstrap)
and one table writer (tracking.tables). Another kind of study runs the same grid as a ``grid.StudyKind`` (the
learning-curve study, one of the experiments). Imports ops, lm, tracking, train.

Public face: ``sweep.run_sweep``, ``grid.run_study``, ``grid.StudyKind``, ``report.write_report``.
"""
