"""JVM engines for tests and benchmarks, fetched from Maven Central at pinned versions.

Each artifact is downloaded once into a cache outside the repository (``HARNESS_ENGINES_DIR``,
default ``~/.cache/dataharness/maven``, laid out like a Maven repository), checked against the
SHA-256 pinned here (a mismatch deletes the download and fails), and reused by every later run.
``python -m flight_gateway.local.engines`` fetches them all (``make engines``).

Flink's jars (``flink_classpath``) are resolved by Maven itself, with strict checksums.

Trino is 476: the newest ``trino-server-core`` and ``trino-iceberg`` plugin Maven Central serves
here (483 is listed in the index, but its archives are not served). It needs a JDK >= 24:
``java_home`` finds one (``JAVA_HOME``, then the JDKs under ``/usr/lib/jvm``), never a fixed path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flight_gateway.protocol.errors import Unavailable

log = logging.getLogger(__name__)
REPOSITORY = os.environ.get("HARNESS_MAVEN_REPOSITORY", "https://repo1.maven.org/maven2")


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str
    file: str  # the file name's tail after ``name-version``: ``.jar``, ``.tar.gz``, ...
    sha256: str

    @property
    def path(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.name}-{self.version}{self.file}"


TRINO_VERSION = "476"
TRINO_SERVER = Artifact("io.trino", "trino-server-core", TRINO_VERSION, ".tar.gz",
                        "0f388f9967c177ae70a47c099082fc95387f0c3cb96d8000d1d41fc3a5223158")  # fmt: skip
TRINO_ICEBERG = Artifact("io.trino", "trino-iceberg", TRINO_VERSION, ".zip",
                         "99edba5b491ed94d599aeb61e0794272d3569d8b563f3bb8569e8a49daa87b6c")  # fmt: skip
FLIGHT_SQL_JDBC = Artifact("org.apache.arrow", "flight-sql-jdbc-driver", "18.3.0", ".jar",
                           "3f418b46c880e263558c5de669bdbede2c5d4375527ced116fb29f795b03704c")  # fmt: skip
#: Iceberg's Spark runtime supports Spark up to 4.1 (not the project's pyspark 4.3): it runs in
#: a Python environment of its own with pyspark 4.1 (``spark_python``).
ICEBERG_SPARK = Artifact("org.apache.iceberg", "iceberg-spark-runtime-4.1_2.13", "1.11.0", ".jar",
                         "d6ea6c5d099288daeb7d5a92061bd3d7d8f296492632b42378e5f2f0e3066242")  # fmt: skip
#: Apache Hudi's Spark bundle: its newest release supports Spark up to 3.5 (Scala 2.12), so it
#: runs in a pyspark 3.5 environment of its own (``spark_python("3.5.7")``) on a JDK 17.
HUDI_SPARK = Artifact("org.apache.hudi", "hudi-spark3.5-bundle_2.12", "1.1.1", ".jar",
                      "5470908f0d26897fb6e0768790e6c75e3d05d2fa013f7d81c8f90c74056d1604")  # fmt: skip
ALL = (TRINO_SERVER, TRINO_ICEBERG, FLIGHT_SQL_JDBC, ICEBERG_SPARK, HUDI_SPARK)
#: Each pyspark environment's requirements, pinned by hash (pip --require-hashes).
SPARK_REQUIREMENTS = {
    "4.1.4": """\
pyspark==4.1.4 --hash=sha256:bcbd5e18690cf79d438e97210ad06fb8d451a251bb77becc2b0418868d2acd73
py4j==0.10.9.9 --hash=sha256:c7c26e4158defb37b0bb124933163641a2ff6e3a3913f7811b0ddbe07ed61533
""",
    "3.5.7": """\
