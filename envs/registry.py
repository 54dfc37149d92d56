"""The environment registry, defined below the platform in ``tracerl.env_registry`` (the platform looks
environments up without importing this package) and re-exported here, so an environment imports::

    from envs.base import ToolEnv, ToolResult
    from envs.registry import ENVS
"""

from tracerl.env_registry import (
    ENTRY_POINT_GROUP,
    ENVS,
    TOOL_ENVS,
    RegistryError,
    check_data,
    env_class,
    env_section,
    known_envs,
    resolve_env_paths,
    section_schema,
    tool_env_class,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVS",
    "TOOL_ENVS",
    "RegistryError",
    "check_data",
    "env_class",
    "env_section",
    "known_envs",
    "resolve_env_paths",
    "section_schema",
    "tool_env_class",
]
