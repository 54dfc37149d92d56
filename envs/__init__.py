"""ReAct tool environments and the calibrated simulator; chosen by name from ``ENVS``."""

from tracerl.envs.registry import ENVS

__all__ = ["ENVS"]
