"""The Python tool's sandbox against real attacks: each is an observation, and the sandbox keeps serving."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tracerl.envs.sandbox import Sandbox, SandboxConfig
from tracerl.envs.sandbox_child import wait_exit

# A uid range of this test process's own: other processes' sandbox calls (the default range) are not its leftovers.
UID_BASE = 1_000_000 + 65536 * (os.getpid() % 4096)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(
        SandboxConfig(
            timeout_s=2.0, cpu_s=2, memory_mb=256, max_output_chars=300, max_file_mb=2, uid_base=UID_BASE
        )
    )


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
def test_attack_becomes_an_observation_and_the_sandbox_keeps_serving(
    sandbox: Sandbox, name: str, code: str, expected: str
) -> None:
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
    assert (
        sandbox.run("import sys; print('partial'); sys.exit(3)").observation()
        == "partial\nError: exit code 3"
    )


# Prints what the call could do with each path that exists for it: "listed", "read" or the OSError's name.
PROBE = """
import json, os
out = {}
for path in PATHS:
    try:
        out[path] = "listed" if os.path.isdir(path) and os.listdir(path) is not None else (open(path).read(1), "read")[1]
    except FileNotFoundError:
        continue
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


def test_a_call_reads_only_the_interpreter_its_libraries_and_scratch(sandbox: Sandbox) -> None:
    if not sandbox.protections["limited_reads"]:
        pytest.skip("no working bubblewrap on this machine (see Sandbox.warnings)")
    secret = [
        str(ROOT / "README.md"),
        str(ROOT / "pyproject.toml"),
        str(ROOT / "envs" / "sandbox.py"),
        str(ROOT),
        "/work",
        "/etc/passwd",
        "/etc/hostname",
        "/root",
        str(Path.home()),
        "/home",
    ]
    result = sandbox.run(f"PATHS = {secret!r}\n{PROBE}")
    assert json.loads(result.stdout) == {}  # none of them exists in the call's filesystem
    compute = (
        "import math, json, fractions, re, decimal\nopen('note.txt', 'w').write('kept')\n"
        "print(math.comb(10, 3), json.dumps(re.findall(r'\\d+', 'a1b22')), fractions.Fraction(1, 3) * 3,\n"
        "      decimal.Decimal('0.1') * 3, open('note.txt').read())"
    )
    assert sandbox.run(compute).observation() == '120 ["1", "22"] 1 0.3 kept'


def test_a_venv_inside_a_project_exposes_its_libraries_not_the_project() -> None:
    if shutil.which("bwrap") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs bubblewrap and /usr/bin/python3")
    project = Path(
        tempfile.mkdtemp(prefix="tracerl-project-", dir="/tmp")
    )  # /tmp: traversable by the call's uid
    try:
        project.chmod(0o755)
        (project / "README.md").write_text("project readme")
        (project / "src" / "projpkg").mkdir(parents=True)
        (project / "src" / "projpkg" / "__init__.py").write_text("SECRET = 1\n")
        venv = project / ".venv"
        made = subprocess.run(
            ["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], capture_output=True
        )
        if made.returncode != 0:
            pytest.skip(f"cannot make a venv from /usr/bin/python3: {made.stderr.decode()[-200:]}")
        (site,) = venv.glob("lib/python*/site-packages")
        (site / "venvmod.py").write_text("VALUE = 7\n")
        (site / "editable.pth").write_text(
            str(project / "src") + "\n"
        )  # as an editable install adds the project
        sandbox = Sandbox(SandboxConfig(python=str(venv / "bin" / "python"), uid_base=UID_BASE))
        if not sandbox.protections["limited_reads"]:
            pytest.skip(f"bubblewrap cannot run the venv here: {sandbox.warnings}")
        assert sandbox.view is not None
        assert not [
            b for b in sandbox.view.binds if str(project).startswith(b.rstrip("/") + "/") or b == str(project)
        ]
        code = (
            "import os, venvmod\ntry:\n    import projpkg\nexcept ImportError as exc:\n    print(type(exc).__name__)\n"
            f"print(venvmod.VALUE, os.listdir({str(project)!r}), os.path.exists({str(project / 'README.md')!r}))"
        )
        assert sandbox.run(code).observation() == "ModuleNotFoundError\n7 ['.venv'] False"
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_an_interpreter_bubblewrap_cannot_run_is_named_in_the_warnings() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    sandbox = Sandbox(SandboxConfig(python="/nonexistent/python3"))
    assert sandbox.bwrap is None and not sandbox.protections["limited_reads"]
    assert any(
        "could not run the sandbox's interpreter '/nonexistent/python3'" in w for w in sandbox.warnings
    ), sandbox.warnings


def test_wait_exit_returns_the_code_or_none_while_the_child_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_exit(done, 30.0) == 3
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_exit(slow, 0.1) is None
        assert slow.poll() is None  # still running: the caller decides (the sandbox kills its group)
    finally:
        slow.kill()
        slow.wait()
    assert slow.returncode == -9

    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)  # an old kernel: Popen.wait's polling instead
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    assert wait_exit(done, 30.0) == 4
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_exit(slow, 0.1) is None
    finally:
        slow.kill()
        slow.wait()


