"""The math environment: one ``python`` tool in the sandbox, reward by math-verify.

[choice] State across tool calls is offered notebook-style and rebuilt by deterministic replay: the
state is the tuple of cells run so far, and each call re-runs earlier cells (output discarded) in a
fresh sandboxed process before the new one. Forking at a prefix re-uses the prefix's tuple; its cost
shows in the ledger as replayed calls.

[choice] All-or-nothing: a cell joins the state only if it finished normally (``ExecResult.completed``: it
returned or raised an ordinary Python exception, within the limits, leaving no thread, process or timer running; see
envs/sandbox.py). A cell that timed out, was killed, crashed, hit a limit or left something running is dropped, and its
observation ends with ``DISCARDED`` so the model knows; later calls (and forks after it) start from the state
before it. A cell that raised, e.g. ``NameError``, is kept with REPL semantics: its statements before the error ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracerl.engine.gold import gold_turn_texts, no_gold
from tracerl.engine.protocol import ToolEnv, ToolResult
from tracerl.engine.react import Action, ToolSpec
from tracerl.envs.math.config import MathEnvConfig
from tracerl.envs.math.datasets import load_math_file
from tracerl.envs.math.reward import PRELOAD, is_correct
from tracerl.envs.math.tasks import generate
from tracerl.envs.sandbox import Sandbox, SandboxConfig
from tracerl.grading import Grader
from tracerl.types import Prompt

DISCARDED = "[This cell did not finish normally; its state was discarded: later calls run without it.]"
PYTHON = ToolSpec(
    "python",
    "Run Python code in a fresh sandbox and return what it prints. Earlier cells are re-run first.",
    ("code",),
)


class MathEnv(ToolEnv):
    config = MathEnvConfig
    fork_mode = "replay"
    tools: Sequence[ToolSpec] = (PYTHON,)

    def __init__(
        self, sandbox: SandboxConfig | None = None, stateful: bool = True, reward_timeout_s: float = 10.0
    ) -> None:
        self.sandbox = Sandbox(sandbox or SandboxConfig())
        self.grader = Grader(reward_timeout_s, PRELOAD)
        """math-verify's worker (started on the first answer exact match cannot settle)."""
        self.stateful = stateful
        self.task_cfg: Any = None
        """The env.math section this instance was built from (gold turns regenerate its tasks)."""
        self._tasks: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, env_cfg: Any, services: Mapping[str, Any] | None = None) -> MathEnv:
        m = env_cfg.settings(MathEnvConfig)
        env = cls(m.sandbox, stateful=m.stateful_python, reward_timeout_s=env_cfg.reward_timeout_s)
        env.task_cfg = m
        return env

    def gold_turns(self, prompt: Prompt, template: Any) -> list[str]:
        """The reference solution of a generated task (its code cells, then the answer) in ``template``'s format.

        Raises:
            ValueError: the prompt is not one of the configured generated tasks (task files have no reference steps).
        """
        m = self.task_cfg
        if self._tasks is None:
            self._tasks = (
                {}
                if m is None or m.tasks != "generated"
                else {
                    t.question: t
                    for held in (False, True)
                    for t in generate(
                        m.eval_tasks if held else m.num_tasks,
                        seed=m.task_seed,
                        held_out=held,
                        levels=tuple(m.levels),
                    )
                }
            )
        task = self._tasks.get(prompt.text)
        if task is None:
            raise no_gold(prompt.prompt_id, "generated math tasks of this config (env.math.tasks=generated)")
        calls = [(s.thought, "python", {"code": s.code}) for s in task.steps]
        return gold_turn_texts(template, calls, task.final_thought, task.answer)

    @staticmethod
    def prompts(env_cfg: Any, held_out: bool = False) -> list[Prompt]:
        """Training prompts, or held-out ones: generated (a hash split keeps them apart) or a task file's first N."""
        m = env_cfg.settings(MathEnvConfig)
        if m.tasks == "generated":
            tasks = generate(
                m.eval_tasks if held_out else m.num_tasks,
                seed=m.task_seed,
                held_out=held_out,
                levels=tuple(m.levels),
            )
            return [Prompt(t.task_id, t.question, t.answer, source=f"generated-L{t.level}") for t in tasks]
        prompts = load_math_file(m.tasks)
        return prompts[: m.eval_tasks] if held_out else prompts[: m.num_tasks]

    @staticmethod
    def check_data(env_cfg: Any) -> None:
        """Read the task file (if one is configured) so a bad one fails before anything starts (``tracerl.envs.files``)."""
        m = env_cfg.settings(MathEnvConfig)
        if m.tasks != "generated":
            load_math_file(m.tasks)

    @property
    def warnings(self) -> list[str]:
        """Sandbox protections this machine does not enforce."""
        return list(self.sandbox.warnings)

    def initial_state(self, prompt: Prompt) -> tuple[str, ...]:
        return ()

    def execute(self, prompt: Prompt, state: tuple[str, ...], action: Action) -> ToolResult:
        code = str(action.arguments.get("code", ""))
        cells = (*state, code) if self.stateful else (code,)
        result = self.sandbox.run_cells(cells)
        if not self.stateful:
            return ToolResult(result.observation(), (), timed_out=result.timed_out)
        if not result.completed:
            return ToolResult(
                f"{result.observation()}\n{DISCARDED}",
                state,
                calls=1,
                replayed=len(cells) - 1,
                timed_out=result.timed_out,
            )
        return ToolResult(result.observation(), cells, calls=1, replayed=len(cells) - 1)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        """1.0 for a correct answer. Raises ``GradeTimeout`` past ``env.reward_timeout_s`` (the engine scores it 0)."""
        return 1.0 if prompt.answer is not None and is_correct(prompt.answer, answer, self.grader) else 0.0
