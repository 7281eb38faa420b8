"""Find a tritonserver with the python backend, and make the pip-installed one runnable.

Three servers are supported, first match wins:

- the one named by the environment: TRITONSERVER (the tritonserver binary) and, optionally,
  TRITON_BACKEND_DIR (its backends; default: backends/ beside the binary's bin/). This is how a
  server unpacked elsewhere is used, e.g. the slim one that .device/setup.sh unpacks on the GPU
  machine. TRITON_BACKEND_DIR alone overrides the backend directory of whichever server is found;
- the NGC tritonserver image's /opt/tritonserver;
- the server that the nvidia-pytriton wheel bundles (installed with `pip install --no-deps
  nvidia-pytriton`, since its own dependencies pin numpy < 2).

`python -m dsa_backend.serving.install [--wheel-dir DIR]` prepares the last one, or the
environment's:

- copies the python backend stub built for this interpreter's version into backends/python/
  (when the server ships stubs per Python version, as the wheel's layout does);
- builds a stub environment. The stub embeds the interpreter it finds as the first `python3` on
  PATH (it ignores PYTHONPATH), and this stub was built against NumPy 1.x: with NumPy 2 it
  corrupts every tensor it converts, strings included. So the launcher puts a small venv first on
  PATH whose own site-packages hold numpy < 2 and which then chains to this venv's packages.
  numpy < 2 comes from the package index, or, on a machine without internet, from a local
  directory of wheels: --wheel-dir DIR or DSA_STUB_WHEELS=DIR (pip --no-index --find-links DIR).
  It lives in <this venv>/triton-stub-env, or in DSA_STUB_ENV when set (at install and at start).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NGC_SERVER = Path("/opt/tritonserver")
# The stub environment; DSA_STUB_ENV moves it (e.g. where this interpreter's prefix is read-only).
STUB_ENV = Path(os.environ.get("DSA_STUB_ENV") or Path(sys.prefix) / "triton-stub-env")
# Environment variables: a server outside the usual places, and where numpy<2 wheels are offline.
ENV_SERVER = "TRITONSERVER"
ENV_BACKEND_DIR = "TRITON_BACKEND_DIR"
ENV_STUB_WHEELS = "DSA_STUB_WHEELS"
_PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"
_STUB = Path("python") / "triton_python_backend_stub"


@dataclass(frozen=True)
class ServerInstall:
    """How to run one tritonserver: the binary, its backends, and the environment it needs."""

    binary: Path
    backend_dir: Path
    path_prefix: tuple[Path, ...]      # put first on PATH: the stub takes its python3 from there
    library_path: tuple[Path, ...]     # for the stub's libpython


def find_server() -> ServerInstall:
    """The environment's server (TRITONSERVER) when set, else the NGC image's, else the wheel's."""
    venv_bin = Path(sys.executable).parent
    env_server = _env_server()
    if env_server is None and (NGC_SERVER / "bin" / "tritonserver").is_file():
        return ServerInstall(NGC_SERVER / "bin" / "tritonserver", _backend_dir(NGC_SERVER / "backends"),
                             (venv_bin,), ())
    if env_server is not None:
        binary, backend_dir = env_server
        setup = f"check {ENV_SERVER}/{ENV_BACKEND_DIR}, then run python -m dsa_backend.serving.install"
    else:
        root = _wheel_server_root()
        binary, backend_dir = root / "bin" / "tritonserver", _backend_dir(root / "backends")
        setup = "run `make install` (or python -m dsa_backend.serving.install)"
    if not (backend_dir / _STUB).is_file():
        raise RuntimeError(f"tritonserver {binary}: no python backend stub in {backend_dir / 'python'}: {setup}")
    if _needs_stub_env() and not (STUB_ENV / "bin" / "python3").exists():
        raise RuntimeError(f"tritonserver {binary}: numpy>=2 here and no stub environment in {STUB_ENV}: {setup}")
    prefix = (STUB_ENV / "bin", venv_bin) if _needs_stub_env() else (venv_bin,)
    return ServerInstall(binary, backend_dir, prefix, _libpython_dirs())