pyspark==3.5.7 --hash=sha256:80e36514e0c5c126d35a26adf4f405cd4a69de96a8ea8a3c1e9a65fce2fb4eaa
py4j==0.10.9.7 --hash=sha256:85defdfd2b2376eb3abf5ca6474b51ab7e0de341c75a02f46dc9b5976f5a5c1b
""",
}


def cache_dir() -> Path:
    given = os.environ.get("HARNESS_ENGINES_DIR")
    return Path(given) if given else Path.home() / ".cache" / "dataharness" / "maven"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One fetcher at a time per cache (parallel test sessions share it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(artifact: Artifact, timeout_s: float = 1800) -> Path:
    """The artifact's file in the cache, downloaded and checked the first time."""
    root = cache_dir()
    target = root / artifact.path
    if target.exists():
        return target
    with _locked(root):
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        url = f"{REPOSITORY}/{artifact.path}"
        log.info("fetching %s", url)
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r, open(part, "wb") as out:
                shutil.copyfileobj(r, out, 1 << 20)
        except OSError as e:
            part.unlink(missing_ok=True)
            raise Unavailable(f"cannot fetch {url}: {e}") from e
        got = _sha256(part)
        if got != artifact.sha256:
            part.unlink(missing_ok=True)
            raise Unavailable(f"{url}: SHA-256 {got}, expected {artifact.sha256}")
        part.rename(target)
    return target


# ---------------------------------------------------------------------- a JDK


def _java_version(home: Path) -> int:
    release = home / "release"
    if release.exists():
        m = re.search(r'JAVA_VERSION="(\d+)', release.read_text(errors="replace"))
        if m:
            return int(m.group(1))
    java = home / "bin" / "java"
    if not java.exists():
        return 0
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r'version "(\d+)', out.stderr)
    return int(m.group(1)) if m else 0


def java_home(minimum: int, maximum: int = 1000) -> Path:
    """A JDK from ``minimum`` to ``maximum``: ``JAVA_HOME`` if it is one, else the newest such
    under ``/usr/lib/jvm`` (or ``HARNESS_JVM_DIR``)."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    jvms = Path(os.environ.get("HARNESS_JVM_DIR", "/usr/lib/jvm"))
    if jvms.is_dir():
        candidates += sorted(p for p in jvms.iterdir() if p.is_dir() and not p.is_symlink())
    found = [(v, p) for p in candidates if minimum <= (v := _java_version(p)) <= maximum]
    if not found:
        wanted = f">= {minimum}" if maximum >= 1000 else f"{minimum}-{maximum}"
        raise Unavailable(f"no JDK {wanted} (set JAVA_HOME; looked in {jvms})")
    return max(found, key=lambda vp: vp[0])[1]


# ---------------------------------------------------------------------- Trino


def trino_home() -> Path:
    """Trino's server with its Iceberg plugin, unpacked once into the cache."""
    root = cache_dir()
    home = root / f"trino-{TRINO_VERSION}"
    if (home / ".complete").exists():
        return home
    server, plugin = fetch(TRINO_SERVER), fetch(TRINO_ICEBERG)
    with _locked(root):
        if (home / ".complete").exists():
            return home
        tmp = root / f"trino-{TRINO_VERSION}.part"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with tarfile.open(server) as t:
            t.extractall(tmp, filter="tar")
        (unpacked,) = list(tmp.iterdir())
        with zipfile.ZipFile(plugin) as z:
            z.extractall(unpacked / "plugin")
        (unpacked / "plugin" / f"trino-iceberg-{TRINO_VERSION}").rename(
            unpacked / "plugin" / "iceberg"
        )
        launcher = unpacked / "bin" / "launcher"
        for p in [launcher, *(unpacked / "bin").glob("*/launcher")]:
            p.chmod(0o755)
        shutil.rmtree(home, ignore_errors=True)
        unpacked.rename(home)
        shutil.rmtree(tmp, ignore_errors=True)
        (home / ".complete").touch()
    return home


# ---------------------------------------------------------------------- Spark with Iceberg


