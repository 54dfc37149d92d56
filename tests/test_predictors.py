from collections.abc import Sequence

import numpy as np
import pytest

from tests.conftest import chain
from tracerl.calibration import auc, calibration_metrics, ece
from tracerl.config import PredictorConfig
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.predictors import PREDICTORS, Predictor, build_predictor
from tracerl.predictors.base import FeaturizerFactory
from tracerl.predictors.history import PromptHistory
from tracerl.predictors.learned import LearnedPredictor
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt


def tree_with(pid: str, rewards: list[float]) -> RolloutTree:
    t = RolloutTree(Prompt(pid))
    chain(t, 0, [(r, 2) for r in rewards])
    return t


def test_registry() -> None:
    assert PREDICTORS.names() == ["constant", "learned", "oracle", "tabular"]


def test_constant() -> None:
    p = build_predictor(PredictorConfig(name="constant", constant_value=0.3))
    assert p.score([Anchor(Prompt("a")), Anchor(Prompt("b"))]).tolist() == [0.3, 0.3]


def test_tabular_posterior_golden_and_prefixes_share_it() -> None:
    p = build_predictor(
        PredictorConfig(name="tabular", prior_alpha=1, prior_beta=1, discount=0.5, warmup_steps=1)
    )
    assert not p.ready
    t = tree_with("a", [1, 1, 1, 0])
    p.fit([t])
    assert p.ready
    # Beta(1 + 3, 1 + 1): mean 4/6; an unseen prompt scores the prior mean.
    assert p.score([Anchor(Prompt("a")), Anchor(Prompt("zz"))]).tolist() == pytest.approx([4 / 6, 0.5])
    assert p.score([t.anchor(1)])[0] == pytest.approx(4 / 6)
    p.fit([])  # one step later the old counts are halved: Beta(1 + 1.5, 1 + 0.5)
    assert p.score([Anchor(Prompt("a"))])[0] == pytest.approx(2.5 / 4)


def test_history_counts_bare_rollouts_only(small_tree: RolloutTree) -> None:
    h = PromptHistory(discount=1.0)
    h.update([small_tree])  # bare rollouts: r = 0 and 1; the two continuations (both 1) are left out
    assert h.get("p0") == (1.0, 1.0)


def test_oracle_reads_true_values_and_refuses_real_prompts() -> None:
    sim = Simulator(SimulatorConfig(num_prompts=32), seed=0)
    pool = sim.sample_pool(4)
    p = build_predictor(PredictorConfig(), name="oracle")
    assert p.score([Anchor(x) for x in pool]).tolist() == pytest.approx([x.true_value for x in pool])
    with pytest.raises(ValueError, match="only the simulator provides"):
        p.score([Anchor(Prompt("real", text="What is 2+2?"))])


def test_learned_predictor_learns_revisited_prompts() -> None:
    """Two prompts with identical features but opposite outcomes: only revisits can tell them apart."""
    cfg = PredictorConfig(name="learned", warmup_steps=1, fit_steps=40, seed=0)
    p = build_predictor(cfg)
    feats = np.zeros(4)
    easy, hard = Prompt("easy", features=feats), Prompt("hard", features=feats)

    def tree(prompt: Prompt, r: float) -> RolloutTree:
        t = RolloutTree(prompt)
        for _ in range(4):
            pid = t.new_path(True)
            n = t.add_node(0, pid, features=np.zeros(2))
            t.add_node(n.node_id, pid, status=n.status.ANSWERED, reward=r, features=np.zeros(2))
        return t

    before = p.score([Anchor(easy), Anchor(hard)])
    assert before.tolist() == [0.5, 0.5]
    for _ in range(6):
        p.fit([tree(easy, 1.0), tree(hard, 0.0)])
    after = p.score([Anchor(easy), Anchor(hard)])
    assert after[0] > 0.8 and after[1] < 0.2


