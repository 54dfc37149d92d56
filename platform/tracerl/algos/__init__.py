"""Pure algorithms: root and prefix solvers, allocators, advantage estimators (no ray / vllm / mlflow)."""