def spark_python(version: str = "4.1.4") -> Path:
    """A Python with pyspark ``version`` (4.1 for Iceberg's Spark runtime, 3.5 for Hudi's),
    made once beside the cache."""
    env = cache_dir().parent / f"pyspark-{version}"
    python = env / "bin" / "python"
    if (env / ".complete").exists():
        return python
    with _locked(cache_dir()):
        if (env / ".complete").exists():
            return python
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
        requirements = env / "requirements.txt"
        requirements.write_text(SPARK_REQUIREMENTS[version])
        out = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "-r",
             str(requirements)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if out.returncode != 0:
            raise Unavailable(f"cannot install pyspark {version}: {out.stderr[-2000:]}")
        (env / ".complete").touch()
    return python


# ---------------------------------------------------------------------- Flink with Iceberg

FLINK_VERSION = "2.1.1"  # the newest Flink that Iceberg 1.11's Flink runtime supports
_FLINK_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dataharness.engines</groupId>
  <artifactId>flink-iceberg</artifactId>
  <version>1</version>
  <dependencies>
    {dependencies}
  </dependencies>
</project>
"""
FLINK_DEPENDENCIES = (
    ("org.apache.flink", "flink-table-api-java", FLINK_VERSION),
    ("org.apache.flink", "flink-table-api-java-bridge", FLINK_VERSION),
    ("org.apache.flink", "flink-table-planner-loader", FLINK_VERSION),
    ("org.apache.flink", "flink-table-runtime", FLINK_VERSION),
    ("org.apache.flink", "flink-clients", FLINK_VERSION),
    ("org.apache.flink", "flink-connector-files", FLINK_VERSION),
    ("org.apache.iceberg", "iceberg-flink-runtime-2.1", "1.11.0"),
    # Iceberg's Flink runtime needs Hadoop's classes (its configuration, even for REST).
    ("org.apache.hadoop", "hadoop-client-api", "3.4.1"),
    ("org.apache.hadoop", "hadoop-client-runtime", "3.4.1"),
)


def flink_classpath() -> str:
    """The classpath of an embedded Flink with Iceberg's Flink runtime, resolved once by Maven
    (``mvn``, strict checksums) from pinned versions into the local Maven repository."""
    root = cache_dir().parent / f"flink-{FLINK_VERSION}"
    out = root / "classpath.txt"
    if out.exists():
        return out.read_text().strip()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise Unavailable("no Maven (mvn) to resolve Flink's jars")
    with _locked(cache_dir()):
        if out.exists():
            return out.read_text().strip()
        root.mkdir(parents=True, exist_ok=True)
        deps = "\n    ".join(
            f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
            f"<version>{v}</version></dependency>"
            for g, a, v in FLINK_DEPENDENCIES
        )
        (root / "pom.xml").write_text(_FLINK_POM.format(dependencies=deps))
        tmp = root / "classpath.part"
        run = subprocess.run(
            [mvn, "-q", "-B", "-C", "-f", str(root / "pom.xml"), "dependency:build-classpath",
             f"-Dmdep.outputFile={tmp}"],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if run.returncode != 0 or not tmp.exists():
            raise Unavailable(f"cannot resolve Flink's jars: {(run.stdout + run.stderr)[-2000:]}")
        tmp.rename(out)
    return out.read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch the JVM engines the tests use.")
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for a in ALL:
        print(f"{a.group}:{a.name}:{a.version} {fetch(a)}")
    print(f"Trino {TRINO_VERSION}: {trino_home()} (JDK {java_home(24)})")
    print(f"pyspark 4.1.4 for Iceberg's Spark runtime: {spark_python()}")
    print(f"pyspark 3.5.7 for Hudi's Spark bundle: {spark_python('3.5.7')}")
    print(
        f"Flink {FLINK_VERSION} with Iceberg's Flink runtime: {len(flink_classpath().split(':'))} jars"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
