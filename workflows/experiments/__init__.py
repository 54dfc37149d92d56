"""The experiments: one-study instruments, kept out of the command rooms users run every day. Each is still a
``tracerl bench`` subcommand, added to the CLI as a command family (``commands.FAMILY``, named in
``tracerl.workflows.COMMAND_FAMILIES``; no command room imports this room, tests/test_layout.py checks it):

- ``bench peer``: TRL's GRPOTrainer beside tracerl grpo and trace on the same work (peer, peer_settings, peer_sides,
  peer_report; the TRL side, peer_trl, runs in its own venv). docs/results/peer.md.
- ``bench limit``: the embedded default's step at the limit this machine allows, next to a real step (limit,
  limit_micro, limit_report). docs/results/limit.md.
- ``bench pipeline --sim``: the pipeline scale model (pipeline_sim, pipeline_profile, pipeline_report) and the
  measurements its tiny profile is built from (pipeline_measure, pipeline_pool). docs/pipeline_model.md.

Imports any room before it (``tracerl.workflows.ROOMS``); nothing imports it.

Public face: ``commands.FAMILY``.
"""