# The limits and ids a call runs under, as the call itself sees them.
LIMITS_PROBE = """
import json, os
names = ("Max cpu time", "Max address space", "Max file size", "Max open files", "Max core file size", "Max processes")
got = {}
for line in open("/proc/self/limits"):
    for name in names:
        if line.startswith(name):
            got[name] = line[len(name):].split()[:2]
print(json.dumps([got, os.getuid(), os.getgid(), os.getgroups()]))
"""


@pytest.mark.parametrize("launcher", ["util-linux", "python"])
def test_each_launcher_sets_the_same_limits_and_uid(sandbox: Sandbox, launcher: str) -> None:
    """util-linux's prlimit and setpriv, and the Python fallback launcher, set up a call alike."""
    if launcher == "util-linux" and sandbox.launch_tools is None:
        pytest.skip("no prlimit or setpriv on this machine")
    other = Sandbox(sandbox.cfg)
    if launcher == "python":
        other.launch_tools = None
    result = other.run(LIMITS_PROBE)
    assert result.ok, result.observation()
    limits, uid, gid, groups = json.loads(result.stdout)
    cfg, mb = sandbox.cfg, 1024 * 1024
    expected = {
        "Max cpu time": [str(cfg.cpu_s)] * 2,
        "Max address space": [str(cfg.memory_mb * mb)] * 2,
        "Max file size": [str(cfg.max_file_mb * mb)] * 2,
        "Max open files": [str(cfg.max_open_files)] * 2,
        "Max core file size": ["0", "0"],
    }
    if os.geteuid() == 0:
        expected["Max processes"] = [str(cfg.max_processes)] * 2
        assert cfg.uid_base <= uid < cfg.uid_base + 65536 and gid == uid and groups == []
    assert {k: v for k, v in limits.items() if k in expected} == expected
    assert other.run("1/0").observation() == "Error: ZeroDivisionError: division by zero"


def test_cells_carry_any_text_and_a_traceback_names_the_cell_frames(sandbox: Sandbox) -> None:
    result = sandbox.run_cells(["s = 'caf\u00e9 \u2211 \\x00'", "print(len(s), s)"])
    assert result.observation() == "8 caf\u00e9 \u2211 \x00", result.observation()
    surrogate = sandbox.run("s = '\ud800'")  # a lone surrogate reaches the runner, and Python refuses it
    assert surrogate.observation().startswith(
        "Error: UnicodeEncodeError: 'utf-8' codec can't encode character"
    )
    failed = sandbox.run("def f():\n    return 1 / 0\nf()")
    assert failed.stderr.startswith("Traceback (most recent call last):\n"), failed.stderr
    assert 'File "<cell>", line 3, in <module>' in failed.stderr and "runner" not in failed.stderr


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no-pidfd"])
def test_a_process_a_call_left_behind_is_killed(
    sandbox: Sandbox, pidfds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without bubblewrap's PID namespace a daemon the cell started outlives it: killed by uid, with or without pidfds."""
    if os.geteuid() != 0:
        pytest.skip("calls run as a uid of their own only when started as root")
    if not pidfds:
        monkeypatch.setattr(os, "pidfd_open", lambda pid: (_ for _ in ()).throw(OSError(38, "no pidfd")))
    plain = Sandbox(dataclasses.replace(sandbox.cfg, use_bwrap=False))
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('started')"
    result = plain.run(daemon)
    assert result.stdout.startswith("started") and "1 process" in result.observation(), result.observation()
    assert leftover_uids(sandbox.cfg.uid_base) == set()


def test_a_call_reports_the_cpu_of_its_sandboxed_interpreter(sandbox: Sandbox) -> None:
    """Not in this process's rusage (bubblewrap's reaper is not our child): the runner reports it."""
    short, busy = sandbox.run("x = 1"), sandbox.run("sum(range(3 * 10**6))")
    assert busy.cpu_s > short.cpu_s > 0
    assert sandbox.run("while True: pass").cpu_s == 0.0  # killed: no report
