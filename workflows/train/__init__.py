"""A training run: ``tracerl train`` (run: ``launch``, then ``close``), how its loop runs, on Ray Train or in process
(fit), the rank-0 driver of each step (driver), each rank's policy and learner (setup), held-out evaluation and
``tracerl eval`` (evaluate), the run's compute stop and learning curve (budget). Imports ops, lm, tracking.

Public face: ``run.train``, ``evaluate.run_eval``.
"""
