"""The launcher finds the server the environment names, and builds the stub environment offline."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dsa_backend.serving import install


def _fake_server(root: Path, stub: bool = True) -> Path:
    """A server tree in the nvidia-pytriton wheel's layout (what .device/setup.sh unpacks)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").write_text("")
    (root / "backends" / "python").mkdir(parents=True)
    stubs = root / "python_backend_stubs" / install._PYVER
    stubs.mkdir(parents=True)
    (stubs / "triton_python_backend_stub").write_text("stub")
    if stub:
        (root / "backends" / "python" / "triton_python_backend_stub").write_text("stub")
    return root


def _recording_run(runs: list):
    def run(cmd, check):
        runs.append(cmd)
        if "--target" in cmd:                        # what pip would leave behind
            Path(cmd[cmd.index("--target") + 1]).mkdir(parents=True)
    return run


@pytest.fixture
def no_stub_env(monkeypatch):
    monkeypatch.setattr(install, "_needs_stub_env", lambda: False)


def test_tritonserver_env_var_wins_and_backends_default_beside_it(tmp_path, monkeypatch, no_stub_env):
    root = _fake_server(tmp_path / "ts")
    monkeypatch.setenv("TRITONSERVER", str(root / "bin" / "tritonserver"))
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    server = install.find_server()
    assert server.binary == root / "bin" / "tritonserver"
    assert server.backend_dir == root / "backends"


def test_triton_backend_dir_env_var_is_used(tmp_path, monkeypatch, no_stub_env):
    root = _fake_server(tmp_path / "ts")
    other = _fake_server(tmp_path / "other") / "backends"
    monkeypatch.setenv("TRITONSERVER", str(root / "bin" / "tritonserver"))
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(other))
    assert install.find_server().backend_dir == other


def test_env_vars_naming_nothing_fail_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONSERVER", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="TRITONSERVER"):
        install.find_server()
    root = _fake_server(tmp_path / "ts")
    monkeypatch.setenv("TRITONSERVER", str(root / "bin" / "tritonserver"))
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="TRITON_BACKEND_DIR"):
        install.find_server()


def test_install_copies_the_stub_into_the_env_servers_backends(tmp_path, monkeypatch, no_stub_env):
    root = _fake_server(tmp_path / "ts", stub=False)
    monkeypatch.setenv("TRITONSERVER", str(root / "bin" / "tritonserver"))
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    with pytest.raises(RuntimeError, match="stub"):
        install.find_server()
    server = install.install()
    assert (server.backend_dir / "python" / "triton_python_backend_stub").read_text() == "stub"


@pytest.mark.parametrize("from_env", [False, True])
def test_stub_env_numpy_comes_from_a_wheel_dir_without_an_index(tmp_path, monkeypatch, from_env):
    runs = []
    monkeypatch.setattr(install, "STUB_ENV", tmp_path / "stub-env")
    monkeypatch.setattr(subprocess, "run", _recording_run(runs))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    if from_env:
        root = _fake_server(tmp_path / "ts")
        monkeypatch.setenv("TRITONSERVER", str(root / "bin" / "tritonserver"))
        monkeypatch.setenv("DSA_STUB_WHEELS", str(wheels))
        monkeypatch.setattr(install, "_needs_stub_env", lambda: True)
        monkeypatch.setattr(install, "find_server", lambda: None)
        install.install()
    else:
        install._build_stub_env(wheels)
    [venv, pip] = runs
    assert venv[-1] == str(tmp_path / "stub-env")
    assert pip[pip.index("--find-links") + 1] == str(wheels) and "--no-index" in pip
    assert pip[pip.index("--target") + 1].startswith(str(tmp_path / "stub-env"))
    assert pip[-1] == "numpy<2"


def test_stub_env_numpy_comes_from_the_index_by_default(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setattr(install, "STUB_ENV", tmp_path / "stub-env")
    monkeypatch.setattr(subprocess, "run", _recording_run(runs))
    install._build_stub_env()
    assert "--no-index" not in runs[-1] and "--find-links" not in runs[-1]
