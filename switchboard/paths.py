"""Where things are in a checkout: the one module that knows the repository's layout.

Everything else asks here instead of walking up from its own ``__file__``, so a module can
move without its paths breaking.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
MODEL_REPOSITORY = ROOT / "model_repository"
BUILD = ROOT / "build"
LOGS = BUILD / "logs"  # one log per build step (switchboard.console)
RUN = BUILD / "run"  # pid files and logs of the stack `make serve` starts
ARTIFACTS = BUILD / "artifacts"
K8S = ROOT / "deploy" / "k8s"  # Kubernetes manifests (docs/kubernetes.md)
