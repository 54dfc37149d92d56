"""A seeded multi-turn task family without a language model, for measuring allocation.

Model (all randomness from seeded streams; same seed, same pools, drift and trees):

* A finite set of ``num_prompts`` prompts, revisited across steps. Prompt i has a latent difficulty
  logit z_i drawn from a Gaussian mixture (``mix_weights / mix_means / mix_stds``: hard, medium,
  easy) and a policy drift w_i(s), a stationary AR(1) process in logit space with per-step change
  std ``drift_std`` (rho = 0.98, stationary std drift_std / sqrt(2 (1 - rho))): the policy changes
  slowly, so a predictor has to keep learning. The success probability at step s is
  V_0 = sigmoid(z_i + w_i(s)).
* An episode has T ~ U{min_turns..max_turns} turns. The conditional success probability after each
  turn is a bounded martingale, V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t)) (mean V_t, so
  E[V_{t+1} | V_t] = V_t, and Var = V_t (1 - V_t) / (kappa + 1)); the terminal reward is
  Bernoulli(V_T). A continuation from the prefix at depth t restarts from its stored V_t, with
  T' ~ U{max(t + 1, min_turns)..max_turns}; the observation already in the prefix is re-used.
* Prompt features (dim ``prompt_feature_dim``): a fixed random rotation of
  [zs_i + prompt_feature_noise * eps, nuisance N(0, 1) ...], zs_i the standardised difficulty. They
  say nothing about the drift.
* Prefix features: [V_t + prefix_feature_noise * eps, t / max_turns] (probability scale).
* Each episode's draws (its length, every V_t, its reward and feature noise) come from its own seed,
  ``tracerl.engine.seeds.SeedKey`` of (seed, step, prompt, path, first turn), through a counter-based stream
  and inverse CDFs: an episode does not depend on which others are simulated with it, or in which order.

Calibration of the defaults (``calibrate()``; ``tracerl bench allocation`` prints it; tests pin it):
the Bayes-optimal regression of V_0 on a prompt's features explains at most half its variance, as
does the regression of V_t on a prefix's features (PCL reports its value model worth about three
rollouts; real value models are no better), and uniform GRPO with G = 8 has an expected effective
ratio of 20-35 % (the paper measured 26.8 %). A predictor beats the features only by learning from
revisits, as PCL and SPO do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import betaincinv, ndtri

from tracerl.algos.allocators import Expansion
from tracerl.engine.protocol import Env
from tracerl.engine.seeds import SeedKey, continuations_at, path_identity, uniforms
from tracerl.schema import check
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status


@dataclass(frozen=True)
class SimulatorConfig:
    """The calibrated multi-turn simulator (envs/simulator.py documents the model and its calibration)."""

    num_prompts: int = 2048
    """Size of the finite prompt set revisited across steps."""
    mix_weights: list[float] = field(default_factory=lambda: [0.45, 0.25, 0.30])
    """Difficulty mixture weights: hard, medium, easy."""
    mix_means: list[float] = field(default_factory=lambda: [-5.0, 0.0, 5.0])
    """Mean logit success probability of each mixture component."""
    mix_stds: list[float] = field(default_factory=lambda: [1.5, 1.5, 1.5])
    """Std of the logit within each component."""
    min_turns: int = 2
    """Fewest turns in an episode."""
    max_turns: int = 6
    """Most turns in an episode."""
    concentration: float = 4.0
    """kappa: V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t)); smaller moves V further per turn."""
    prompt_feature_dim: int = 8
    """Dimension of the prompt features."""
    prompt_feature_noise: float = 1.1
    """Noise (in units of the difficulty's std) on the prompt features' signal."""
    prefix_feature_noise: float = 0.55
    """Noise (probability units) on the prefix features' signal about V_t."""
    drift_std: float = 0.15
    """Std per step of each prompt's random-walk drift in logit (the policy changes)."""

    def __post_init__(self) -> None:
        k = len(self.mix_weights)
        check(
            k >= 1 and len(self.mix_means) == k and len(self.mix_stds) == k,
            "env.simulator.mix_weights, mix_means and mix_stds must have the same non-zero length",
        )
        check(
            all(w >= 0 for w in self.mix_weights) and sum(self.mix_weights) > 0,
            "env.simulator.mix_weights must be non-negative with a positive sum",
        )
        check(all(s >= 0 for s in self.mix_stds), "env.simulator.mix_stds must be >= 0")
        check(self.num_prompts >= 1, f"env.simulator.num_prompts must be >= 1 (got {self.num_prompts})")
        check(
            1 <= self.min_turns <= self.max_turns,
            f"env.simulator needs 1 <= min_turns <= max_turns (got {self.min_turns}, {self.max_turns})",
        )
        check(self.concentration > 0, f"env.simulator.concentration must be > 0 (got {self.concentration})")
        check(self.prompt_feature_dim >= 1, "env.simulator.prompt_feature_dim must be >= 1")
        check(
            self.prompt_feature_noise >= 0 and self.prefix_feature_noise >= 0,
            "env.simulator feature noises must be >= 0",
        )
        check(self.drift_std >= 0, f"env.simulator.drift_std must be >= 0 (got {self.drift_std})")


RHO = 0.98
"""AR(1) coefficient of the policy drift."""
_EPS = 1e-6


def _logit(v: np.ndarray) -> np.ndarray:
    v = np.clip(v, _EPS, 1 - _EPS)
    return np.log(v) - np.log1p(-v)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class Simulator(Env):
    """The simulator environment: a prompt pool, tree rollouts and their continuations.

    Args:
        cfg: simulator settings.
        seed: seeds every stream (prompts, pools, drift, rollouts).
    """

    config = SimulatorConfig
    true_values = True
    """Prompts carry their true V_0 (the oracle predictor reads it)."""
    fork_mode = "snapshot"
    """Continuations restart from the V_t stored in the prefix node (no tool calls to replay)."""

    def __init__(self, cfg: SimulatorConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        world, pools, drift, rollouts = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
        )
        self._pool_rng, self._drift_rng, self.rng = pools, drift, rollouts
        n = cfg.num_prompts
        comp = world.choice(
            len(cfg.mix_weights), size=n, p=np.asarray(cfg.mix_weights) / sum(cfg.mix_weights)
        )
        self.difficulty = world.normal(np.asarray(cfg.mix_means)[comp], np.asarray(cfg.mix_stds)[comp])
        self.drift_stationary_std = cfg.drift_std / np.sqrt(2 * (1 - RHO))
        self.drift = self.drift_stationary_std * self._drift_rng.standard_normal(n)
        zs = (self.difficulty - self.difficulty.mean()) / (self.difficulty.std() + _EPS)
        raw = world.standard_normal((n, cfg.prompt_feature_dim))
        raw[:, 0] = zs + cfg.prompt_feature_noise * raw[:, 0]
        rot, _ = np.linalg.qr(world.standard_normal((cfg.prompt_feature_dim, cfg.prompt_feature_dim)))
        self.prompt_features = raw @ rot
        self.step = 0

    # -- prompts ----------------------------------------------------------------------------------
    def success_probability(self, ids: np.ndarray | None = None) -> np.ndarray:
        """True V_0 of the given prompts (all if None) at the current step."""
        ids = np.arange(self.cfg.num_prompts) if ids is None else np.asarray(ids)
        return _sigmoid(self.difficulty[ids] + self.drift[ids])

    def prompt(self, i: int) -> Prompt:
        v0 = float(self.success_probability(np.array([i]))[0])
        return Prompt(
            prompt_id=f"sim-{i}", text="", features=self.prompt_features[i], true_value=v0, source="simulator"
        )

    def sample_pool(self, size: int) -> list[Prompt]:
        """A candidate pool of distinct prompts, drawn uniformly (the same for every allocator)."""
        if size > self.cfg.num_prompts:
            raise ValueError(f"pool of {size} exceeds env.simulator.num_prompts={self.cfg.num_prompts}")
        ids = self._pool_rng.choice(self.cfg.num_prompts, size=size, replace=False)
        return [self.prompt(int(i)) for i in ids]

    def advance(self) -> None:
        """One RL step passes: every prompt's drift moves one AR(1) step."""
        eps = self._drift_rng.standard_normal(self.cfg.num_prompts)
        self.drift = RHO * self.drift + np.sqrt(1 - RHO**2) * self.drift_stationary_std * eps
        self.step += 1

    # -- episodes ---------------------------------------------------------------------------------
    def _width(self) -> int:
        """Uniforms per episode: its length, one per transition V_{t-1} -> V_t, its reward, one noise per depth."""
        return 2 * self.cfg.max_turns + 2

    def _episodes(
        self, v_start: np.ndarray, t_start: np.ndarray, u: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Simulate episodes from V at depth t_start, episode i from its uniforms ``u[i]`` (``_width()`` each;
        None: from the simulator's own stream). Returns (T, V path (E, max_turns + 1), reward)."""
        cfg = self.cfg
        e = len(v_start)
        u = self.rng.random((e, self._width())) if u is None else u
        lo = np.maximum(t_start + 1, cfg.min_turns)
        length = lo + np.floor(u[:, 0] * (cfg.max_turns - lo + 1)).astype(np.int64)
        path = np.full((e, cfg.max_turns + 1), np.nan)
        path[np.arange(e), t_start] = v_start
        cur = v_start.copy()
        for t in range(int(t_start.min()) if e else 0, cfg.max_turns):
            step = (t >= t_start) & (t < length)
            if not step.any():
                continue
            c = np.clip(cur[step], _EPS, 1 - _EPS)
            cur[step] = betaincinv(cfg.concentration * c, cfg.concentration * (1 - c), u[step, t + 1])
            path[step, t + 1] = cur[step]
        reward = (u[:, cfg.max_turns + 1] < cur).astype(float)
        return length, path, reward

    def _draws(self, starts: Sequence[tuple[RolloutTree, int, int]]) -> np.ndarray:
        """The uniforms of episodes started as (tree, node, index there), each from its own seed."""
        keys = [
            SeedKey(self.seed, self.step, t.prompt.prompt_id, path_identity(t, n, i), t.nodes[n].depth + 1)
            for t, n, i in starts
        ]
        return uniforms(np.array([k.value() for k in keys], dtype=np.uint64), self._width())

    def _prefix_features(self, v: float, depth: int, noise: float) -> np.ndarray:
        g = v + self.cfg.prefix_feature_noise * noise
        return np.array([g, depth / self.cfg.max_turns])

    def _grow(
        self,
        tree: RolloutTree,
        start: int,
        length: int,
        path: np.ndarray,
        reward: float,
        bare: bool,
        u: np.ndarray,
    ) -> None:
        pid = tree.new_path(bare)
        parent = start
        depth0 = tree.nodes[start].depth
        noise = ndtri(u[self.cfg.max_turns + 2 + depth0 : self.cfg.max_turns + 2 + length])
        for t in range(depth0 + 1, length + 1):
            last = t == length
            node = tree.add_node(
                parent,
                pid,
                status=Status.ANSWERED if last else Status.TURN,
                reward=reward if last else None,
                true_value=float(path[t]),
                features=self._prefix_features(float(path[t]), t, float(noise[t - depth0 - 1])),
            )
            parent = node.node_id

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        """Bare rollouts: ``counts[i]`` episodes of ``prompts[i]``, one tree per prompt."""
        v0 = np.repeat([p.true_value for p in prompts], counts).astype(float)
        trees = [RolloutTree(p) for p in prompts]
        u = self._draws([(t, 0, j) for t, m in zip(trees, counts) for j in range(int(m))])
        length, path, reward = self._episodes(v0, np.zeros(len(v0), dtype=np.int64), u)
        e = 0
        for tree, m in zip(trees, counts):
            for _ in range(int(m)):
                self._grow(tree, 0, int(length[e]), path[e], float(reward[e]), True, u[e])
                e += 1
        return trees

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        """Add each expansion's extra bare rollouts, then its continuations from stored prefixes."""
        starts: list[tuple[RolloutTree, int, int]] = []  # (tree, node, the path's index there)
        for tree, ex in zip(trees, expansions):
            starts += [(tree, 0, tree.num_bare + j) for j in range(ex.extra_bare)]
        for tree, ex in zip(trees, expansions):
            started: dict[int, int] = {}
            for node_id, k in zip(ex.node_ids, ex.counts):
                n = int(node_id)
                for _ in range(int(k)):
                    started[n] = started.get(n, continuations_at(tree, n)) + 1
                    starts.append((tree, n, started[n]))
        if not starts:
            return
        v = np.array([t.nodes[n].true_value if n else t.prompt.true_value for t, n, _ in starts], dtype=float)
        depth = np.array([t.nodes[n].depth for t, n, _ in starts], dtype=np.int64)
        if (depth >= self.cfg.max_turns).any():
            raise ValueError("cannot continue from a prefix with no turns left")
        u = self._draws(starts)
        length, path, reward = self._episodes(v, depth, u)
        for e, (tree, n, _) in enumerate(starts):
            self._grow(tree, n, int(length[e]), path[e], float(reward[e]), n == 0, u[e])


def with_noise_scale(cfg: SimulatorConfig, scale: float) -> SimulatorConfig:
    """The same simulator with both feature noises multiplied by ``scale`` (informativeness sweep)."""
    return dataclasses.replace(
        cfg,
        prompt_feature_noise=cfg.prompt_feature_noise * scale,
        prefix_feature_noise=cfg.prefix_feature_noise * scale,
    )


def calibrate(
    cfg: SimulatorConfig, seed: int = 0, samples: int = 200_000, group_size: int = 8
) -> dict[str, float]:
    """Measure the simulator's informativeness and difficulty mix.

    Returns:
        ``prompt_r2``: share of Var(V_0) explained by E[V_0 | prompt features] (binned estimate of the
        Bayes-optimal regression on the 1-d sufficient statistic); ``prefix_r2``: the same for V_t given
        a prefix's features (pooled over depths 1..T-1); ``grpo_effective_ratio``: expected share of
        mixed groups of ``group_size`` uniform rollouts; ``mean_success``: mean V_0.
    """
    rng = np.random.default_rng(seed)
    w = np.asarray(cfg.mix_weights) / sum(cfg.mix_weights)
    comp = rng.choice(len(w), size=samples, p=w)
    z = rng.normal(np.asarray(cfg.mix_means)[comp], np.asarray(cfg.mix_stds)[comp])
    drift_std = cfg.drift_std / np.sqrt(2 * (1 - RHO))
    v0 = _sigmoid(z + drift_std * rng.standard_normal(samples))
    zs = (z - z.mean()) / z.std()
    stat = zs + cfg.prompt_feature_noise * rng.standard_normal(samples)
    out = {"prompt_r2": _binned_r2(stat, v0), "mean_success": float(v0.mean())}
    out["grpo_effective_ratio"] = float(np.mean(1 - v0**group_size - (1 - v0) ** group_size))
    # Prefixes of bare rollouts: V_t at every interior depth.
    sim = Simulator(cfg, seed=seed)
    n = min(samples // 4, 50_000)
    length, path, _ = sim._episodes(v0[:n], np.zeros(n, dtype=np.int64))
    vs, feats, depths = [], [], []
    for t in range(1, cfg.max_turns):
        ok = t < length
        vt = path[ok, t]
        vs.append(vt)
        feats.append(vt + cfg.prefix_feature_noise * rng.standard_normal(ok.sum()))
        depths.append(np.full(ok.sum(), t))
    if vs:
        v_all, f_all, d_all = np.concatenate(vs), np.concatenate(feats), np.concatenate(depths)
        fitted = np.empty_like(v_all)
        for t in np.unique(d_all):  # condition on depth as well (it is a feature)
            m = d_all == t
            fitted[m] = _binned_fit(f_all[m], v_all[m])
        out["prefix_r2"] = float(np.var(fitted) / np.var(v_all))
    else:
        out["prefix_r2"] = 0.0
    return out


def _binned_fit(x: np.ndarray, y: np.ndarray, bins: int = 64) -> np.ndarray:
    edges = np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1])
    idx = np.searchsorted(edges, x)
    sums = np.bincount(idx, weights=y, minlength=bins)
    cnt = np.maximum(np.bincount(idx, minlength=bins), 1)
    return (sums / cnt)[idx]


def _binned_r2(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.var(_binned_fit(x, y)) / np.var(y))
