"""TRL's side of ``tracerl bench peer``: TRL's ``GRPOTrainer`` on the project's environment, in the peer venv.

Run by the bench as a subprocess (``python -m tracerl.workflows.experiments.peer_trl SPEC.json``) with the interpreter of the venv that
holds TRL (``make bench-peer`` builds ``.venv-peer``); nothing else imports TRL, and this module imports it only
inside ``PeerRun.train``, so its adapter (``group_runs``, ``rollout_outputs``, ``PeerRollout``) is tested without TRL.

[choice] Only the trainer and the engine around the rollouts differ from ``tracerl train``. TRL's ``rollout_func``
runs the project's own ReAct engine (``TreeRolloutEngine``) in this process, with the hf sampler on the very model
TRL trains (no weight copy to sync), the project's template and stop strings, episode limits (``SamplerConfig``),
the math environment (sandboxed Python tool, math-verify reward) with its tool calls on as many threads as
``tracerl train`` runs environment actors. Each of TRL's groups (a prompt repeated ``num_generations`` times in a
row) is one flat tree of that many bare rollouts, as ``allocator=grpo`` rolls it out. A rollout's completion is
its turns after the prompt: model tokens with ``env_mask`` 1, tool observations with ``env_mask`` 0 and log-prob 0,
so TRL takes no loss on tool tokens, as ``tracerl.algos.batch.collate`` masks them. The reward is the engine's (the
environment graded the answer in the loop), handed to TRL's reward function as an extra field.

The optimizer and schedule are the project's (``torch.optim.AdamW`` with ``tracerl.learner.lr_lambda``), passed as
``optimizers=``: TRL's scheduler types start warm-up at 0 where tracerl starts at lr / (warmup + 1). Everything
else TRL is told comes from ``tracerl.workflows.experiments.peer_settings.settings`` (the one mapping of settings), written into the spec.

Written to ``out``: per step its wall-clock begin and end (``time.time()``, so the parent can measure start-up from
its launch), the rollout function's seconds and its engine's phases (generate, tools, grade), the
generation-and-scoring seconds (rollout, log-probs, rewards, advantages), generated tokens; held-out greedy accuracy at step 0 and every ``eval_every`` steps and its seconds.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.tree import RolloutTree
from tracerl.types import Prompt


def group_runs(prompts: Sequence[str]) -> list[tuple[str, int]]:
    """TRL's prompt list as (prompt, count) runs of consecutive equal prompts, in order: its groups."""
    runs: list[tuple[str, int]] = []
    for p in prompts:
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def rollout_outputs(trees: Sequence[RolloutTree], eos_id: int) -> dict[str, list[Any]]:
    """What TRL's ``rollout_func`` returns for ``trees``: one completion per leaf, tree by tree.

    ``prompt_ids`` (the rendered prompt), ``completion_ids`` (every turn after it, observations included),
    ``logprobs`` (the sampler's on model tokens, 0 on observation tokens), ``env_mask`` (1 on model tokens, 0 on
    observation tokens: TRL's loss mask for environment feedback) and ``env_reward`` (the leaf's reward, for the
    reward function). A leaf with no tokens at all (an episode closed before its first turn) gets one EOS with mask
    0, so TRL sees no empty completion and trains on nothing there."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    out["env_reward"] = []
    for tree in trees:
        n = len(tree.prompt_token_ids)
        for leaf in tree.leaves():
            ids, mask, _ = tree.sequence(leaf.node_id)
            lps: list[float] = []
            for nid in tree.path(leaf.node_id)[1:]:
                node = tree.nodes[nid]
                lps += list(node.logprobs) + [0.0] * (len(node.token_ids) - sum(node.model_mask))
            completion, env_mask = list(ids[n:]), [int(m) for m in mask[n:]]
            if not completion:
                completion, env_mask, lps = [eos_id], [0], [0.0]
            out["prompt_ids"].append(list(ids[:n]))
            out["completion_ids"].append(completion)
            out["logprobs"].append(lps)
            out["env_mask"].append(env_mask)
            out["env_reward"].append(float(leaf.reward or 0.0))
    return out


class PeerRollout:
    """The project's ReAct engine as TRL's ``rollout_func``: one flat tree per group, on the live model."""

    def __init__(self, cfg: Any, tokenizer: Any, env: Any, by_text: dict[str, Prompt]) -> None:
        from tracerl.engine.react import make_template

        self.cfg, self.tok, self.env, self.by_text = cfg, tokenizer, env, by_text
        self.template = make_template(cfg.model.template, tokenizer, cfg.model.system_prompt)
        self.seconds = 0.0
        """The last call's wall seconds."""
        self.generated_tokens = 0
        """The last call's generated tokens (model tokens, as ``budget/generated_tokens``)."""
        self.phase_s: dict[str, float] = {}
        """The last call's engine phases (generate, tools, grade seconds), as ``time/<phase>_s``."""

    def engine(self, model: Any, seed: int, step: int | None) -> Any:
        from tracerl.engine.rollout import TreeRolloutEngine
        from tracerl.samplers.hf import HFSampler

        device = str(next(model.parameters()).device)
        sampler = HFSampler(model, self.tok, device=device, reuse_prefix=self.cfg.sampler.reuse_prefix)
        return TreeRolloutEngine(sampler, self.env, self.template, self.tok, self.cfg.sampler, seed, step)

    def run(
        self,
        model: Any,
        prompts: Sequence[Prompt],
        counts: Sequence[int],
        step: int | None,
        seed: int,
        temperature: float | None = None,
    ) -> tuple[list[RolloutTree], Any]:
        """``counts[i]`` bare rollouts of ``prompts[i]`` on ``model`` (eval mode while it generates)."""
        was_training = model.training
        try:
            eng = self.engine(model, seed, step)  # HFSampler puts the model in eval mode
            if temperature is not None:
                eng.limits = dataclasses.replace(eng.limits, temperature=temperature)
            return eng.rollout(list(prompts), list(counts)), eng.ledger
        finally:
            model.train(was_training)

    def trees_for(self, prompts: Sequence[str]) -> tuple[list[Prompt], list[int]]:
        """The project's prompts of TRL's groups; a prompt in two groups of one call gets a second id (the engine
        keys seeds by prompt id, which must be distinct within a step)."""
        seen: dict[str, int] = {}
        out, counts = [], []
        for text, k in group_runs(prompts):
            p = self.by_text[text]
            seen[p.prompt_id] = seen.get(p.prompt_id, 0) + 1
            if seen[p.prompt_id] > 1:
                p = dataclasses.replace(p, prompt_id=f"{p.prompt_id}#{seen[p.prompt_id]}")
            out.append(p)
            counts.append(k)
        return out, counts

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        t0 = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        ps, counts = self.trees_for(prompts)
        trees, ledger = self.run(model, ps, counts, trainer.state.global_step, self.cfg.seed)
        out = rollout_outputs(trees, self.tok.eos_token_id)
        self.generated_tokens = ledger.generated_tokens
        self.phase_s = dict(ledger.phase_s)
        self.seconds = time.perf_counter() - t0
        return out


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float], **_: Any) -> list[float]:
    """TRL's reward function: the reward the engine's environment gave each rollout (``rollout_outputs``)."""
    return [float(r) for r in env_reward]


