"""The math environment's Python tool across calls: all-or-nothing cells in the replayed state (real sandbox).

A cell that did not finish normally (timeout, kill, crash, limit, leftover thread or process) is dropped from the
state and says so; every bad cell below first sets ``x = -1``, so a later ``42`` proves its effects were dropped.
"""

import dataclasses

import numpy as np
import pytest

from tests.fake_seeded import FakeSampler
from tracerl.algos.allocators import Expansion
from tracerl.config import SamplerConfig
from tracerl.engine.react import Action, ActionKind, PlainTemplate
from tracerl.engine.rollout import TreeRolloutEngine
from tracerl.envs.math.env import DISCARDED, MathEnv
from tracerl.envs.sandbox import SandboxConfig
from tracerl.models.tiny import build_tokenizer
from tracerl.samplers.base import Generation
from tracerl.types import Prompt

PROMPT = Prompt("p0", "What is 40 + 2?", "42")
BEFORE = ("x = 40",)

BAD_CELLS = [
    ("timeout", "import time\ntime.sleep(60)", "timed out after"),
    ("cpu loop", "while True: pass", "Error:"),
    ("crash", "import ctypes\nctypes.string_at(0)", "SIGSEGV"),
    ("memory limit", "y = bytearray(10**10)", "MemoryError"),
    ("output flood", "while True:\n    print('flood' * 1000)", "[output truncated]"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "Error:"),
    (
        "leftover thread",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()",
        "the cell left 1 thread running",
    ),
    (
        "leftover busy daemon thread",
        "import threading\ndef spin():\n    while True:\n        pass\n"
        "threading.Thread(target=spin, daemon=True).start()",
        "the cell left 1 thread running",
    ),
    (
        "leftover process",
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])",
        "the cell left 1 process running",
    ),
    ("pending timer", "import signal\nsignal.alarm(30)", "the cell left 1 timer running"),
    ("exit before the report", "import os\nos._exit(0)", "the process ended before the cell finished"),
    (
        "forged report",
        'open(\'.cell-status.json\', \'w\').write(\'{"status": "leftover", "threads": "x"}\')\n'
        "import os\nos._exit(0)",
        "the process ended before the cell finished",
    ),
]


@pytest.fixture(scope="module")
def env() -> MathEnv:
    return MathEnv(SandboxConfig(timeout_s=4.0, cpu_s=2, memory_mb=256, max_output_chars=300, max_file_mb=2))


def call(code: str) -> Action:
    return Action(ActionKind.TOOL, "", tool="python", arguments={"code": code})


@pytest.mark.parametrize(("name", "code", "expected"), BAD_CELLS, ids=[c[0] for c in BAD_CELLS])
def test_a_bad_cell_is_dropped_and_the_next_good_cell_works(
    env: MathEnv, name: str, code: str, expected: str
) -> None:
    bad = env.execute(PROMPT, BEFORE, call("x = -1\n" + code))
    assert expected in bad.observation and bad.observation.endswith("\n" + DISCARDED), bad.observation
    assert bad.state == BEFORE and bad.replayed == 1
    if name == "timeout":  # counted in the ledger (budget/tool_timeouts)
        assert bad.timed_out
    good = env.execute(PROMPT, bad.state, call("x += 2\nprint(x)"))
    assert good.observation == "42" and good.state == (*BEFORE, "x += 2\nprint(x)") and not good.timed_out


def test_forks_after_a_bad_cell_start_from_the_state_before_it(env: MathEnv) -> None:
    bad = env.execute(
        PROMPT,
        BEFORE,
        call("x = -1\nimport threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()"),
    )
    assert bad.state == BEFORE
    double = env.execute(PROMPT, bad.state, call("x *= 2\nprint(x)"))
    plus = env.execute(PROMPT, bad.state, call("x += 2\nprint(x)"))
    assert (double.observation, plus.observation) == ("80", "42")
    # each branch goes on from its own state; neither sees the other nor the bad cell
    assert env.execute(PROMPT, double.state, call("print(x)")).observation == "80"
    assert env.execute(PROMPT, plus.state, call("print(x)")).observation == "42"
    again = env.execute(PROMPT, plus.state, call("x = -1\nimport os\nos._exit(0)"))
    assert (
        again.state == plus.state
        and env.execute(PROMPT, again.state, call("print(x + 1)")).observation == "43"
    )


