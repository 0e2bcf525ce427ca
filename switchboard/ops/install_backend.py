"""Assemble a Triton ``--backend-directory`` from the tritonserver build in nvidia-pytriton.

The pytriton wheel ships ``libtriton_python.so`` and ``triton_python_backend_utils.py`` in
one folder and one stub per Python version in another; Triton wants all three side by side
in ``<backend-directory>/python/``.

``SWITCHBOARD_TRITONSERVER`` names another copy of that build: a folder laid out as
site-packages is (``pytriton/tritonserver`` beside ``nvidia_pytriton.libs``), such as the one
``python -m perf.asr_gpu_served`` unpacks on a machine without the wheel.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def pytriton_root() -> Path:
    if os.environ.get("SWITCHBOARD_TRITONSERVER"):
        return Path(os.environ["SWITCHBOARD_TRITONSERVER"]) / "pytriton" / "tritonserver"
    import pytriton  # noqa: PLC0415  (only needed here)

    return Path(pytriton.__file__).parent / "tritonserver"


def server_binary() -> Path:
    return pytriton_root() / "bin" / "tritonserver"


def server_library_dir() -> Path:
    # auditwheel puts the server's shared libraries next to the package.
    return pytriton_root().parent.parent / "nvidia_pytriton.libs"


def install(dest: Path) -> Path:
    root = pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"no Python backend stub for Python {version} in {stub.parent.parent}")
    target = dest / "python"
    target.mkdir(parents=True, exist_ok=True)
    for src in (
        root / "backends/python/libtriton_python.so",
        root / "backends/python/triton_python_backend_utils.py",
        stub,
    ):
        out = target / src.name
        if not out.exists() or out.stat().st_size != src.stat().st_size:
            shutil.copy2(src, out)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="backend directory to create (e.g. build/triton/backends)")
    install(parser.parse_args(argv).dest)


if __name__ == "__main__":
    main()
