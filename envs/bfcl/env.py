"""The BFCL v4 multi-turn environment: stateful API backends from ``bfcl-eval``, reward by its multi-turn checker.

An episode is one BFCL task. The user's first message is the prompt; a model response (a *turn*) either
calls functions (one or more calls; their results come back as one observation) or ends the current user
turn without calls. Then the environment delivers the next user message (``on_answer``); after the last
user turn the official ``multi_turn_checker`` scores the recorded calls (reward 1 or 0). In miss_func tasks
the held-out functions are added at their turn: that turn's user message lists their schemas. The checker
re-executes the episode's calls; it runs in a grading worker under ``env.reward_timeout_s`` (``tracerl.grading``).
Tool calls run in a worker of their own under ``env.bfcl.call_timeout_s``: calls past it are an error observation
and are not recorded.

[choice] Forking by deterministic replay: the state is the calls recorded so far (per user turn, per
response); each execution rebuilds the backends from the task's initial configuration and re-runs the
recorded calls before the new ones. The backends' randomness is seeded from the configuration, so a
replay rebuilds the same state. Each execution runs under a fresh unique model name (BFCL caches backend
instances in module globals keyed by model name and task id) and deletes its globals afterwards, so
concurrent rollouts in one process never share state.

[choice] Calls are validated before anything runs: unknown functions, unknown or missing arguments and
bad syntax are error observations (the episode goes on), and only literal argument values are accepted.
Calls are re-written in a canonical keyword form ``name(arg=repr(value))`` for BFCL's executor, which
``eval``s them; so model text never reaches ``eval`` except as literal values. BFCL's own inference loop
ends a user turn on an undecodable response; here it is an error observation instead.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tracerl.engine.protocol import AnswerResult, ToolEnv, ToolResult
from tracerl.engine.react import Action, ToolCall, ToolSpec, TurnTemplate, call_source
from tracerl.envs.bfcl.config import BfclEnvConfig
from tracerl.envs.bfcl.data import ADDED_FUNCTIONS_PROMPT, BfclTask, import_bfcl, load_tasks, split, tool_spec
from tracerl.grading import GradeError, Grader, GradeTimeout
from tracerl.types import Prompt

PRELOAD = (
    "tracerl.envs.bfcl.data:import_bfcl",
    "tracerl.envs.bfcl.env",
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
)
"""What a BFCL grading worker imports before it counts as started."""
GOLD_ANSWER = "Done."
"""What a gold response says when it ends a user turn."""
GOLD_DECLINE = "I cannot do that with the functions and information I have."
"""What a gold response says at a turn whose reference has no calls (missing function or parameter)."""


@dataclass(frozen=True)
class BfclState:
    """An episode's state: the current user turn and every call recorded so far."""

    turn: int = 0
    """Index of the current user turn."""
    steps: tuple[tuple[tuple[str, ...], ...], ...] = ((),)
    """Per user turn (up to the current one), per model response, the canonical call strings executed."""

    @property
    def num_calls(self) -> int:
        """Calls recorded so far."""
        return sum(len(step) for turn in self.steps for step in turn)


def reference_calls(source: str) -> list[ToolCall]:
    """A ground-truth call string (``f('x', b=2)``) as a call with named arguments (signature order)."""
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), source
    spec = tool_spec(node.func.id)
    args = {p: ast.literal_eval(v) for p, v in zip(spec.parameters, node.args)}
    args.update({str(kw.arg): ast.literal_eval(kw.value) for kw in node.keywords})
    return [ToolCall(node.func.id, args)]


class _Globals:
    """Unique names for BFCL's module-global backend instances, removed afterwards."""

    def __init__(self) -> None:
        self.name = f"tracerl_{uuid.uuid4().hex}"

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc: object) -> None:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        # BFCL sanitises the instance name the same way ('-./:' -> '_'); ours has none of those characters.
        space = vars(multi_turn_utils)
        for key in [k for k in list(space) if k.startswith(self.name)]:
            space.pop(key, None)


