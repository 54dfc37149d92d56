"""tracerl: TRACE (Tree Rollout Allocation for Contrastive Exploration) for agentic RL.

The core package. Pure layers (``tree``, ``algos``, ``engine``) never import ray, vllm or mlflow;
Ray and MLflow are wired in ``workflows`` only (docs/design.md, "Layers").
"""

__version__ = "0.1.0"
