"""The commit convention (CONTRIBUTING.md): the checker, its hook, `make hooks`, and the history.

The history test reads every commit after b1d507a (the last one before issue 38's work) that HEAD
reaches; in a shallow clone without it, every commit there is. Hook and Makefile are tried in
throwaway repositories under tmp_path, never in this checkout's shared git config.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONVENTION_START = "b1d507a"  # exclusive: the first commit checked is its child

_spec = importlib.util.spec_from_file_location("commitmsg", ROOT / "tools" / "commitmsg.py")
commitmsg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(commitmsg)
check = commitmsg.check

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A command with no GIT_* variables of ours leaking in (a test run from inside a hook)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env={**clean, **env})


# --- the checker


def test_a_conventional_subject_passes_with_or_without_a_body():
    assert check("docs: say where admission lives\n") == []
    assert check("serving: one Limit protocol\n\nWhy, and the numbers:\n`make bench` gave 7.3 req/s.\n") == []


def test_an_empty_body_and_git_comments_are_fine():
    assert check("api: refuse giant bodies unread\n\n# Please enter the commit message\n#\n") == []
    verbose = "tests: one fixture\n\n# ------------------------ >8 ------------------------\ndiff --git a/x b/x\n"
    assert check(verbose) == []


def test_a_capital_is_fine_a_final_period_is_not():
    assert check("docs: README says capacity follows compute") == []  # names keep their case
    assert check("docs: say where admission lives.") == ["summary ends with a period"]


def test_subject_at_most_72_characters():
    fits = "docs: " + "x" * 66
    assert len(fits) == 72 and check(fits) == []
    assert check(fits + "y") == ["subject is 73 characters, at most 72"]


def test_no_area_or_an_unknown_one():
    assert check("say where admission lives") == [
        "subject is not 'area: imperative summary' (lowercase area, colon, one space)"]
    assert check("Docs: say where admission lives")  # areas are lowercase
    assert check("docs:say where admission lives")
    (problem,) = check("limiter: one Limit protocol")
    assert problem.startswith("unknown area 'limiter'")


def test_every_area_is_in_contributing():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for area in commitmsg.AREAS:
        assert f"| `{area}` |" in text, area


def test_merges_fixups_empty_and_a_missing_blank_line_fail():
    assert check("Merge branch 'limiter' into main")
    assert check("fixup! docs: say where admission lives")
    assert check("") == ["empty message"] and check("# only a comment\n") == ["empty message"]
    assert check("docs: index\nthe body at once") == ["no blank line between the subject and the body"]


# --- the hook and `make hooks`, in throwaway repositories


def _commit(repo: Path, message: str) -> subprocess.CompletedProcess:
    (repo / "f.txt").write_text(message)
    assert run(["git", "add", "f.txt"], repo).returncode == 0
    return run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", message], repo)


@needs_git
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_hooks_installs_the_hook_that_checks_commits(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / ".githooks", repo / ".githooks")
    shutil.copytree(ROOT / "tools", repo / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    assert run(["git", "init", "-q", str(repo)], tmp_path).returncode == 0
    for _ in range(2):  # idempotent
        r = run(["make", "-s", "-f", str(ROOT / "Makefile"), "hooks"], repo)
        assert r.returncode == 0, r.stderr
    assert run(["git", "config", "core.hooksPath"], repo).stdout.strip() == ".githooks"
    bad = _commit(repo, "Update stuff.")
    assert bad.returncode != 0 and "not 'area: imperative summary'" in bad.stderr
    assert _commit(repo, "docs: say where admission lives").returncode == 0


@needs_git
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_hooks_outside_git_does_nothing_and_succeeds(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    r = run(["make", "-s", "-f", str(ROOT / "Makefile"), "hooks"], plain, GIT_CEILING_DIRECTORIES=str(tmp_path))
    assert r.returncode == 0 and "not a git work tree" in r.stdout


# --- the history


@needs_git
def test_every_commit_since_the_convention_follows_it():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (no .git): no history to check")
    start = run(["git", "cat-file", "-e", f"{CONVENTION_START}^{{commit}}"], ROOT).returncode == 0
    since = [f"^{CONVENTION_START}"] if start else []
    log = run(["git", "log", "-z", "--format=%H%x01%P%x01%B", "HEAD", *since], ROOT)
    assert log.returncode == 0, log.stderr
    bad = []
    for record in filter(None, log.stdout.split("\0")):
        sha, parents, message = record.split("\x01", 2)
        problems = check(message) + (["a merge commit"] if len(parents.split()) > 1 else [])
        if problems:
            bad.append(f"{sha[:9]} {message.splitlines()[0] if message.strip() else ''!r}: {'; '.join(problems)}")
    assert not bad, "commits that break CONTRIBUTING.md's convention:\n" + "\n".join(bad)