def install(wheel_dir: str | Path | None = None) -> ServerInstall:
    """Set up the bundled or the environment's server for this interpreter (no-op for the NGC image's).

    wheel_dir (default: $DSA_STUB_WHEELS): install the stub environment's numpy<2 from the wheels
    there, without an index (for machines without internet).
    """
    env_server = _env_server()
    if env_server is None and (NGC_SERVER / "bin" / "tritonserver").is_file():
        logger.info("using the NGC image's server in %s", NGC_SERVER)
        return find_server()
    if env_server is not None:
        binary, backend_dir = env_server
        logger.info("using %s=%s with backends in %s", ENV_SERVER, binary, backend_dir)
        # The wheel's layout, which the slim server keeps: stubs per Python version beside backends/.
        source = backend_dir.parent / "python_backend_stubs" / _PYVER / "triton_python_backend_stub"
        if not (backend_dir / _STUB).is_file() and source.is_file():
            _copy_stub(source, backend_dir / _STUB)
    else:
        root = _wheel_server_root()
        source = root / "python_backend_stubs" / _PYVER / "triton_python_backend_stub"
        if not source.is_file():
            raise RuntimeError(f"nvidia-pytriton has no python backend stub for Python {_PYVER}")
        _copy_stub(source, _backend_dir(root / "backends") / _STUB)
    if _needs_stub_env():
        _build_stub_env(wheel_dir if wheel_dir is not None else os.environ.get(ENV_STUB_WHEELS) or None)
    return find_server()


def _env_server() -> tuple[Path, Path] | None:
    """(binary, backend directory) from TRITONSERVER [and TRITON_BACKEND_DIR], or None when unset."""
    value = os.environ.get(ENV_SERVER)
    if not value:
        return None
    binary = Path(value)
    if not binary.is_file():
        raise RuntimeError(f"{ENV_SERVER}={value}: no such file")
    return binary, _backend_dir(binary.resolve().parent.parent / "backends")


def _backend_dir(default: Path) -> Path:
    value = os.environ.get(ENV_BACKEND_DIR)
    backend_dir = Path(value) if value else default
    if value and not (backend_dir / "python").is_dir():
        raise RuntimeError(f"{ENV_BACKEND_DIR}={value}: no python backend (python/) there")
    return backend_dir


def _copy_stub(source: Path, target: Path) -> None:
    shutil.copy2(source, target)
    target.chmod(target.stat().st_mode | 0o111)
    logger.info("python backend stub for Python %s -> %s", _PYVER, target)


def _wheel_server_root() -> Path:
    # Located, not imported: pytriton's own dependencies are deliberately not installed.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"no tritonserver found: set {ENV_SERVER} (and {ENV_BACKEND_DIR}), use the NGC "
                           "tritonserver image, or `pip install --no-deps nvidia-pytriton==0.7.0` "
                           "(make install does)")
    return Path(spec.origin).parent / "tritonserver"


def _needs_stub_env() -> bool:
    import numpy

    return int(numpy.__version__.split(".")[0]) >= 2


def _build_stub_env(wheel_dir: str | Path | None = None) -> None:
    site = STUB_ENV / "lib" / f"python{_PYVER}" / "site-packages"
    if not (STUB_ENV / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(STUB_ENV)], check=True)
    if not list(site.glob("numpy-1.*.dist-info")):
        source: list[str] = []                        # the configured package index
        if wheel_dir is not None:
            if not Path(wheel_dir).is_dir():
                raise RuntimeError(f"stub environment: wheel directory {wheel_dir} does not exist")
            source = ["--no-index", "--find-links", str(Path(wheel_dir).resolve())]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                        "--only-binary=:all:", *source, "--target", str(site), "numpy<2"], check=True)
    # Lines of a .pth file that start with `import` run at start-up; addsitedir also processes
    # this venv's own .pth files (the editable install of dsa_backend among them).
    project_site = sysconfig.get_path("purelib")
    (site / "zz_project_venv.pth").write_text(f"import site; site.addsitedir({project_site!r})\n",
                                                 encoding="utf-8")
    logger.info("stub environment with numpy<2 in %s%s, chained to %s", STUB_ENV,
                f" (wheels from {wheel_dir})" if wheel_dir is not None else "", project_site)


def _libpython_dirs() -> tuple[Path, ...]:
    # The stub links libpython3.X.so.1.0; use this interpreter's own when it has a shared one.
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and library.endswith(".so") and (Path(libdir) / library).exists():
        return (Path(libdir),)
    return ()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel-dir", default=None, metavar="DIR",
                        help=f"install the stub environment's numpy<2 from the wheels in DIR, without an "
                             f"index (default: ${ENV_STUB_WHEELS}; unset: the package index)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = install(args.wheel_dir)
    logger.info("tritonserver: %s (backends: %s)", server.binary, server.backend_dir)


if __name__ == "__main__":
    main()
