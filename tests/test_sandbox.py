"""The Python tool's sandbox against real attacks: each is an observation, and the sandbox keeps serving."""

import os
from pathlib import Path

import pytest

from envs.sandbox import Sandbox
from tracerl.config import SandboxConfig

# A uid range of this test process's own: other processes' sandbox calls (the default range) are not its leftovers.
UID_BASE = 1_000_000 + 65536 * (os.getpid() % 4096)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=2.0, cpu_s=2, memory_mb=256, max_output_chars=300, max_file_mb=2, uid_base=UID_BASE))


def leftover_uids(base: int) -> set[int]:
    """Uids in the sandbox range that still own a live (non-zombie) process."""
    uids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if base <= uid < base + 65536 and state != "Z":
            uids.add(uid)
    return uids


ATTACKS = [
    ("infinite loop", "while True: pass", "timed out after"),
    ("memory bomb", "x = bytearray(10**10)", "MemoryError"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "Error:"),
    ("write outside scratch", "open('/etc/tracerl-evil', 'w').write('x')", "Error:"),
    ("write to our home", f"open('{Path.home()}/tracerl-evil', 'w').write('x')", "Error:"),
    ("network", "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", "Error:"),
    ("output flood", "while True:\n    print('flood' * 1000)", "[output truncated]"),
    ("crash", "import ctypes\nctypes.string_at(0)", "Error:"),
]


def test_reports_what_it_enforces(sandbox: Sandbox) -> None:
    assert sandbox.protections["rlimits"]
    assert len(sandbox.warnings) == sum(not v for v in sandbox.protections.values())
    if os.geteuid() == 0:
        assert sandbox.protections["unprivileged_user"] and sandbox.protections["network_isolated"]


@pytest.mark.parametrize(("name", "code", "expected"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_becomes_an_observation_and_the_sandbox_keeps_serving(sandbox: Sandbox, name: str, code: str, expected: str) -> None:
    if name == "network" and not sandbox.protections["network_isolated"]:
        pytest.skip("network isolation is not available on this machine (see Sandbox.warnings)")
    result = sandbox.run(code)
    obs = result.observation()
    assert expected in obs, obs
    assert not result.ok
    assert len(obs) < 600  # bounded, whatever the code printed
    assert sandbox.run("print(6 * 7)").observation() == "42"
    assert not Path("/etc/tracerl-evil").exists() and not (Path.home() / "tracerl-evil").exists()
    if os.geteuid() == 0:
        assert leftover_uids(sandbox.cfg.uid_base) == set()  # no process left behind


def test_state_is_rebuilt_by_replaying_cells(sandbox: Sandbox) -> None:
    result = sandbox.run_cells(["x = 40", "print('already shown')", "x += 2\nprint(x)"])
    assert result.ok and result.observation() == "42"


def test_errors_show_the_exception_line(sandbox: Sandbox) -> None:
    assert sandbox.run("1/0").observation() == "Error: ZeroDivisionError: division by zero"
    assert sandbox.run("import sys; print('partial'); sys.exit(3)").observation() == "partial\nError: exit code 3"
