"""Starting or joining Ray the way this platform needs it (docs/PITFALLS.md)."""

from __future__ import annotations

from tracerl.config import ClusterConfig


def init_ray(cfg: ClusterConfig) -> None:
    """Join ``cfg.address`` or start an embedded Ray; a no-op if Ray is already up."""
    import ray

    if ray.is_initialized():
        return
    if cfg.address == "local":
        # address="local" never attaches to a stale /tmp/ray/ray_current_cluster of a killed head.
        ray.init(
            address="local",
            num_cpus=cfg.num_cpus,
            include_dashboard=cfg.include_dashboard,
            object_store_memory=cfg.object_store_memory_mb * 1024 * 1024,
            log_to_driver=True,
            configure_logging=False,
        )
    else:
        ray.init(address=cfg.address)
