"""MLflow and what a run leaves behind: the tracking store (store: URI, set-up, reachability), runs and their
storage (runs, run_info), the checkpoint's driver state (checkpoint_state), checkpoints written whole and checked (checkpoint_files), the Model Registry (model_registry),
the UI (ui), run comparison (compare), the metric spool of a tracking outage (spool), and what every report reads
and writes with: runs as one pandas frame (frame), tables (tables), figures (figures). Imports ops and lm.

Public face: ``store.setup``, ``store.resolve_uri``, ``runs.create_run``, ``runs.latest_checkpoint``, ``checkpoint_files.publish``,
``model_registry.register``, ``compare.compare``, ``ui.serve``.
"""
