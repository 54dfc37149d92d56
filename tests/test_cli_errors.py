"""The CLI's one user-error wrapper: every command lets user errors through to ``main``, which prints one line
and exits 2; a bug keeps its traceback; TRACERL_DEBUG shows the traceback of a user error too."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tracerl.workflows.cli import app as cli
from tracerl.workflows.tracking import model_registry as registry


def _fails_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def fake_register(*args: object, **kwargs: object) -> None:  # a fake register that fails as told
        raise exc

    monkeypatch.setattr(registry, "register", fake_register)


ARGS = ["register", "RUN", "--name", "m", "--tracking-uri", "sqlite:////tmp/never-used.db"]


def _exit_and_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: BaseException
) -> tuple[int, str]:
    """What ``main`` returns and writes to stderr when the command fails with ``exc`` (TRACERL_DEBUG unset)."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    _fails_with(monkeypatch, exc)
    code = cli.main(ARGS)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (OSError(errno.EACCES, "Permission denied"), "tracerl: [Errno 13] Permission denied"),
        (FileNotFoundError("no checkpoint in /runs/x"), "tracerl: no checkpoint in /runs/x"),
        (LookupError("run RUN not found in\n  the store"), "tracerl: run RUN not found in the store"),
        (ValueError("bad --alias 'x y'"), "tracerl: bad --alias 'x y'"),
    ],
)
def test_a_user_error_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: BaseException, line: str
) -> None:
    assert _exit_and_stderr(monkeypatch, capsys, exc) == (2, line + "\n")


@pytest.mark.parametrize(
    ("exc", "path"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/mlruns.db"), "/data/mlruns.db"),
        (RuntimeError("Training failed: OSError: [Errno 122] Disk quota exceeded: '/q/runs/x'"), "/q/runs/x"),
    ],
)
def test_a_full_disk_is_one_line_and_exit_28(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: BaseException, path: str
) -> None:
    line = f"tracerl: no space left on device at {path}: free space or point out_dir/tracking.uri elsewhere\n"
    assert _exit_and_stderr(monkeypatch, capsys, exc) == (28, line)


def test_a_job_api_error_and_a_setup_error_are_user_errors() -> None:
    from tracerl.models.hf import SetupError
    from tracerl.workflows.ops.submit import JobAPIError

    assert issubclass(SetupError, cli.user_errors())
    assert issubclass(JobAPIError, cli.user_errors())
    assert not issubclass(RuntimeError, cli.user_errors())  # a bug keeps its traceback


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    _fails_with(monkeypatch, RuntimeError("bug"))
    with pytest.raises(RuntimeError, match="bug"):
        cli.main(ARGS)


def test_debug_env_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    _fails_with(monkeypatch, FileNotFoundError("gone"))
    with pytest.raises(FileNotFoundError, match="gone"):
        cli.main(ARGS)


def test_a_missing_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert cli.main(["train", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err
