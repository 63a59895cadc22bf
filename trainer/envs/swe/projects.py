"""The source projects of SWE-mini: pinned sdists of pure-Python packages that ship their tests,
and the tiny hand-written repositories shipped in ``tiny/``.

Train and eval differ by source project: eval instances come only from boltons, which no train
instance uses.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trainer.paths import cache_dir

ENV_NAME = "SWE-mini"
TINY_DIR = Path(__file__).parent / "tiny"


@dataclass(frozen=True)
class Project:
    name: str
    """Name on PyPI (or of the folder in ``tiny/``)."""
    version: str
    sha256: str
    """Of the sdist, so a re-download cannot silently change the instances; empty for tiny repos."""
    package: str
    """The import package, a folder at the top of the source tree."""
    test_dir: str
    split: str
    modules: tuple[str, ...] = ()
    """Only these modules (file stems) get bugs; empty = every module that has a test file."""
    skip_modules: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    """Test files never run (they need the network, or hang without it)."""
    deselect: tuple[str, ...] = ()
    """Slow test ids left out of every run."""
    target: int = 40
    """How many instances to build from this project."""

    @property
    def tiny(self) -> bool:
        return not self.sha256

    @property
    def repo(self) -> str:
        return self.name

    @property
    def base_commit(self) -> str:
        """SWE-bench's base commit, here the pinned source release."""
        return f"{self.name}=={self.version}"


PROJECTS: dict[str, Project] = {
    p.name: p
    for p in (
        Project(
            "toolz",
            "1.2.0",
            "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490",
            "toolz",
            "toolz/tests",
            "train",
            skip_modules=("compatibility", "_signatures", "_version"),
            target=40,
        ),
        Project(
            "more-itertools",
            "11.2.1",
            "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63",
            "more_itertools",
            "tests",
            "train",
            modules=("recipes",),  # tests/test_more.py takes ~10 s a run: too slow for an RL step
            deselect=(
                "tests/test_recipes.py::PrimeFunctionTests::test_primes",
                "tests/test_recipes.py::PrimeFunctionTests::test_nth_prime_approximate",
                "tests/test_recipes.py::PolynomialFromRootsTests::test_large",
                "tests/test_recipes.py::RunningMedianTests::test_vs_statistics_median",
            ),
            target=30,
        ),
        Project(
            "inflection",
            "0.5.1",
            "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
            "inflection",
            ".",
            "train",
            target=30,
        ),
        Project(
            "boltons",
            "26.2.0",
            "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c",
            "boltons",
            "tests",
            "eval",
            skip_modules=("socketutils", "ecoutils", "gcutils", "debugutils", "deprutils", "fileutils"),
            ignore=("tests/test_socketutils.py",),
            target=60,
        ),
        Project("tinytext", "0.1", "", "tinytext", "tests", "train", target=8),
        Project("tinymath", "0.1", "", "tinymath", "tests", "train", target=10),
    )
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_dir(project: Project, download: bool = True) -> Path:
    """The pristine source tree of ``project`` (downloaded and unpacked once into the cache)."""
    if project.tiny:
        return TINY_DIR / project.name
    root = cache_dir("swe", "src")
    tree = root / f"{project.name}-{project.version}"
    if (tree / ".complete").exists():
        return tree
    if not download:
        raise FileNotFoundError(
            f"SWE-mini: the source of {project.base_commit} is not in {root}; "
            "run `python -m trainer.envs.swe.build` (needs PyPI)"
        )
    sdist = _download(project, cache_dir("swe", "sdist"))
    tmp = root / f".{tree.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    (top,) = list(tmp.iterdir())
    shutil.rmtree(tree, ignore_errors=True)
    top.rename(tree)
    shutil.rmtree(tmp, ignore_errors=True)
    (tree / ".complete").write_text(project.base_commit + "\n")
    return tree


def _download(project: Project, dest: Path) -> Path:
    stem = project.name.replace("-", "_")
    found = [p for p in dest.glob("*.tar.gz") if p.name.lower() in _names(project)]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest)]
        subprocess.run([*cmd, f"{project.name}=={project.version}"], check=True, capture_output=True)
        found = [p for p in dest.glob("*.tar.gz") if p.name.lower() in _names(project)]
    if not found:
        raise FileNotFoundError(f"pip download gave no sdist for {project.base_commit} (looked for {stem})")
    digest = _sha256(found[0])
    if digest != project.sha256:
        raise RuntimeError(
            f"{found[0]} has sha256 {digest}, expected {project.sha256}: "
            "the pinned source changed; SWE-mini instances would not match it"
        )
    return found[0]


def _names(project: Project) -> set[str]:
    return {f"{n}-{project.version}.tar.gz".lower() for n in (project.name, project.name.replace("-", "_"))}


def module_files(project: Project, tree: Path) -> dict[str, list[str]]:
    """Source module (relative path) -> its test files (relative paths), for modules that have some."""
    out: dict[str, list[str]] = {}
    for mod in sorted((tree / project.package).glob("*.py")):
        stem = project.package if mod.stem == "__init__" else mod.stem
        if stem in project.skip_modules or (project.modules and stem not in project.modules):
            continue
        if not mod.read_text().endswith("\n"):
            continue
        tests = sorted(
            str(t.relative_to(tree))
            for pattern in (f"test_{stem}.py", f"test_{stem}_*.py")
            for t in (tree / project.test_dir).glob(pattern)
        )
        tests = [t for t in tests if t not in project.ignore]
        if tests:
            out[str(mod.relative_to(tree))] = tests
    return out
