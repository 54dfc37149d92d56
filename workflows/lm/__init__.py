"""The language-model stack a command builds (stack: policy, sampler, environment, text predictor) and the
one-pool rollout of ``tracerl rollout`` (rollout), with the trees' HTML view (viewer). Imports ops only.

Public face: ``stack.build_stack``, ``stack.task_prompts``, ``rollout.run_rollout``, ``viewer.render_html``.
"""
