"""The command lines of infra/README.md's "Run on your cluster", as tests/test_cluster.py runs them: read from the
fenced block between ``BEGIN`` and ``END``, the README's addresses and paths swapped for the test cluster's, so the
documentation and the test cannot drift (issue 43, item 5)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "infra" / "README.md"
BEGIN, END = "<!-- cluster-steps:begin -->", "<!-- cluster-steps:end -->"

JOBS = "http://127.0.0.1:8265"
"""The README's job API address (a port-forward of the head's dashboard)."""
MLFLOW = "http://127.0.0.1:5000"
"""The README's MLflow address as the client reaches it (a port-forward)."""
SHARED = "/shared"
"""The README's filesystem that every node and the client see."""
RUN_ID = "RUN_ID"
"""Where the README puts the run id the job's log printed."""


def lines(readme: Path = README) -> list[str]:
    """The block's command lines (comments and blank lines left out)."""
    text = readme.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{readme} needs one {BEGIN} ... {END} block"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    assert block[0].startswith("```") and block[-1] == "```", "the steps are one fenced code block"
    return [ln for ln in block[1:-1] if ln.strip() and not ln.lstrip().startswith("#")]


def substitute(line: str, subs: Mapping[str, str]) -> str:
    """``line`` with each README address or path of ``subs`` replaced by the test's."""
    for old, new in subs.items():
        line = line.replace(old, new)
    return line


@dataclass
class Steps:
    """Runs the README's lines one after another in ``cwd`` with ``env``: ``export NAME=VALUE`` sets the variable
    for the lines after it; any other line runs as a command (the README's lines hold no pipes or redirections)."""

    subs: dict[str, str]
    env: dict[str, str]
    cwd: Path
    timeout_s: float
    ran: list[tuple[list[str], subprocess.CompletedProcess[str]]] = field(default_factory=list)

    def run(self, line: str, after: Callable[[subprocess.CompletedProcess[str]], None] | None = None) -> None:
        argv = shlex.split(substitute(line, self.subs))
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = os.path.expandvars(value)
            return
        res = subprocess.run(
            argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=self.timeout_s
        )
        self.ran.append((argv, res))
        assert res.returncode == 0, (
            f"{shlex.join(argv)} exited {res.returncode}:\n{(res.stdout + res.stderr)[-4000:]}"
        )
        if after is not None:
            after(res)
