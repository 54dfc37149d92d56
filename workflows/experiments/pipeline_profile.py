"""The inputs of the pipeline scale model (workflows/experiments/pipeline_sim.py): one profile per YAML file under
conf/bench/pipeline_profiles/, each fixed and cited before the model runs (docs/pipeline_model.md).

A profile says what one sampler is asked to do in a step (prompts, bare rollouts per prompt, continuations per bare
rollout, turns per episode, tokens per turn, tool latency), how fast it does it (seconds per decode iteration as a
function of the batch, prefill tokens per second, per-call and per-turn overheads) and what the step does around
the rollouts (allocation between the phases, driver work between steps, the policy update, the weight push).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from tracerl.config_yaml import syntax_message
from tracerl.shipped import CONF

PROFILE_DIR = CONF / "bench" / "pipeline_profiles"
BATCHING = ("rounds", "continuous")


@dataclass(frozen=True)
class Dist:
    """A distribution a profile draws from: exactly one of ``const``, ``values`` (an empirical sample, drawn
    uniformly), ``pmf`` (integer outcomes and their probabilities) or ``lognormal`` (median, sigma, clipped to
    [min, max])."""

    const: float | None = None
    values: tuple[float, ...] = ()
    pmf: tuple[tuple[int, float], ...] = ()
    lognormal: tuple[float, float, float, float] | None = None
    """(median, sigma, min, max)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.const is not None:
            return np.full(n, float(self.const))
        if self.values:
            return rng.choice(np.asarray(self.values, dtype=float), size=n)
        if self.pmf:
            ks, ps = zip(*self.pmf)
            return rng.choice(np.asarray(ks, dtype=float), size=n, p=np.asarray(ps) / sum(ps))
        assert self.lognormal is not None
        med, sigma, lo, hi = self.lognormal
        return np.clip(med * np.exp(sigma * rng.standard_normal(n)), lo, hi)

    @property
    def mean(self) -> float:
        if self.const is not None:
            return float(self.const)
        if self.values:
            return float(np.mean(self.values))
        if self.pmf:
            return sum(k * p for k, p in self.pmf) / sum(p for _, p in self.pmf)
        assert self.lognormal is not None
        med, sigma, lo, hi = self.lognormal
        draws = np.clip(med * np.exp(sigma * np.random.default_rng(0).standard_normal(20000)), lo, hi)
        return float(draws.mean())


