"""The benchmarks of ``tracerl bench``: allocation, env, rollout, targets, train, testbeds (with probes and
simulated runs), peer (TRL's trainer beside tracerl; its TRL side in peer_trl). Imports every room below it except pipeline and cli.

Public face: each module's ``run_<name>_bench`` (targets: ``run_targets``) and ``format_table``; peer_trl's
``main`` runs in the peer venv.
"""
