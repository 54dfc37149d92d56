"""The environment registry, defined below the platform in ``tracerl.env_registry`` (the platform looks
environments up without importing this package) and re-exported here, so an environment imports::

    from tracerl.envs.base import ToolEnv, ToolResult
    from tracerl.envs.registry import ENVS
"""

from tracerl.env_registry import *  # noqa: F403 - the registry's public names, one list (its __all__)
from tracerl.env_registry import __all__ as __all__