def parse_dist(name: str, raw: Any) -> Dist:
    """A ``Dist`` from its YAML form ({const: x}, {values: [...]}, {pmf: {k: p}}, {lognormal: {median, sigma,
    min, max}}), or a plain number (a constant)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return Dist(const=float(raw))
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ValueError(f"{name}: give one of const, values, pmf, lognormal (got {raw!r})")
    (kind, val), *_ = raw.items()
    if kind == "const" and isinstance(val, (int, float)):
        return Dist(const=float(val))
    if kind == "values" and isinstance(val, list) and val and all(isinstance(v, (int, float)) for v in val):
        if min(val) < 0:
            raise ValueError(f"{name}: values must be >= 0")
        return Dist(values=tuple(float(v) for v in val))
    if kind == "pmf" and isinstance(val, dict) and val:
        pmf = tuple(sorted((int(k), float(p)) for k, p in val.items()))
        if any(p < 0 for _, p in pmf) or sum(p for _, p in pmf) <= 0:
            raise ValueError(f"{name}: pmf probabilities must be >= 0 with a positive sum")
        return Dist(pmf=pmf)
    if kind == "lognormal" and isinstance(val, dict) and {"median", "sigma"} <= set(val):
        ln = (
            float(val["median"]),
            float(val["sigma"]),
            float(val.get("min", 0.0)),
            float(val.get("max", math.inf)),
        )
        if ln[0] <= 0 or ln[1] < 0 or ln[2] > ln[3]:
            raise ValueError(f"{name}: lognormal needs median > 0, sigma >= 0, min <= max")
        return Dist(lognormal=ln)
    raise ValueError(
        f"{name}: cannot read {raw!r} (const: x | values: [...] | pmf: {{k: p}} | lognormal: ...)"
    )


@dataclass(frozen=True)
class Profile:
    """One sampler's step, its speeds and the step around it (units in the names)."""

    name: str
    """Shown in the JSON and tables; the Qwen3-8B profile's name contains 'qwen3-8b'."""
    batching: Literal["rounds", "continuous"]
    """rounds: the engine's turn rounds, each a batched generate that runs until its longest row stops (hf);
    continuous: per-token joins and leaves (vLLM's scheduler)."""
    prompts_per_sampler: int
    """Prompts one sampler rolls out in a step (weak scaling: the step grows with the samplers)."""
    bare_per_prompt: Dist
    """Bare rollouts m of a prompt."""
    continuations_per_bare: int
    """N: each prompt gets m N continuations from its bare rollouts' prefixes."""
    turns: Dist
    """Turns of an episode (model turns; all but the last end in a tool call)."""
    turn_tokens: Dist
    """Tokens the model generates in one turn (with ``final_turn_tokens``: in a turn that ends in a tool call)."""
    prompt_tokens: int
    """Tokens encoded before a bare rollout's first turn."""
    obs_tokens: int
    """Tokens encoded before every later turn (the tool's observation; earlier context is a cached prefix)."""
    tool_s: Dist
    """Seconds from a turn's end to its observation (tool call, grading)."""
    decode_step_s: tuple[tuple[int, float], ...]
    """(batch, seconds per decode iteration) points, interpolated linearly, extrapolated from the last two."""
    prefill_tokens_per_s: float
    """Prompt and observation tokens encoded per second."""
    max_batch: int
    """Rows in one forward: rounds split larger rounds into calls; continuous queues the rest."""
    tool_workers: int
    """Tool calls of a round running at once per sampler (rounds; 0: no limit). Continuous: all at once."""
    update_s: float
    """Fixed seconds of the policy update (learner), which overlap mode runs beside the next step's rollouts."""
    final_turn_tokens: Dist | None = None
    """Tokens of an episode's last turn (the answer), if they differ from a tool-calling turn's; None:
    ``turn_tokens``."""
    update_tokens_per_s: float = 0.0
    """Learner tokens per second per sampler's share of trainer GPUs; > 0 adds (tokens trained per sampler) /
    this to ``update_s`` (every path's whole sequence, a continuation's prefix included)."""
    kv_s_per_token: float = 0.0
    """Seconds a decode iteration spends per context token of its rows (reading their KV cache)."""
    phase_overhead_s: float = 0.0
    """Fixed cost of handing a sampler a batch of work and getting its trees back (a Ray call): barrier pays it
    for the bare rollouts and again for the continuations, streaming once."""
    call_overhead_s: float = 0.0
    """Fixed cost of one generate call (rounds)."""
    turn_overhead_s: float = 0.0
    """Engine work per path per turn outside the model (parsing, encoding, grading), on the sampler."""
    alloc_s: float = 0.0
    """Prefix scoring and allocation between a prompt's bare rollouts and its continuations."""
    between_steps_s: float = 0.0
    """Driver work every mode waits for between steps (select, fit the predictor, score and allocate roots)."""
    weight_sync_s: float = 0.0
    """Pushing the new weights to the samplers (they pause)."""
    recorded_steps: str | None = None
    """A JSON file of recorded steps (``python -m tracerl.workflows.experiments.pipeline_measure --record-steps``; relative paths are
    in conf/bench/pipeline_profiles/): each simulated sampler then does the work one sampler actor did in a
    recorded step (its episodes' turns and tokens), the samplers of one recorded step drawn together, instead of
    episodes drawn turn by turn from ``turns`` and ``turn_tokens``. Tool latencies are still drawn from
    ``tool_s``."""
    cpu_bench: bool = False
    """This profile describes what ``tracerl bench pipeline`` measures (the embedded default): ``--validate``
    compares its S = 2 prediction with that JSON."""
    replications: int = 3
    """Independent draws of the step averaged per point."""
    seed: int = 0
    sources: tuple[str, ...] = field(default_factory=tuple)
    """Where the numbers come from (URLs or the command that measured them)."""

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(
                f"profile {self.name}: batching must be one of {BATCHING}, got {self.batching!r}"
            )
        for f in ("prompts_per_sampler", "max_batch", "replications"):
            if getattr(self, f) < 1:
                raise ValueError(f"profile {self.name}: {f} must be >= 1")
        for f in ("continuations_per_bare", "prompt_tokens", "obs_tokens", "tool_workers"):
            if getattr(self, f) < 0:
                raise ValueError(f"profile {self.name}: {f} must be >= 0")
        for f in (
            "update_s",
            "update_tokens_per_s",
            "kv_s_per_token",
            "phase_overhead_s",
            "call_overhead_s",
            "turn_overhead_s",
            "alloc_s",
            "between_steps_s",
            "weight_sync_s",
        ):
            if not getattr(self, f) >= 0:
                raise ValueError(f"profile {self.name}: {f} must be >= 0 seconds")
        if not self.prefill_tokens_per_s > 0:
            raise ValueError(f"profile {self.name}: prefill_tokens_per_s must be > 0")
        pts = self.decode_step_s
        if not pts or any(b < 1 or s <= 0 for b, s in pts) or len({b for b, _ in pts}) != len(pts):
            raise ValueError(
                f"profile {self.name}: decode_step_s needs distinct batches >= 1 with seconds > 0"
            )
        _ = self.recorded  # a missing or malformed recorded_steps file is an error at load time

    @cached_property
    def recorded(self) -> dict[str, Any] | None:
        """The ``recorded_steps`` file: ``samplers`` (actors per recorded step) and ``steps``, each a list of
        per-sampler shares ``{"bare": [[prompt, context tokens, [tokens per turn]], ...], "cont": [...]}``."""
        if self.recorded_steps is None:
            return None
        path = Path(self.recorded_steps)
        path = path if path.is_absolute() else PROFILE_DIR / path
        try:
            data = json.loads(path.read_text())
            ok = int(data["samplers"]) >= 1 and len(data["steps"]) > 0
            ok = ok and all(len(step) == data["samplers"] for step in data["steps"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"profile {self.name}: recorded_steps {path}: {e}") from None
        if not ok:
            raise ValueError(
                f"profile {self.name}: recorded_steps {path} needs 'samplers' >= 1 and 'steps', each with one "
                "share per sampler (write it with python -m tracerl.workflows.experiments.pipeline_measure --record-steps DIR --out PATH)"
            )
        return dict(data)

    @cached_property
    def _steps(self) -> list[float]:
        """``_step_time`` at 0..max_batch rows (looked up once per simulated event)."""
        return [self._step_time(b) for b in range(self.max_batch + 1)]

    def step_time(self, batch: int) -> float:
        """Seconds of one decode iteration at ``batch`` rows."""
        return self._steps[batch] if batch <= self.max_batch else self._step_time(batch)

    def _step_time(self, batch: int) -> float:
        pts = sorted(self.decode_step_s)
        bs = [b for b, _ in pts]
        ss = [s for _, s in pts]
        if len(pts) == 1:
            return ss[0]
        if batch >= bs[-1]:
            slope = (ss[-1] - ss[-2]) / (bs[-1] - bs[-2])
            return ss[-1] + slope * (batch - bs[-1])
        return float(np.interp(batch, bs, ss))


def profile_from_dict(raw: dict[str, Any], origin: str = "profile") -> Profile:
    """A validated ``Profile`` from a YAML mapping; unknown or missing keys are errors naming the key."""
    known = {f.name for f in fields(Profile)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{origin}: unknown key(s) {unknown}; known: {sorted(known)}")
    d = dict(raw)
    for key in ("bare_per_prompt", "turns", "turn_tokens", "final_turn_tokens", "tool_s"):
        if key in d:
            d[key] = parse_dist(f"{origin}: {key}", d[key])
    if "decode_step_s" in d:
        table = d["decode_step_s"]
        if not isinstance(table, dict):
            raise ValueError(f"{origin}: decode_step_s must map batch size to seconds per iteration")
        d["decode_step_s"] = tuple(sorted((int(b), float(s)) for b, s in table.items()))
    d["sources"] = tuple(d.get("sources", ()))
    try:
        return Profile(**d)
    except TypeError as e:
        raise ValueError(f"{origin}: {e}") from None


def load_profile(path: Path) -> Profile:
    """Read a pipeline profile.

    Raises:
        OSError: the file cannot be read.
        ValueError: not UTF-8, not YAML, or not a profile; the message names the file.
    """
    try:
        text = Path(path).read_text()
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        raise ValueError(syntax_message(path, text, exc)) from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a pipeline profile is a YAML mapping")
    return profile_from_dict(raw, str(path))


def shipped_profiles() -> list[Path]:
    """The profiles under conf/bench/pipeline_profiles/, by file name."""
    return sorted(PROFILE_DIR.glob("*.yaml"))
