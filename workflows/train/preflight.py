"""Budgets that cannot run, refused before Ray starts or a run exists.

The config's own checks (``BudgetConfig.__post_init__``) see one section at a time; what needs the environment's
task set is checked here, on the driver, against the tasks the run would train on: each step draws a candidate pool
of ``budget.pool_factor x L / G`` prompts without replacement from the training tasks, so a pool larger than the
task set failed at step 1 inside a Train worker. The message gives the largest value that would run.
"""

from __future__ import annotations

import dataclasses
import math

from tracerl.algos.config import BudgetConfig
from tracerl.config import TrainConfig, section_key
from tracerl.engine.react import make_template
from tracerl.engine.untrusted import encodable
from tracerl.env_registry import env_class, env_section
from tracerl.envs.registry import tool_env_class


def training_tasks(cfg: TrainConfig) -> int:
    """How many training prompts the configured environment has (its data files checked already)."""
    return len(list(env_class(cfg.env.name).prompts(cfg.env, False)))


def _more_tasks(cfg: TrainConfig) -> str:
    """What gives the environment more training tasks: its ``num_tasks`` key where it has one."""
    section = env_section(cfg.env)
    if dataclasses.is_dataclass(section) and any(f.name == "num_tasks" for f in dataclasses.fields(section)):
        return f"raise env.{section_key(cfg.env.name)}.num_tasks"
    return "give the environment more training tasks"


def largest_leaves(budget: BudgetConfig, tasks: int) -> int:
    """The largest L whose candidate pool fits ``tasks`` prompts (0: none does): a multiple of lcm(1 + N, G), as
    ``BudgetConfig`` requires, with ``pool_factor x L / G <= tasks``."""
    unit = math.lcm(1 + budget.continuations, budget.group_size)
    return (tasks * budget.group_size // budget.pool_factor) // unit * unit


def check_budget(cfg: TrainConfig, tasks: int) -> None:
    """Refuse a step budget the task set cannot hold.

    Raises:
        ValueError: the candidate pool (``pool_factor x L / G`` prompts) needs more prompts than the ``tasks``
            training tasks; the message names the key that set L and the largest value of it (and of
            ``budget.pool_factor``) that runs.
    """
    b = cfg.budget
    if b.num_candidates <= tasks:
        return
    key, value = (
        ("budget.num_roots", b.num_roots) if b.num_roots is not None else ("budget.num_leaves", b.leaves)
    )
    leaves = largest_leaves(b, tasks)
    fixes = []
    if leaves > 0:
        largest = leaves // (1 + b.continuations) if key == "budget.num_roots" else leaves
        fixes.append(f"set {key} to at most {largest}")
    if tasks // b.num_groups >= 1:
        fixes.append(f"lower budget.pool_factor to {tasks // b.num_groups}")
    fixes.append(_more_tasks(cfg))
    raise ValueError(
        f"{key}={value} needs a candidate pool of {b.num_candidates} prompts each step (budget.pool_factor="
        f"{b.pool_factor} x L={b.leaves} / budget.group_size={b.group_size}) but the training task set has {tasks}: "
        + ", or ".join(fixes)
    )


def longest_prompt(cfg: TrainConfig) -> tuple[int, str]:
    """(tokens, task id) of the longest training or held-out prompt as the sampler first sees it: the question in
    the model's template with the environment's documented tools, tokenized by the policy's tokenizer (read from
    ``model.path``; loads no weights)."""
    from transformers import AutoTokenizer  # slow to import: transformers

    tok = AutoTokenizer.from_pretrained(cfg.model.path, local_files_only=True)
    template = make_template(cfg.model.template, tok, cfg.model.system_prompt)
    tools = list(tool_env_class(cfg.env.name).tools)
    cls = env_class(cfg.env.name)
    longest = (0, "")
    for held_out in (False, True):
        for p in cls.prompts(cfg.env, held_out):
            ids = tok(encodable(template.prompt(p.text, tools)), add_special_tokens=False)["input_ids"]
            longest = max(longest, (len(ids), str(p.prompt_id)))
    return longest


def check_context(cfg: TrainConfig, longest: tuple[int, str]) -> None:
    """Refuse a context limit that leaves no room for a first turn after the longest prompt: every episode of such a
    task would end at once (``context_overflow``) with no token generated, training on nothing.

    Raises:
        ValueError: names ``sampler.max_context_tokens``, the prompt, and the smallest limit that runs (and the one
            that leaves a whole turn of ``sampler.max_turn_tokens``).
    """
    s = cfg.sampler
    tokens, task = longest
    if tokens < s.max_context_tokens:
        return
    raise ValueError(
        f"sampler.max_context_tokens={s.max_context_tokens} leaves no room for a turn after the longest prompt "
        f"(task {task}: {tokens} tokens in model.template={cfg.model.template}): set sampler.max_context_tokens to "
        f"at least {tokens + 1} ({tokens + s.max_turn_tokens} for a whole turn of sampler.max_turn_tokens="
        f"{s.max_turn_tokens}), or shorten the prompts"
    )
