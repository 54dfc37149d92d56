"""Config checks that need the registered components: the ``env`` schema of the chosen environment, and whether
the chosen components can run together. The config loader calls them; they read properties the components
declare (``Env.config``, ``Env.tool_env``, ``Env.true_values``, ``Allocator.predictor``,
``Predictor.needs_true_values``, a command config's ``tool_env_only``) instead of naming components. A command
config that holds another in a flattened field (a sweep's ``train``) is checked as the one flat config users write:
the declarations of every part count, and the command's ``allocators`` meet the train config's ``env``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tracerl.config import PipelineConfig
from tracerl.env_config import EnvConfig, env_config_class, section_key
from tracerl.env_registry import TOOL_ENVS, env_class, known_envs, section_schema
from tracerl.registry import RegistryError
from tracerl.schema import flat_parts, flat_values


def env_schema_for(name: str, keys: Iterable[str]) -> type[EnvConfig]:
    """The ``EnvConfig`` subclass for ``env.name=name`` holding the sections ``keys`` (and the chosen one's).

    Raises:
        ValueError: an unknown environment, or a key under ``env`` that names no environment section.
    """
    try:
        cls = env_class(name)
    except (RegistryError, TypeError) as exc:
        raise ValueError(f"env.name={name!r}: {exc}") from None
    chosen = section_key(name)
    sections: dict[str, type] = {chosen: cls.config} if cls.config is not None else {}
    for key in sorted(set(keys) - {chosen}):
        try:
            schema = section_schema(key, name)
        except KeyError:
            shared = ["name", "reward_timeout_s", *sections]
            raise ValueError(
                f"unknown config key 'env.{key}'; allowed under 'env': {', '.join(shared)} "
                f"(env.{chosen} holds the settings of env.name={name!r}; a section of another environment "
                f"must name one of {', '.join(known_envs())})"
            ) from None
        if schema is not None:
            sections[key] = schema
    return env_config_class(tuple(sorted(sections.items())))


def check_components(cfg: Any) -> None:
    """What a command cannot run with: a language-model command on an environment without tools, a predictor
    that needs true success probabilities on an environment without them, or a Monte-Carlo allocator (trace_mc)
    with ``pipeline.mode=streaming``.

    Raises:
        ValueError: naming the keys to change.
    """
    values = flat_values(cfg)
    check_push_transport(values.get("trainer"), values.get("sampler"), values.get("pools"))
    env = values.get("env")
    if not isinstance(env, EnvConfig):
        return
    cls = env_class(env.name)
    if any(getattr(type(part), "tool_env_only", False) for part in flat_parts(cfg)) and not cls.tool_env:
        raise ValueError(
            f"this command runs a language model and needs a ReAct tool environment; env.name={env.name!r} "
            f"({cls.__name__}) is not one (Env.tool_env is False): set env.name to {', '.join(TOOL_ENVS)} or a "
            "ToolEnv plug-in (the simulator serves bench allocation)"
        )
    allocator, predictor = values.get("allocator"), values.get("predictor")
    if allocator is None or predictor is None:
        return
    from tracerl.algos.allocators import ALLOCATORS
    from tracerl.predictor import PREDICTORS

    wanted = {predictor.name: f"predictor={predictor.name}"}
    named = [("allocator.name", allocator.name)] + [("allocators", n) for n in values.get("allocators", [])]
    for key, name in named:
        try:
            forced = ALLOCATORS.get(name).predictor
        except RegistryError as exc:
            raise ValueError(f"{key}={name!r}: {exc}") from None
        if forced is not None:
            wanted.setdefault(forced, f"allocator={name}")
        pipeline = values.get("pipeline")
        if (
            ALLOCATORS.get(name).monte_carlo
            and isinstance(pipeline, PipelineConfig)
            and pipeline.mode == "streaming"
        ):
            raise ValueError(
                f"{key}={name} scores by Monte-Carlo rollouts between the step's phases, which "
                "pipeline.mode=streaming runs at once: set pipeline.mode=barrier"
            )
    for name, why in wanted.items():
        try:
            needs_true_values = PREDICTORS.get(name).needs_true_values
        except RegistryError as exc:
            where = (
                f"predictor.name={name!r}"
                if why.startswith("predictor=")
                else f"{why} forces predictor {name!r}"
            )
            raise ValueError(f"{where}: {exc}") from None
        if needs_true_values and not cls.true_values:
            raise ValueError(
                f"the {name} predictor ({why}) needs the true success probabilities, which env.name="
                f"{env.name!r} does not have (Env.true_values; only the simulator has them): with a language "
                "model use allocator=trace and predictor=learned_text"
            )


def check_push_transport(trainer: Any, sampler: Any, pools: Any) -> None:
    """``trainer.push_transport=nccl`` needs a sampler backend whose engine takes a collective push
    (``collective_push``: vLLM) and CUDA on both sides (``trainer.use_gpu``, ``pools.rollout_gpus > 0``).

    Raises:
        ValueError: one line naming the keys to change."""
    if sampler is None or getattr(trainer, "push_transport", "ray") != "nccl":
        return
    from tracerl.samplers import SAMPLERS

    try:
        collective = bool(getattr(SAMPLERS.get(sampler.backend), "collective_push", False))
    except RegistryError as exc:
        raise ValueError(f"sampler.backend={sampler.backend!r}: {exc}") from None
    if not collective:
        raise ValueError(
            f"trainer.push_transport=nccl broadcasts the weights into a sampler engine's GPUs (vLLM's weight "
            f"transfer), which sampler.backend={sampler.backend} does not take: set sampler=vllm, or "
            "trainer.push_transport=ray"
        )
    if not trainer.use_gpu or pools is None or pools.rollout_gpus <= 0:
        raise ValueError(
            "trainer.push_transport=nccl needs CUDA on the trainer and on the samplers: set trainer.use_gpu=true "
            "and pools.rollout_gpus > 0 (GPU machines), or trainer.push_transport=ray"
        )
