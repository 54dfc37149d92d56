"""Per-prompt outcome history: discounted success / failure counts of bare rollouts.

    alpha_i <- discount^ds alpha_i + s_i,    beta_i <- discount^ds beta_i + f_i

with s_i / f_i the successes / failures of prompt i's *bare* rollouts in a step (continuations are
chosen where outcomes flip, so they are a biased sample of the prompt's success rate) and ds the
steps since its last update (the policy drifts, so old evidence fades). Keys are prompt ids:
this is how predictors learn from revisits (PCL's and SPO's per-prompt tracking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from tracerl.tree import RolloutTree


class PromptHistory:
    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.step = 0
        self.counts: dict[str, tuple[float, float, int]] = {}  # id -> (alpha, beta, last step)

    def get(self, prompt_id: str) -> tuple[float, float]:
        """Discounted (successes, failures) as of the current step; (0, 0) if never seen."""
        a, b, last = self.counts.get(prompt_id, (0.0, 0.0, self.step))
        decay = self.discount ** (self.step - last)
        return a * decay, b * decay

    def update(self, trees: Sequence[RolloutTree]) -> None:
        """Advance one step, then add that step's bare-rollout outcomes (undecayed until the next update)."""
        self.step += 1
        for tree in trees:
            rewards = [r for pid, r in tree.path_rewards().items() if pid < tree.num_bare]
            if not rewards:
                continue
            s = float(sum(rewards))
            a, b = self.get(tree.prompt.prompt_id)
            self.counts[tree.prompt.prompt_id] = (a + s, b + len(rewards) - s, self.step)

    def features(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """[posterior mean under Beta(1, 1), log(1 + evidence), seen], shape (n, 3)."""
        out = np.zeros((len(prompt_ids), 3), dtype=np.float32)
        for i, pid in enumerate(prompt_ids):
            a, b = self.get(pid)
            out[i] = ((a + 1) / (a + b + 2), np.log1p(a + b), float(pid in self.counts))
        return out

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.step = int(cast(int, state["step"]))
        self.counts = dict(cast("dict[str, tuple[float, float, int]]", state["counts"]))