def test_learned_predictor_state_round_trip() -> None:
    sim = Simulator(SimulatorConfig(num_prompts=64), seed=0)
    cfg = PredictorConfig(name="learned", warmup_steps=1)
    p = build_predictor(cfg, seed=1)
    trees = sim.rollout(sim.sample_pool(6), [4] * 6)
    p.fit(trees)
    q = build_predictor(cfg, seed=1)
    q.load_state_dict(p.state_dict())
    anchors = [t.anchor(i) for t in trees for i in t.bare_prefixes()]
    np.testing.assert_allclose(p.score(anchors), q.score(anchors))
    p.fit(trees), q.fit(trees)  # the same state keeps evolving the same way
    np.testing.assert_allclose(p.score(anchors), q.score(anchors), atol=1e-6)


def test_calibration_metrics_golden() -> None:
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert np.isnan(auc(np.array([0.2, 0.3]), np.array([1, 1])))
    assert ece(np.array([0.05, 0.05, 0.95, 0.95]), np.array([0, 0, 1, 1])) == pytest.approx(0.05)
    m = calibration_metrics([0.5, 1.0], [0.5, 1.0], [[0, 1], [1]], [0.5, 0.9])
    # mse vs targets 0; Brier over (0.5,0), (0.5,1), (1,1) = (0.25 + 0.25 + 0) / 3; mse_true = 0.01 / 2.
    assert m["mse"] == 0 and m["brier"] == pytest.approx(1 / 6) and m["mse_true"] == pytest.approx(0.005)
    assert m["auc"] == pytest.approx(0.75)  # positives {0.5, 1} vs negative {0.5}: (0.5 + 1) / 2


def test_learned_predictor_over_text_separates_failing_histories() -> None:
    """Text anchors: histories full of error observations fail, clean ones succeed; the head learns it."""
    from tracerl.predictors.learned import LearnedPredictor
    from tracerl.predictors.text import HashedNgramFeaturizer
    from tracerl.types import Status

    def tree(i: int, good: bool) -> RolloutTree:
        t = RolloutTree(Prompt(f"q{i}", text=f"What is {i} + {i}?"))
        for _ in range(2):
            pid = t.new_path(True)
            obs = f"Observation: {2 * i}\n" if good else "Observation: Error: unknown tool 'calc'.\n"
            n = t.add_node(0, pid, content=f"Thought: add.\nAction: python[print({i}+{i})]\n{obs}")
            t.add_node(
                n.node_id, pid, content="Final Answer: x", status=Status.ANSWERED, reward=1.0 if good else 0.0
            )
        return t

    p = LearnedPredictor(
        PredictorConfig(name="learned", warmup_steps=1, fit_steps=60, embedding_buckets=0),
        features=lambda: HashedNgramFeaturizer(64),
    )
    for step in range(5):
        p.fit([tree(10 * step + k, k % 2 == 0) for k in range(8)])
    good, bad = tree(999, True), tree(998, False)
    s = p.score([good.anchor(1), bad.anchor(1)])
    assert s[0] > 0.7 and s[1] < 0.3


