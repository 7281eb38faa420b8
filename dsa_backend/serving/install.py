"""Find a tritonserver with the python backend, and make the pip-installed one runnable.

Two servers are supported: the NGC tritonserver image's /opt/tritonserver, and the server that the
nvidia-pytriton wheel bundles (installed with `pip install --no-deps nvidia-pytriton`, since its
own dependencies pin numpy < 2). For the latter, `python -m dsa_backend.serving.install`:

- copies the python backend stub built for this interpreter's version into backends/python/;
- builds a stub environment. The stub embeds the interpreter it finds as the first `python3` on
  PATH (it ignores PYTHONPATH), and this stub was built against NumPy 1.x: with NumPy 2 it
  corrupts every tensor it converts, strings included. So the launcher puts a small venv first on
  PATH whose own site-packages hold numpy < 2 and which then chains to this venv's packages.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NGC_SERVER = Path("/opt/tritonserver")
STUB_ENV = Path(sys.prefix) / "triton-stub-env"
_PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class ServerInstall:
    """How to run one tritonserver: the binary, its backends, and the environment it needs."""

    binary: Path
    backend_dir: Path
    path_prefix: tuple[Path, ...]      # put first on PATH: the stub takes its python3 from there
    library_path: tuple[Path, ...]     # for the stub's libpython


def find_server() -> ServerInstall:
    """The NGC image's server when present, else the nvidia-pytriton wheel's (installed)."""
    venv_bin = Path(sys.executable).parent
    if (NGC_SERVER / "bin" / "tritonserver").is_file():
        return ServerInstall(NGC_SERVER / "bin" / "tritonserver", NGC_SERVER / "backends", (venv_bin,), ())
    root = _wheel_server_root()
    stub = root / "backends" / "python" / "triton_python_backend_stub"
    if not stub.is_file() or (_needs_stub_env() and not (STUB_ENV / "bin" / "python3").exists()):
        raise RuntimeError("the bundled tritonserver is not set up: run `make install` "
                           "(or python -m dsa_backend.serving.install)")
    prefix = (STUB_ENV / "bin", venv_bin) if _needs_stub_env() else (venv_bin,)
    return ServerInstall(root / "bin" / "tritonserver", root / "backends", prefix, _libpython_dirs())


def install() -> ServerInstall:
    """Set up the bundled server for this interpreter (no-op for the NGC image's server)."""
    if (NGC_SERVER / "bin" / "tritonserver").is_file():
        logger.info("using the NGC image's server in %s", NGC_SERVER)
        return find_server()
    root = _wheel_server_root()
    source = root / "python_backend_stubs" / _PYVER / "triton_python_backend_stub"
    if not source.is_file():
        raise RuntimeError(f"nvidia-pytriton has no python backend stub for Python {_PYVER}")
    target = root / "backends" / "python" / "triton_python_backend_stub"
    shutil.copy2(source, target)
    logger.info("python backend stub for Python %s -> %s", _PYVER, target)
    if _needs_stub_env():
        _build_stub_env()
    return find_server()


def _wheel_server_root() -> Path:
    # Located, not imported: pytriton's own dependencies are deliberately not installed.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError("no tritonserver found: use the NGC tritonserver image, or "
                           "`pip install --no-deps nvidia-pytriton==0.7.0` (make install does)")
    return Path(spec.origin).parent / "tritonserver"


def _needs_stub_env() -> bool:
    import numpy

    return int(numpy.__version__.split(".")[0]) >= 2


def _build_stub_env() -> None:
    site = STUB_ENV / "lib" / f"python{_PYVER}" / "site-packages"
    if not (STUB_ENV / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(STUB_ENV)], check=True)
    if not list(site.glob("numpy-1.*.dist-info")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                        "--target", str(site), "numpy<2"], check=True)
    # Lines of a .pth file that start with `import` run at start-up; addsitedir also processes
    # this venv's own .pth files (the editable install of dsa_backend among them).
    project_site = sysconfig.get_path("purelib")
    (site / "zz_project_venv.pth").write_text(f"import site; site.addsitedir({project_site!r})\n")
    logger.info("stub environment with numpy<2 in %s, chained to %s", STUB_ENV, project_site)


def _libpython_dirs() -> tuple[Path, ...]:
    # The stub links libpython3.X.so.1.0; use this interpreter's own when it has a shared one.
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and library.endswith(".so") and (Path(libdir) / library).exists():
        return (Path(libdir),)
    return ()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = install()
    logger.info("tritonserver: %s", server.binary)


if __name__ == "__main__":
    main()