def test_a_cell_that_changes_directory_is_kept(env: MathEnv) -> None:
    moved = env.execute(PROMPT, BEFORE, call("import os\nos.chdir('/tmp')\nx += 1"))
    assert moved.observation == "(no output)" and moved.state == (
        *BEFORE,
        "import os\nos.chdir('/tmp')\nx += 1",
    )
    assert env.execute(PROMPT, moved.state, call("print(x, os.getcwd())")).observation == "41 /tmp"


def test_an_exception_keeps_the_statements_before_it(env: MathEnv) -> None:
    """[choice] REPL semantics: an ordinary exception finished the cell normally; what ran before it stays."""
    cell = "y = 5\nprint(undefined_name)\ny = 6"
    raised = env.execute(PROMPT, (), call(cell))
    assert raised.observation == "Error: NameError: name 'undefined_name' is not defined"
    assert raised.state == (cell,)
    assert env.execute(PROMPT, raised.state, call("print(y + 1)")).observation == "6"


def test_without_state_a_bad_cell_is_not_followed_by_a_note(env: MathEnv) -> None:
    stateless = MathEnv(env.sandbox.cfg, stateful=False)
    result = stateless.execute(PROMPT, (), call("import os\nos._exit(0)"))
    assert result.state == () and DISCARDED not in result.observation


@pytest.mark.parametrize("name", ["leftover thread", "leftover process", "exit before the report", "crash"])
def test_without_bubblewrap_bad_cells_are_dropped_too(env: MathEnv, name: str) -> None:
    """Without bubblewrap the runner finds leftover processes by the call's uid (as root) or session."""
    plain = MathEnv(dataclasses.replace(env.sandbox.cfg, use_bwrap=False))
    code, expected = next((c, e) for n, c, e in BAD_CELLS if n == name)
    bad = plain.execute(PROMPT, BEFORE, call("x = -1\n" + code))
    assert expected in bad.observation and bad.state == BEFORE, bad.observation
    assert plain.execute(PROMPT, bad.state, call("x += 2\nprint(x)")).observation == "42"


class StatefulScript(FakeSampler):
    """Fake sampler (the unit under test is the engine with the real environment): sets x, runs a cell that leaves
    a thread (after setting x = -1), adds 2, then answers with the first line of the last observation."""

    TURNS = (
        "x = 40",
        "x = -1; import threading, time; threading.Thread(target=time.sleep, args=(60,)).start()",
        "x += 2; print(x)",
    )

    def turn(self, context: list[int], seed: int, max_new_tokens: int) -> Generation:
        text = self.tok.decode(context)
        done = text.count("Observation:")
        if done < len(self.TURNS):
            turn = PlainTemplate().tool_turn("next step", "python", {"code": self.TURNS[done]})
        else:
            turn = PlainTemplate().answer_turn(
                "as computed", text.rsplit("Observation:", 1)[1].strip().splitlines()[0]
            )
        ids = self.tok(turn, add_special_tokens=False)["input_ids"][:max_new_tokens]
        return self.stopped(context, ids, [-0.1] * len(ids))


def test_engine_forks_after_a_bad_cell_continue_from_the_state_before_it(env: MathEnv) -> None:
    tokenizer = build_tokenizer([PROMPT.text, *StatefulScript.TURNS, DISCARDED], vocab_size=300)
    engine = TreeRolloutEngine(
        StatefulScript(tokenizer),
        env,
        PlainTemplate(),
        tokenizer,
        SamplerConfig(max_turn_tokens=200, max_episode_tokens=1200),
        seed=0,
    )
    (tree,) = engine.rollout([PROMPT], [1])
    assert tree.rewards().tolist() == [
        1.0
    ]  # the answer is the observation "42": the bad cell's x = -1 was dropped
    after_bad = tree.bare_prefixes()[1]  # the node after the second tool call, the bad cell
    assert DISCARDED in tokenizer.decode(tree.nodes[after_bad].token_ids)
    engine.expand([tree], [Expansion(np.array([after_bad]), np.array([2]), extra_bare=0)])
    assert tree.num_paths == 3 and tree.rewards().tolist() == [1.0, 1.0, 1.0]
