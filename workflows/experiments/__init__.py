"""The experiments: one-study instruments, kept out of the command rooms users run every day. Each but the GPU
check (``make gpu-check``) is still a ``tracerl bench`` subcommand or a variant of ``tracerl train`` or ``study``,
added to the CLI as a command family (``commands.FAMILY``, named in ``tracerl.workflows.COMMAND_FAMILIES``; no
command room imports this room, tests/test_layout.py checks it):

- ``bench peer``: TRL's GRPOTrainer beside tracerl grpo and trace on the same work (peer, peer_settings, peer_sides,
  peer_report; the TRL side, peer_trl, runs in its own venv). docs/results/peer.md.
- ``bench limit``: the embedded default's step at the limit this machine allows, next to a real step (limit,
  limit_micro, limit_report). docs/results/limit.md.
- ``bench pipeline --sim``: the pipeline scale model (pipeline_sim, pipeline_profile, pipeline_report) and the
  measurements its tiny profile is built from (pipeline_measure, pipeline_pool). docs/pipeline_model.md.
- ``bench targets`` and ``bench baseline``: bias of the predictor's fit targets and of the advantage baseline against
  the simulator's true V (targets, baseline, sim_summary; the runs are bench allocation's ``sim_runs``).
  docs/results/baseline_bias.md.
- ``bench testbeds``: acceptance of the study's testbeds (testbeds, probes). docs/results/testbeds.md.
- ``bench update``: one learner update of a chosen shape, and with ``startup_ranks`` the FSDP ranks' start-up memory
  (update, rank_load). docs/results/update_memory.md.
- ``bench sync``: a weight push to N sampler actors (sync, sync_actors). docs/results/weight_push.md.
- ``tracerl study --config conf/study/curves.yaml``: the compute-matched learning curves, the study grid run as the
  kind ``curve_study.CURVES`` (curve_cells, curves, sigmoid, curves_report, curve_results, curves_doc, curve_plots).
  docs/results/curves.md.
- ``tracerl train --config conf/train/chaos.yaml``: the chaos drill, seeded SIGKILLs around a training run (chaos).
  docs/reliability.md.
- proc_memory: a process tree's PSS and one process's peak RSS, as ``bench peer`` and ``bench sync`` sample them.
- ``make gpu-check``: the GPU check kit for a bare CUDA machine (gpu_check; its plan and memory formula stay in
  ops/gpu_plan.py, which the train config check uses). docs/gpu_check.md.

Imports any room before it (``tracerl.workflows.ROOMS``); nothing imports it.

Public face: ``commands.FAMILY``.
"""
