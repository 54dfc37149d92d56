"""The environment registry (name -> constructor)."""

from tracerl.registry import Registry

ENVS: Registry = Registry("environment")
