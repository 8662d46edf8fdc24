"""Where services keep runtime state, caches and the Maven project.

- ``WAKELINE_HOME`` (default ``<cwd>/.wakeline``): runtime state, one folder per
  service under ``services/``, plus the CLI's state file.
- ``WAKELINE_CACHE`` (default ``<repo root>/.cache``): the Maven local repository
  (``m2/``) and the fetched Kafka jars and Debezium plugin (``kafka/``).
- ``WAKELINE_POM`` (default: the ``pom.xml`` at the repo root): the Maven project
  that lists the JVM dependencies.

Both default folders are git-ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

from wakeline.errors import PrerequisiteMissing

_POM = "pom.xml"


def wakeline_home() -> Path:
    """The runtime state folder (``$WAKELINE_HOME`` or ``<cwd>/.wakeline``), absolute."""
    env = os.environ.get("WAKELINE_HOME")
    return Path(env).resolve() if env else Path.cwd().resolve() / ".wakeline"


def services_dir() -> Path:
    """Folder holding one sub-folder per managed service and the CLI state file."""
    return wakeline_home() / "services"


def _candidates() -> list[Path]:
    # The package location comes first: with an editable install it sits inside the
    # repo (src/wakeline/services), so this works from any cwd. The cwd is the
    # fallback for a regular install run from a checkout.
    here = Path(__file__).resolve().parent
    cwd = Path.cwd().resolve()
    return [here, *here.parents, cwd, *cwd.parents]


def find_pom() -> Path:
    """Locate Wakeline's ``pom.xml`` (``$WAKELINE_POM``, else the repo root).

    The repo root is the first ancestor of this package, or else of the cwd, that
    holds both ``pom.xml`` and ``pyproject.toml`` (so an unrelated Maven project
    above the checkout is never picked).

    :raises PrerequisiteMissing: when no such file exists.
    """
    env = os.environ.get("WAKELINE_POM")
    if env:
        pom = Path(env).resolve()
        if not pom.is_file():
            raise PrerequisiteMissing(f"WAKELINE_POM={env!r} is not a file", path=env)
        return pom
    for folder in _candidates():
        if (folder / _POM).is_file() and (folder / "pyproject.toml").is_file():
            return folder / _POM
    raise PrerequisiteMissing(
        "pom.xml not found: run from a Wakeline checkout, install it editable "
        "(pip install -e .), or set WAKELINE_POM to the repo's pom.xml",
    )


def repo_root() -> Path | None:
    """The checkout's root folder, or None when not running from a checkout."""
    try:
        return find_pom().parent
    except PrerequisiteMissing:
        return None


def cache_dir() -> Path:
    """The jar and Maven cache (``$WAKELINE_CACHE``, else ``<repo root>/.cache``)."""
    env = os.environ.get("WAKELINE_CACHE")
    if env:
        return Path(env).resolve()
    root = repo_root()
    return (root if root is not None else Path.cwd().resolve()) / ".cache"
