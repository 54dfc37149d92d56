"""Pure algorithms: root and prefix solvers, allocators, advantage estimators (no ray / vllm / mlflow)."""

# trace_plus and knapsack subclass allocators.py's classes, so they register themselves after it has loaded.
from tracerl.algos import allocators, knapsack, trace_plus  # noqa: E402,F401
