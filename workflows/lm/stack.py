"""Wiring of the language-model stack from config: policy, sampler, environment, template, engine, predictor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tracerl.algos.allocators import Allocator
from tracerl.algos.config import AllocatorConfig
from tracerl.config import EnvConfig, ModelConfig, PredictorConfig, SamplerConfig
from tracerl.engine.allocation import build_allocation
from tracerl.engine.react import make_template
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.registry import env_class
from tracerl.models.hf import SetupError, check_window, load_policy, load_tokenizer
from tracerl.predictors import build_predictor
from tracerl.predictors.base import FeaturizerFactory, Predictor
from tracerl.predictors.features import Featurizer
from tracerl.predictors.text import HashedNgramFeaturizer, PolicyHiddenFeaturizer
from tracerl.samplers import SAMPLERS, make_sampler
from tracerl.types import Prompt

__all__ = [
    "SetupError",
    "load_policy",
    "task_prompts",
    "make_env",
    "build_stack",
    "make_text_predictor",
    "stack_allocation",
    "text_features",
    "LMStack",
]


def task_prompts(cfg: EnvConfig, held_out: bool = False) -> list[Prompt]:
    """The chosen environment's training (or held-out evaluation) prompts."""
    return list(env_class(cfg.name).prompts(cfg, held_out))


def make_env(cfg: EnvConfig) -> Any:
    """One instance of the chosen environment."""
    return env_class(cfg.name).from_config(cfg)


@dataclass
class LMStack:
    tokenizer: Any
    model: Any
    env: Any
    engine: TreeRolloutEngine


def build_stack(model_cfg: ModelConfig, sampler_cfg: SamplerConfig, env_cfg: EnvConfig, seed: int) -> LMStack:
    """The engine over a sampler of ``sampler_cfg``'s backend. An engine that loads the weights itself (vLLM:
    ``loads_own_weights``) gets the tokenizer only: no HF copy of the policy in this process (``model`` None)."""
    check_window(model_cfg.path, sampler_cfg)
    if getattr(SAMPLERS.get(sampler_cfg.backend), "loads_own_weights", False):
        tok, model = load_tokenizer(model_cfg), None
    else:
        tok, model = load_policy(model_cfg)
    sampler = make_sampler(model_cfg, sampler_cfg, model, tok)
    env = make_env(env_cfg)
    template = make_template(model_cfg.template, tok, model_cfg.system_prompt)
    engine = TreeRolloutEngine(sampler, env, template, tok, sampler_cfg, seed=seed)
    return LMStack(tok, model, env, engine)


def stack_allocation(
    allocator_cfg: AllocatorConfig, predictor_cfg: PredictorConfig, stack: LMStack, seed: int
) -> tuple[Allocator, Predictor]:
    """``build_allocation`` on a built stack: text features over histories in the stack's template, Monte-Carlo
    scoring (trace_mc) on its engine."""
    template = stack.engine.template
    features = text_features(
        predictor_cfg, stack.model, stack.tokenizer, lambda q: template.prompt(q, stack.env.tools)
    )
    return build_allocation(allocator_cfg, predictor_cfg, seed, stack.engine, features)


def text_features(cfg: PredictorConfig, model: Any, tokenizer: Any, render: Any) -> FeaturizerFactory:
    """Builds the text featurizer ``predictor.features`` names (hashed n-grams, or ``model``'s hidden states over
    histories rendered by ``render(question)`` for features=policy), for predictors that read features."""

    def make() -> Featurizer:
        if cfg.features == "policy":
            if model is None:
                raise SetupError(
                    "predictor.features=policy reads the policy's hidden states, and this process holds no copy "
                    "of the policy (its sampler backend loads its own weights): use predictor.features=hashed"
                )
            return PolicyHiddenFeaturizer(model, tokenizer, render)
        if cfg.features == "hashed":
            return HashedNgramFeaturizer()
        raise SetupError(
            "predictor.features=numeric needs the simulator's numeric features; use hashed or policy here"
        )

    return make


def make_text_predictor(
    cfg: PredictorConfig,
    seed: int,
    model: Any,
    tokenizer: Any,
    render: Any,
    name: str | None = None,
    targets: Literal["recursive", "debiased"] | None = None,
) -> Predictor:
    """The configured predictor, built through the registry, with text features (``text_features``) for a
    predictor that reads them. ``targets`` overrides ``cfg.targets`` (an allocator's forced fit targets)."""
    features = text_features(cfg, model, tokenizer, render)
    return build_predictor(cfg, seed, name=name, targets=targets, features=features)
