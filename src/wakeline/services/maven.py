"""Java and Maven discovery, and fetching the Kafka and Debezium jars.

:func:`ensure_jars` runs Maven on the repo's ``pom.xml`` only when the cached
jars are missing or the pom changed (a marker file records the pom's hash), so
a warm machine never starts Maven. Layout under the cache folder::

    m2/                 Maven local repository (-Dmaven.repo.local)
    kafka/libs/         broker + Connect classpath
    kafka/dist/         the Debezium plugin archive as downloaded
    kafka/plugins/      the archive unpacked: Connect's plugin.path, never the classpath
    kafka/.complete     marker: sha256 of the pom that produced the above
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from wakeline.errors import PrerequisiteMissing, ServiceError, ServiceTimeout
from wakeline.services.base import log_tail
from wakeline.services.paths import cache_dir as default_cache_dir
from wakeline.services.paths import find_pom

JAVA_MIN = 17
JAVA_HINT = (
    f"install a JDK {JAVA_MIN}+ (e.g. apt-get install openjdk-{JAVA_MIN}-jdk-headless) "
    "or use the embedded broker (--broker tansu)"
)
MVN_HINT = (
    "install Maven 3.8+ (e.g. apt-get install maven) to fetch the Kafka jars, "
    "or use the embedded broker (--broker tansu)"
)


@dataclass(frozen=True)
class KafkaDist:
    """Where the fetched jars live."""

    libs: Path
    plugins: Path

    @property
    def classpath(self) -> str:
        """The ``-cp`` value for the broker and Connect (libs only, never plugins)."""
        return str(self.libs / "*")


@lru_cache(maxsize=32)
def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # e.g. 'openjdk version "17.0.15" 2025-04-15' or 'java version "1.8.0_392"'
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java(
    java_home: str | os.PathLike[str] | None = None, search_path: str | None = None
) -> str:
    """Path of a ``java`` executable of version 17 or newer.

    Looks in ``java_home`` when given, else ``$JAVA_HOME`` when set, else on
    ``search_path`` (default ``$PATH``). An explicit home is never skipped over.

    :raises PrerequisiteMissing: with an install hint when none qualifies.
    """
    home = java_home if java_home is not None else os.environ.get("JAVA_HOME") or None
    if home is not None:
        java = Path(home) / "bin" / "java"
        where = f"JAVA_HOME={str(home)!r}" if java_home is None else f"java_home={str(home)!r}"
        if not (java.is_file() and os.access(java, os.X_OK)):
            raise PrerequisiteMissing(
                f"Java {JAVA_MIN} not found: {where} has no bin/java; {JAVA_HINT}",
                java_home=str(home),
            )
        candidate = str(java)
    else:
        found = shutil.which("java", path=search_path)
        if found is None:
            raise PrerequisiteMissing(f"Java {JAVA_MIN} not found on PATH: {JAVA_HINT}")
        candidate = found
    major = _java_major(candidate)
    if major is None or major < JAVA_MIN:
        raise PrerequisiteMissing(
            f"Java {JAVA_MIN} not found: {candidate} is version {major or 'unknown'}; {JAVA_HINT}",
            java=candidate,
        )
    return candidate


def find_mvn(search_path: str | None = None) -> str:
    """Path of ``mvn`` on ``search_path`` (default ``$PATH``).

    :raises PrerequisiteMissing: with an install hint when absent.
    """
    found = shutil.which("mvn", path=search_path)
    if found is None:
        raise PrerequisiteMissing(f"Maven (mvn) not found on PATH: {MVN_HINT}")
    return found


def _fingerprint(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two pytest sessions or a CLI run at the same time must not both run Maven
    # into the same folders.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _unpack(archives: list[Path], plugins: Path) -> None:
    shutil.rmtree(plugins, ignore_errors=True)
    plugins.mkdir(parents=True)
    for archive in archives:
        with tarfile.open(archive) as tar:
            tar.extractall(plugins, filter="data")


def jars_present(cache: Path | None = None) -> bool:
    """True when the cache holds jars fetched with the current pom."""
    root = (cache or default_cache_dir()) / "kafka"
    marker = root / ".complete"
    try:
        return marker.read_text().strip() == _fingerprint(find_pom()) and any(
            (root / "libs").glob("kafka_2.13-*.jar")
        )
    except (OSError, PrerequisiteMissing):
        return False


def ensure_jars(
    cache: Path | None = None,
    *,
    java_home: str | os.PathLike[str] | None = None,
    search_path: str | None = None,
    timeout: float = 900.0,
) -> KafkaDist:
    """Fetch the Kafka libs and Debezium plugin with Maven unless already cached.

    Idempotent and safe to call concurrently. Blocks while Maven runs (the first
    run downloads ~60 MB). Maven's output goes to ``<cache>/kafka/maven.log``.

    :raises PrerequisiteMissing: Java, Maven or the pom is missing.
    :raises ServiceError: Maven failed (network, repository); the log tail says why.
    """
    cache = (cache or default_cache_dir()).resolve()
    root = cache / "kafka"
    dist = KafkaDist(libs=root / "libs", plugins=root / "plugins")
    if jars_present(cache):
        return dist
    pom = find_pom()
    java = find_java(java_home, search_path)
    mvn = find_mvn(search_path)
    with _locked(root / ".lock"):
        if jars_present(cache):  # another process finished while we waited
            return dist
        # Stale jars from an older pom would shadow new ones on the classpath.
        for sub in ("libs", "dist", "plugins"):
            shutil.rmtree(root / sub, ignore_errors=True)
        (root / ".complete").unlink(missing_ok=True)
        log = root / "maven.log"
        env = {**os.environ, "JAVA_HOME": str(Path(java).resolve().parent.parent)}
        argv = [mvn, "-B", "-f", str(pom), f"-Dmaven.repo.local={cache / 'm2'}",
                f"-Dwakeline.cache={cache}", "process-resources"]
        try:
            with open(log, "wb") as out:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                      cwd=pom.parent, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ServiceTimeout(f"Maven did not finish in {timeout:.0f}s; log {log}",
                                 log=str(log)) from exc
        if done.returncode != 0:
            raise ServiceError(
                f"Maven failed to fetch the Kafka jars (exit {done.returncode}); log {log}:\n"
                + log_tail(log, 40),
                log=str(log),
            )
        archives = sorted((root / "dist").glob("*.tar.gz"))
        if not archives or not any(dist.libs.glob("kafka_2.13-*.jar")):
            raise ServiceError(f"Maven succeeded but the jars are missing; log {log}",
                               log=str(log))
        _unpack(archives, dist.plugins)
        (root / ".complete").write_text(_fingerprint(pom) + "\n")
    return dist
