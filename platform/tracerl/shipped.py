"""Where the shipped configs and tiny policies are, in a source checkout and in an installed wheel alike.

``share/`` beside this module holds ``conf/`` and ``models/``: links to the repository's top-level folders in a
checkout, package data in a wheel. Stdlib only: the GPU check kit imports it on a bare machine.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
"""The ``tracerl`` package directory; its parent is what ``PYTHONPATH`` needs for ``import tracerl``."""

SHARE = PACKAGE / "share"
CONF = (SHARE / "conf").resolve()  # a checkout: the repository's conf/ (messages name its files)
MODELS = (SHARE / "models").resolve()


def shipped_model(path: str) -> str:
    """``path`` as given if it exists here (or is not a plain relative path); else, for a relative path under
    ``models/`` naming a shipped tiny policy (``models/tiny-math``), that policy's absolute path; else ``path``.
    So an installed ``tracerl`` runs the shipped configs from any directory, while a checkpoint of the user's own
    in the working directory always wins."""
    p = Path(path)
    if "://" in path or ":/" in path or p.is_absolute() or p.exists():
        return path
    if p.parts[:1] == ("models",) and len(p.parts) > 1:
        candidate = MODELS.joinpath(*p.parts[1:])
        if candidate.is_dir():
            return str(candidate)
    return path


__all__ = ["CONF", "MODELS", "PACKAGE", "SHARE", "shipped_model"]