def bfcl_globals() -> list[str]:
    """Names of backend instances this module left in BFCL's globals (empty when every rollout cleaned up)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return [k for k in list(vars(multi_turn_utils)) if k.startswith("tracerl_")]


class BfclEnv(ToolEnv):
    """BFCL v4 multi-turn function calling (categories base, miss_func, miss_param, long_context)."""

    config = BfclEnvConfig
    fork_mode = "replay"
    tools: Sequence[ToolSpec] = ()
    """Tools differ per task and per user turn: see ``tools_for``."""

    def __init__(
        self,
        categories: Sequence[str] = ("base", "miss_func", "miss_param", "long_context"),
        docs: str = "full",
        reward_timeout_s: float = 10.0,
        call_timeout_s: float = 10.0,
    ) -> None:
        import_bfcl()
        self.tasks: dict[str, BfclTask] = {t.task_id: t for c in categories for t in load_tasks(c)}
        self.docs = docs
        self.grader = Grader(reward_timeout_s, PRELOAD)
        """Runs the multi-turn checker (started at the first episode's end)."""
        self.runner = Grader(call_timeout_s, PRELOAD)
        """Runs the calls of a turn with the replayed ones (started at the first call)."""

    @classmethod
    def from_config(cls, env_cfg: Any, services: Mapping[str, Any] | None = None) -> BfclEnv:
        """One environment from ``env.bfcl``."""
        b = env_cfg.settings(BfclEnvConfig)
        return cls(b.categories, b.docs, env_cfg.reward_timeout_s, b.call_timeout_s)

    @staticmethod
    def prompts(env_cfg: Any, held_out: bool = False) -> list[Prompt]:
        """Training prompts (the first ``num_tasks`` of the training side of the seeded split, categories
        interleaved), or the first ``eval_tasks`` held-out ones."""
        b = env_cfg.settings(BfclEnvConfig)
        import_bfcl()
        tasks = [t for c in b.categories for t in load_tasks(c)]
        train, test = split(tasks, b.split_seed, b.test_fraction)
        chosen = _interleave(test if held_out else train)[: b.eval_tasks if held_out else b.num_tasks]
        return [task_prompt(t) for t in chosen]

    def task(self, prompt: Prompt) -> BfclTask:
        """The BFCL task behind ``prompt``."""
        try:
            return self.tasks[prompt.prompt_id]
        except KeyError:
            raise KeyError(
                f"{prompt.prompt_id!r} is not a task of this BFCL environment's categories"
            ) from None

    def tools_for(self, prompt: Prompt, state: BfclState | None = None) -> list[ToolSpec]:
        """The functions documented at ``state``'s user turn, then the held-out ones not added yet as unlisted
        tools (BFCL's executor runs any method of the task's backends, and some references call a held-out
        function before its turn)."""
        task = self.task(prompt)
        listed = task.functions_at(state.turn if state is not None else 0)
        hidden = [f for f in task.functions_at(len(task.user_turns)) if f not in listed]
        return [tool_spec(f, self.docs) for f in listed] + [
            replace(tool_spec(f, self.docs), listed=False) for f in hidden
        ]

    def initial_state(self, prompt: Prompt) -> BfclState:
        return BfclState()

    def execute(self, prompt: Prompt, state: BfclState, action: Action) -> ToolResult:
        """Run the action's calls after replaying the recorded ones; an invalid call is an error observation."""
        task = self.task(prompt)
        available = set(task.functions_at(len(task.user_turns)))
        for c in action.calls:
            if c.tool not in available:  # the parser checks too; the environment does not rely on it
                shown = ", ".join(task.functions_at(state.turn))
                return ToolResult(f"Error: unknown function '{c.tool}'; available: {shown}.", state, calls=0)
        if not action.calls:
            return ToolResult("Error: no function call to run.", state, calls=0)
        for c in action.calls:
            err = _check_arguments(c)
            if err:
                return ToolResult(err, state, calls=0)
        new = tuple(call_source(c) for c in action.calls)
        history = [call for turn in state.steps for step in turn for call in step]
        try:
            results = self._run(task, [*history, *new])[len(history) :]
        except (
            GradeTimeout
        ):  # e.g. power(base=9, exponent=387420489): the calls are dropped, the episode goes on
            return ToolResult(
                f"Error: the calls ran past {self.runner.timeout_s:g} s and were stopped; nothing was "
                "recorded. Make cheaper calls.",
                state,
                calls=len(new),
                replayed=len(history),
                timed_out=True,
            )
        except GradeError as exc:
            return ToolResult(
                f"Error: the calls failed ({exc}); nothing was recorded.",
                state,
                calls=len(new),
                replayed=len(history),
            )
        observation = "\n".join(f"{call} -> {result}" for call, result in zip(new, results))
        steps = (*state.steps[:-1], (*state.steps[-1], new))
        return ToolResult(observation, BfclState(state.turn, steps), calls=len(new), replayed=len(history))

    def _run(self, task: BfclTask, calls: list[str]) -> list[str]:
        """Execute ``calls`` in order on fresh backends of ``task`` in the call worker, under
        ``env.bfcl.call_timeout_s`` (raises ``GradeTimeout`` past it, ``GradeError`` if the worker failed)."""
        return list(
            self.runner(
                run_calls,
                calls,
                task.entry["initial_config"],
                task.entry["involved_classes"],
                task.task_id,
                task.long_context,
            )
        )

    def on_answer(self, prompt: Prompt, state: BfclState, action: Action) -> AnswerResult:
        """End of a user turn: the next user message, or after the last one the checker's reward."""
        task = self.task(prompt)
        nxt = state.turn + 1
        if nxt >= len(task.user_turns):
            return AnswerResult(reward=self.score(task, state))
        message = task.user_turns[nxt]
        if nxt in task.added:
            docs = "\n".join(
                json.dumps(tool_spec(f, self.docs).as_json_schema()["function"]) for f in task.added[nxt]
            )
            message = f"{docs}\n{ADDED_FUNCTIONS_PROMPT}" + (f" {message}" if message else "")
        return AnswerResult(observation=message, state=BfclState(nxt, (*state.steps, ())))

    def score(self, task: BfclTask, state: BfclState) -> float:
        """BFCL's multi-turn checker on the recorded calls: 1.0 if every turn's state and results match.

        The checker re-executes every call of the episode: it runs in the grading worker, under
        ``env.reward_timeout_s``.

        Raises:
            GradeTimeout: the check ran past the limit.
        """
        if len(state.steps) != len(task.ground_truth):
            return 0.0
        decoded = [[list(step) for step in turn if step] for turn in state.steps]
        try:
            return float(
                self.grader(check_episode, decoded, [list(t) for t in task.ground_truth], dict(task.entry))
            )
        except GradeError:  # the worker ran out of memory or died on these calls: a failed check
            return 0.0

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        """BFCL scores the whole episode's calls (``on_answer``); an answer alone earns nothing."""
        return 0.0

    def gold_turns(self, prompt: Prompt, template: TurnTemplate) -> list[str]:
        """The reference responses as model text in ``template``'s format: per user turn, one response with all
        its reference calls (if any), then one ending the turn."""
        turns: list[str] = []
        for reference in self.task(prompt).ground_truth:
            calls = [c for source in reference for c in reference_calls(source)]
            if calls:
                turns.append(template.calls_turn("I call the functions.", calls))
            turns.append(
                template.answer_turn("The request is handled.", GOLD_ANSWER if calls else GOLD_DECLINE)
            )
        return turns


def run_calls(
    calls: list[str],
    initial_config: dict[str, Any],
    involved_classes: list[str],
    task_id: str,
    long_context: bool,
) -> list[str]:
    """Execute ``calls`` in order on fresh backends (isolated, cleaned up); one result each. Unbounded time (a call
    such as ``power(base=9, exponent=387420489)`` runs for minutes): ``BfclEnv`` runs it in its call worker."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    import_bfcl()
    with _Globals() as name:
        results, _ = execute_multi_turn_func_call(
            calls, initial_config, involved_classes, name, task_id, long_context=long_context
        )
    return [str(r) for r in results]


def check_episode(
    decoded: list[list[list[str]]], ground_truth: list[list[str]], entry: dict[str, Any]
) -> float:
    """BFCL's multi-turn checker on an episode's calls (per user turn, per response): 1.0 if valid, else 0.0.
    Unbounded time: ``BfclEnv.score`` runs it in a grading worker."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    import_bfcl()
    with _Globals() as name:
        try:
            result = multi_turn_checker(decoded, ground_truth, entry, entry["id"].rsplit("_", 1)[0], name)
        except Exception:  # noqa: BLE001 - the checker asserts on malformed runs: a failed check, never a crash
            return 0.0
    return 1.0 if result.get("valid") else 0.0


def _check_arguments(call: ToolCall) -> str | None:
    """An error observation if ``call`` has arguments the function does not take or non-literal values
    (BFCL's executor ``eval``s the canonical call text, so only values whose ``repr`` reads back are allowed)."""
    spec = tool_spec(call.tool)
    unknown = [k for k in call.arguments if k not in spec.parameters]
    if unknown:
        return f"Error: function '{call.tool}' got unknown argument(s) {', '.join(map(str, unknown))}."
    for k, v in call.arguments.items():
        try:
            if ast.literal_eval(repr(v)) != v:
                raise ValueError(k)
        except (ValueError, SyntaxError, TypeError, RecursionError):
            return f"Error: function '{call.tool}': the value of '{k}' is not a literal."
    return None


def task_prompt(task: BfclTask) -> Prompt:
    """The prompt of a task: its first user message, category as the source."""
    return Prompt(task.task_id, task.user_turns[0], None, source=f"bfcl-{task.category}")


def _interleave(tasks: Sequence[BfclTask]) -> list[BfclTask]:
    """Round-robin over categories (each in its seeded order), so any first N mixes the categories."""
    by_cat: dict[str, list[BfclTask]] = {}
    for t in tasks:
        by_cat.setdefault(t.category, []).append(t)
    out: list[BfclTask] = []
    queues = list(by_cat.values())
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out