def concurrent_env(cfg: Any) -> Any:
    """The configured environment, its rounds of tool calls on as many threads as ``tracerl train`` runs
    environment actors (``pools.rollout_workers * pools.env_workers``)."""
    from tracerl.engine.concurrent_env import ConcurrentEnv
    from tracerl.workflows.lm.stack import make_env

    return ConcurrentEnv(make_env(cfg.env), max(1, cfg.pools.rollout_workers * cfg.pools.env_workers))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tracerl.workflows.experiments.peer_trl SPEC.json``: train with TRL as the spec says; write the step records."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(
            "usage: python -m tracerl.workflows.experiments.peer_trl SPEC.json (written by tracerl bench peer)",
            file=sys.stderr,
        )
        return 2
    spec = json.loads(Path(args[0]).read_text())
    import torch

    torch.set_num_threads(int(spec["threads"]))
    run = PeerRun(spec)
    run.train()
    Path(spec["out"]).write_text(json.dumps(run.record, indent=2))
    return 0


class PeerRun:
    """One TRL training run as the spec says: the policy, the rollout function, held-out evaluation when due, and
    the step records (``record``) the bench reads back."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from tracerl.config import TrainConfig
        from tracerl.config_loader import compose
        from tracerl.models.hf import load_policy
        from tracerl.workflows.lm.stack import task_prompts

        self.spec = spec
        self.cfg = cfg = compose(TrainConfig, spec["config"])
        self.tok, self.model = load_policy(cfg.model)
        self.model.train()
        self.prompts = task_prompts(cfg.env)
        self.eval_prompts = task_prompts(cfg.env, held_out=True)
        self.rollout = PeerRollout(cfg, self.tok, concurrent_env(cfg), {p.text: p for p in self.prompts})
        self.record: dict[str, Any] = {"steps": [], "evals": [], "launch_child": time.time()}
        self.eval_every = int(spec.get("eval_every", 0))

    def dataset(self) -> list[str]:
        """TRL's training prompts in the order it takes them: the spec's ``prompts``, tracerl grpo's draws step by
        step (``peer_settings.grpo_draws``; the arguments set ``shuffle_dataset=False``)."""
        return [text for step in self.spec["prompts"] for text in step]

    def optimizers(self) -> tuple[Any, Any]:
        """The project's AdamW and schedule (``tracerl.learner.lr_lambda``), for ``GRPOTrainer(optimizers=...)``."""
        import torch

        from tracerl.learner import lr_lambda

        o = self.cfg.optim
        optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=o.lr,
            betas=(o.betas[0], o.betas[1]),
            weight_decay=o.weight_decay,
        )
        steps = self.cfg.num_steps * self.cfg.loss.epochs
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, steps))

    def evaluate(self, step: int) -> None:
        """Greedy held-out accuracy after ``step`` steps, as ``tracerl train`` evaluates, with its seconds."""
        from tracerl.workflows.train.evaluate import evaluate_prompts

        t0 = time.perf_counter()
        m, _ = evaluate_prompts(
            lambda ps, k, temp, seed: self.rollout.run(self.model, ps, [k] * len(ps), None, seed, temp),
            self.eval_prompts,
            0,
            0.0,
            self.cfg.seed + 10_000,
        )
        self.record["evals"].append(
            {"step": step, "accuracy": m["accuracy"], "eval_s": time.perf_counter() - t0}
        )
        print(f"peer trl: held-out greedy accuracy after {step} steps: {m['accuracy']:.3f}", flush=True)

    def end_step(self, step: int, begin: float, scoring_s: float) -> None:
        """Record a finished step (evaluating first when one is due: at every ``eval_every`` and the last)."""
        end = time.time()
        rec = {
            "step": step,
            "begin": begin,
            "end": end,
            "rollout_s": self.rollout.seconds,
            "scoring_s": scoring_s,
            "generated_tokens": self.rollout.generated_tokens,
            "phase_s": self.rollout.phase_s,
            "eval_s": 0.0,
        }
        if (self.eval_every and step % self.eval_every == 0) or step == self.cfg.steps:
            self.evaluate(step)
            rec["eval_s"] = self.record["evals"][-1]["eval_s"]
        self.record["steps"].append(rec)
        print(f"peer trl: step {step}/{self.cfg.steps}  {end - begin:.1f} s", flush=True)

    def train(self) -> None:
        """TRL's ``GRPOTrainer`` with the project's rollout function, reward, optimizer and the spec's arguments."""
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from tracerl.workflows.ops.turns import take_turn

        run = self

        class PeerGRPOTrainer(GRPOTrainer):
            """Counts the seconds of generation and scoring, the part of a step that is not the update."""

            scoring_s = 0.0

            def _generate_and_score_completions(self, inputs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return super()._generate_and_score_completions(inputs)
                finally:
                    self.scoring_s += time.perf_counter() - t0

        class Timing(TrainerCallback):
            """Per step: wall-clock begin and end, the scoring's seconds, evaluation when due."""

            begin = 0.0

            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if run.spec.get("eval_at_start"):
                    run.evaluate(0)

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                take_turn(int(state.global_step))  # under --interleave step: wait for this step's turn
                self.begin = time.time()
                trainer.scoring_s = 0.0

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                run.end_step(int(state.global_step), self.begin, trainer.scoring_s)

        trl_args = dict(self.spec["trl_args"])
        trl_args.update(output_dir=self.spec["output_dir"], report_to="none", disable_tqdm=True)
        trainer = PeerGRPOTrainer(
            model=self.model,
            reward_funcs=[env_reward],
            args=GRPOConfig(**trl_args),
            train_dataset=Dataset.from_list([{"prompt": text} for text in self.dataset()]),
            processing_class=self.tok,
            callbacks=[Timing()],
            optimizers=self.optimizers(),
            rollout_func=self.rollout,
        )
        trainer.train()


if __name__ == "__main__":
    raise SystemExit(main())
