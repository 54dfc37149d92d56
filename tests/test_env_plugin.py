"""Plug-in environments: their own config section (module:attr, registered, entry point), the walk-through of
docs/design.md run as written, closed choices, and runs saved before the schemas moved."""

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tracerl.config import RolloutConfig, TrainConfig
from tracerl.config_loader import ConfigError, compose, conf_dir, to_yaml
from tracerl.envs.base import Action, Prompt, ToolEnv, ToolResult, ToolSpec
from tracerl.envs.registry import ENVS, env_class
from tracerl.schema import check

ROLLOUT = conf_dir() / "rollout/math.yaml"
LEGACY = ROOT / "tests/data/legacy"


@dataclass(frozen=True)
class EchoConfig:
    """env.FakeEchoEnv: a fake environment's own section."""

    word: str = "hello"
    repeats: int = 1

    def __post_init__(self) -> None:
        check(self.repeats >= 1, f"env.echo.repeats must be >= 1 (got {self.repeats})")


class FakeEchoEnv(ToolEnv):
    """A fake tool environment: the reward is 1 for answering its configured word, repeated."""

    config = EchoConfig
    tools = (ToolSpec("echo", "Echo the argument.", ("text",)),)

    def __init__(self, cfg: EchoConfig) -> None:
        self.cfg = cfg

    @classmethod
    def from_config(cls, env_cfg, services=None):  # type: ignore[no-untyped-def]
        return cls(env_cfg.settings(EchoConfig))

    @staticmethod
    def prompts(env_cfg, held_out=False):  # type: ignore[no-untyped-def]
        return [Prompt("echo-0", "Say the word.", None)]

    def execute(self, prompt: Prompt, state: object, action: Action) -> ToolResult:
        return ToolResult(str(action.arguments.get("text", "")), state)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        return 1.0 if answer == " ".join([self.cfg.word] * self.cfg.repeats) else 0.0


