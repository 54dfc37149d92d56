"""``tracerl bench pipeline``: barrier vs streaming steps with the policy frozen (bench) and barrier vs overlap in
train runs (bench_train). The scale model behind ``bench pipeline --sim`` is in workflows/experiments/. Imports ops,
lm, tracking, train.

Public face: ``bench.run_pipeline_bench``, ``bench.format_table``.
"""