def test_debiased_fit_targets_and_weights() -> None:
    from tests.test_tree import nested_tree
    from tracerl.algos.allocators import build_allocator
    from tracerl.config import AllocatorConfig
    from tracerl.predictors.base import tree_targets

    t = nested_tree()  # non-leaf nodes 0, 1, 2, 4, 8
    old = tree_targets([t])
    assert old.values.tolist() == pytest.approx([4 / 6, 0.5, 2 / 3, 1, 0]) and old.weights.tolist() == [
        6,
        4,
        3,
        2,
        1,
    ]
    # Debiased: the root's D; per other node its path's reward (weight 1), then its continuations' mean (weight K).
    new = tree_targets([t], "debiased")
    assert [len(a.history) for a in new.anchors] == [0, 1, 1, 2, 2, 1, 1, 2]  # nodes 0, 1, 1, 2, 2, 4, 4, 8
    assert new.values.tolist() == pytest.approx([0.5, 0, 0, 0, 1, 1, 1, 0])
    assert new.weights.tolist() == [2, 1, 1, 1, 2, 1, 1, 1]
    with pytest.raises(ValueError, match="predictor targets must be one of recursive, debiased"):
        tree_targets([t], "mean")
    # trace_debiased forces the predictor's targets; the learned fit stores them in its replay.
    alloc = build_allocator(AllocatorConfig(name="trace_debiased"))
    pred = build_predictor(
        PredictorConfig(name="learned", embedding_buckets=0), name=alloc.predictor, targets=alloc.targets
    )
    assert pred.cfg.targets == "debiased"
    env = Simulator(SimulatorConfig(num_prompts=8), seed=0)
    t_sim = env.rollout([env.prompt(0)], [1])[0]  # one chain: every node's D is its reward, with weight 1
    pred.fit([t_sim])
    x, _, y, w = pred.replay[-1]
    assert y.tolist() == [float(t_sim.leaves()[0].reward)] * len(y) and w.tolist() == [1.0] * len(w)
    with pytest.raises(ValueError, match="predictor.targets must be one of .recursive., .debiased."):
        PredictorConfig(targets="mean")


def test_text_predictors_are_built_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every predictor comes from PREDICTORS; text features reach the one that reads them, and only it."""
    from tracerl.predictors.learned import LearnedPredictor
    from tracerl.predictors.text import HashedNgramFeaturizer
    from tracerl.workflows.lm.stack import SetupError, make_text_predictor

    built: list[object] = []

    class FakeFeaturePredictor(Predictor):
        def __init__(
            self, cfg: PredictorConfig, seed: int = 0, features: FeaturizerFactory | None = None
        ) -> None:
            super().__init__(cfg, seed, features)
            assert features is not None
            built.append(features())

    monkeypatch.setitem(PREDICTORS._items, "fake_features", FakeFeaturePredictor)
    cfg = PredictorConfig(name="learned", features="hashed")
    learned = make_text_predictor(cfg, 0, None, None, str)
    assert isinstance(learned, LearnedPredictor) and isinstance(learned.featurizer, HashedNgramFeaturizer)
    make_text_predictor(cfg, 0, None, None, str, name="fake_features")
    assert len(built) == 1 and isinstance(built[0], HashedNgramFeaturizer)
    numeric = PredictorConfig(name="tabular", features="numeric")
    assert type(make_text_predictor(numeric, 0, None, None, str)).__name__ == "TabularPredictor"
    with pytest.raises(SetupError, match="predictor.features=numeric needs the simulator's numeric features"):
        make_text_predictor(numeric, 0, None, None, str, name="learned")


def test_learned_predictor_rejects_a_feature_width_change() -> None:
    """It once scored 0.5 (while ready) for anchors whose feature width differed from the fit's."""
    widths = [3]

    def fake_featurizer(anchors: Sequence[Anchor]) -> np.ndarray:
        return np.ones((len(anchors), widths[0]), dtype=np.float32)

    cfg = PredictorConfig(name="learned", warmup_steps=1, fit_steps=2)
    p = LearnedPredictor(cfg, features=lambda: fake_featurizer)
    assert p.score([Anchor(Prompt("a"))]).tolist() == [0.5]  # cold start: not fit yet
    t = RolloutTree(Prompt("a"))
    chain(t, 0, [(1.0, 2), (0.0, 2)])
    p.fit([t])
    assert p.ready and 0.0 < p.score([Anchor(Prompt("a"))])[0] < 1.0
    widths[0] = 5
    with pytest.raises(ValueError, match="fit on 6 input features but now gets 8"):
        p.score([Anchor(Prompt("a"))])
    with pytest.raises(ValueError, match="one width for every anchor"):
        p.fit([t])
