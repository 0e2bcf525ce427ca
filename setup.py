"""The package's layout for setuptools; everything else is in pyproject.toml.

One package, ``switchboard``, from three folders: switchboard/ and the top-level folders that
show the architecture, each a subpackage. perf/, the benchmark suite, is not shipped: it runs
from the checkout (docs/decisions/2026-11-28-bench-suite-layout.md). ``packages.find`` in
pyproject.toml takes one root and knows no such mapping, so every subpackage of every mapped
folder is found here: a new subpackage ships without an edit to a list. Namespace discovery,
so that folders of package data (switchboard/gateway/static) are packages too, as setuptools
wants them.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = {
    "switchboard": "switchboard",
    "switchboard.client": "client",
    "switchboard.export": "export",
}

setup(
    package_dir=PACKAGE_DIR,
    packages=[
        f"{package}.{sub}" if sub else package
        for package, folder in PACKAGE_DIR.items()
        for sub in ["", *find_namespace_packages(HERE / folder, exclude=["*__pycache__*"])]
    ],
)
