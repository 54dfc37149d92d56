"""Pure algorithms: root and prefix solvers, allocators, advantage estimators (no ray / vllm / mlflow)."""

# trace_plus subclasses TraceAllocator, so it registers itself after allocators.py has loaded.
from tracerl.algos import allocators, trace_plus  # noqa: E402,F401
