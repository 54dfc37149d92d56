"""``tracerl bench sync``'s sampler actors (workflows/experiments/sync.py): ``RolloutWorker`` with its own RSS sampler.

A module of its own because it imports Ray, which the CLI (that imports the bench's config) must not.
"""

from __future__ import annotations

from tracerl.actors.pools import RolloutPool, RolloutWorker
from tracerl.workflows.experiments.proc_memory import RssPeak


class SyncBenchWorker(RolloutWorker):
    """A sampler actor that samples its own RSS during a push and reports a sample of its weights."""

    _rss: RssPeak | None = None

    def rss_start(self, interval_s: float) -> int:
        self._rss = RssPeak(interval_s)
        return self._rss.base

    def rss_stop(self) -> dict[str, int]:
        assert self._rss is not None
        out, self._rss = self._rss.stop(), None
        return out

    def probe(self, keys: tuple[str, ...]) -> list[float]:
        """The first few values of the weights ``keys`` (the bench's check that the push landed)."""
        state = self.model.state_dict()
        return [float(x) for k in keys for x in state[k].flatten()[:4]]


class SyncBenchPool(RolloutPool):
    worker_class = SyncBenchWorker