def _last_line(code: str, *path: Path) -> str:
    """The last line ``code`` prints in a fresh interpreter that sees ``path``, the platform and the repository
    root only (no installed plug-in of this environment); it must exit 0."""
    pythonpath = ":".join(str(p) for p in (*path, ROOT / "platform", ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_module_attr_environment_brings_its_own_config_section(tmp_path: Path) -> None:
    yaml = tmp_path / "echo.yaml"
    yaml.write_text(
        f"defaults: {{model: tiny, sampler: hf, allocator: trace, budget: lm_small, predictor: learned_text}}\n"
        f"env:\n  name: {__name__}:FakeEchoEnv\n  FakeEchoEnv:\n    word: tree\n"
    )
    cfg = compose(RolloutConfig, yaml, ["env.FakeEchoEnv.repeats=2"])
    env = env_class(cfg.env.name).from_config(cfg.env)
    assert isinstance(env, FakeEchoEnv) and env.cfg == EchoConfig(word="tree", repeats=2)
    assert (env.reward(Prompt("p"), "tree tree"), env.reward(Prompt("p"), "tree")) == (1.0, 0.0)
    assert "FakeEchoEnv:\n    word: tree\n    repeats: 2" in to_yaml(cfg)  # saved with the run, same spelling
    with pytest.raises(
        ConfigError, match=re.escape("unknown config key 'env.FakeEchoEnv.wurd'; allowed under")
    ):
        compose(RolloutConfig, yaml, ["env.FakeEchoEnv.wurd=x"])
    with pytest.raises(ConfigError, match=re.escape("env.echo.repeats must be >= 1 (got 0)")):
        compose(RolloutConfig, yaml, ["env.FakeEchoEnv.repeats=0"])
    with pytest.raises(
        ConfigError, match=r"unknown config key 'env.nope'; allowed under 'env': name, reward_timeout_s"
    ):
        compose(RolloutConfig, yaml, ["env.nope.word=x"])


def test_a_registered_environment_is_chosen_by_name_with_its_section() -> None:
    if "fake_echo" not in ENVS:
        ENVS.add("fake_echo", FakeEchoEnv)
    cfg = compose(RolloutConfig, ROLLOUT, ["env.name=fake_echo", "env.fake_echo.word=hi"])
    assert cfg.env.settings(EchoConfig).word == "hi"
    assert env_class("fake_echo").from_config(cfg.env).reward(Prompt("p"), "hi") == 1.0


def test_an_entry_point_of_tracerl_envs_registers_an_environment(tmp_path: Path) -> None:
    """A real distribution's metadata (a dist-info with entry_points.txt) on sys.path, read by importlib.metadata."""
    (tmp_path / "toy_env_pkg.py").write_text(
        textwrap.dedent(
            """
            from tracerl.envs.base import ToolEnv, ToolResult

            class ToyEnv(ToolEnv):
                def execute(self, prompt, state, action):
                    return ToolResult("ok", state)

                def reward(self, prompt, answer):
                    return 1.0 if answer == "toy" else 0.0

                @classmethod
                def from_config(cls, env_cfg, services=None):
                    return cls()
            """
        )
    )
    dist = tmp_path / "toy_env_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-env-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tracerl.envs]\ntoy_ep = toy_env_pkg:ToyEnv\n")
    code = (
        "from tracerl.envs.registry import env_class, known_envs\n"
        "from tracerl.config import RolloutConfig\n"
        "from tracerl.config_loader import compose, conf_dir\n"
        "from tracerl.types import Prompt\n"
        "assert 'toy_ep' in known_envs()\n"
        "cfg = compose(RolloutConfig, conf_dir() / 'rollout/math.yaml', ['env.name=toy_ep'])\n"
        "env = env_class(cfg.env.name).from_config(cfg.env)\n"
        "print(type(env).__name__, env.reward(Prompt('p'), 'toy'))\n"
    )
    assert _last_line(code, tmp_path) == "ToyEnv 1.0"


def test_the_adding_an_environment_walk_through_runs_as_written() -> None:
    text = (ROOT / "docs/design.md").read_text()
    section = text.split("## Adding an environment", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    assert _last_line("\n".join(blocks)) == "guess reward 1.0"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "loss.importance_sampling=true",
            "loss.importance_sampling must be one of 'auto', 'on', 'off' (got True)",
        ),
        ("env.search.reward=on", "env.search.reward must be one of 'em', 'f1' (got 'on')"),
        (
            "optim.schedule=Cosine",
            "optim.schedule must be one of 'constant', 'cosine', 'linear' (got 'Cosine')",
        ),
        (
            "predictor.features=yes",
            "predictor.features must be one of 'numeric', 'hashed', 'policy' (got 'yes')",
        ),
    ],
)
def test_closed_choices_name_the_key_the_value_and_the_allowed_values(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(TrainConfig, conf_dir() / "train/search_smoke.yaml", [override])


def test_closed_choices_are_checked_when_built_in_python_too() -> None:
    from tracerl.algos.config import LossConfig
    from tracerl.envs.bfcl.config import BfclEnvConfig

    with pytest.raises(ValueError, match=re.escape("loss.aggregation must be one of 'token_mean'")):
        LossConfig(aggregation="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("env.bfcl.categories must be one of 'base'")):
        BfclEnvConfig(categories=["base", "parallel"])  # type: ignore[list-item]


@pytest.mark.parametrize("name", ["train_smoke_config.yaml", "train_search_smoke_config.yaml"])
def test_a_run_saved_before_the_schemas_moved_resumes_from_its_config(name: str, tmp_path: Path) -> None:
    """The saved config.yaml of a run from before this change (every built-in env section in it) composes as
    ``train`` composes it on resume, with the same values, and saves back in the current format."""
    saved = LEGACY / name
    cfg = compose(TrainConfig, saved, ["resume=0123abcd", "steps=3"])
    assert (cfg.resume, cfg.steps, cfg.run_name) == ("0123abcd", 3, "trace-s0-20250101-000000")
    chosen = cfg.env.sections()[cfg.env.name]
    assert chosen.num_tasks == 64 and chosen.eval_tasks == 24
    assert set(cfg.env.sections()) == {"simulator", "math", "search", "bfcl"}
    again = tmp_path / "config.yaml"
    again.write_text(to_yaml(cfg))
    assert compose(TrainConfig, again) == cfg
