"""Releases: the version comes from git tags, `make release` builds checked artefacts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = Path(sys.executable)


def _run(*cmd: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _tree(dest: Path) -> Path:
    """The committed tree of this checkout, without .git (what an unpacked tarball is)."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], capture_output=True,
                             check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest


def _git(tree: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    done = _run("git", "-c", "init.defaultBranch=main", *args, cwd=tree, env=env)
    assert done.returncode == 0, done.stderr


def _version(tree: Path) -> str:
    done = _run(str(PY), "-m", "setuptools_scm", cwd=tree, env={"SETUPTOOLS_SCM_PRETEND_VERSION": ""})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = _tree(tmp_path_factory.mktemp("pbtest-release") / "src")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "release me")
    _git(tree, "tag", "-a", "v9.8.7", "-m", "v9.8.7")
    return tree


@pytest.mark.slow
def test_version_comes_from_the_tag_and_counts_commits_after_it(tagged: Path, tmp_path: Path) -> None:
    assert _version(tagged) == "9.8.7"
    (tagged / "NOTE").write_text("after the release\n")
    _git(tagged, "add", "NOTE")
    _git(tagged, "commit", "-q", "-m", "after")
    after = _version(tagged)
    assert after.startswith("9.8.8.dev1+g"), after
    _git(tagged, "reset", "-q", "--hard", "v9.8.7")
    assert _version(tagged) == "9.8.7"


@pytest.mark.slow
def test_without_git_the_fallback_version_is_used(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "src")
    assert _version(tree) == "0.1.0"


@pytest.mark.slow
def test_a_tagged_version_without_a_changelog_section_is_refused(tagged: Path, tmp_path: Path) -> None:
    done = _run("bash", "scripts/release.sh", cwd=tagged,
                env={"PY": str(PY), "OUT": str(tmp_path / "dist"), "SKIP_IMAGE": "1"})
    assert done.returncode == 1 and "CHANGELOG.md has no section '## [9.8.7]'" in done.stderr
    assert not (tmp_path / "dist").exists()


@pytest.mark.slow
def test_release_builds_sums_and_checks_the_wheel_in_a_clean_venv(tagged: Path, tmp_path: Path) -> None:
    changelog = tagged / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("## [Unreleased]", "## [Unreleased]\n\n## [9.8.7] - 2026-12-01"))
    _git(tagged, "commit", "-q", "-am", "changelog")
    _git(tagged, "tag", "-f", "-a", "v9.8.7", "-m", "v9.8.7")
    out = tmp_path / "dist"
    done = _run("bash", "scripts/release.sh", cwd=tagged, env={"PY": str(PY), "OUT": str(out), "SKIP_IMAGE": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "SHA256SUMS", "perfbalance-9.8.7-py3-none-any.whl", "perfbalance-9.8.7.tar.gz"]
    assert "'perfbalance 9.8.7'; perfbalance doctor ran" in done.stdout
    assert _run("sha256sum", "-c", "--quiet", "SHA256SUMS", cwd=out).returncode == 0
    with open(out / "perfbalance-9.8.7.tar.gz", "ab") as f:  # control: a changed artefact fails
        f.write(b"\0")
    assert _run("sha256sum", "-c", "--quiet", "SHA256SUMS", cwd=out).returncode != 0
