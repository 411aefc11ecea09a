"""`bench.suite --before REF`: radixserve as of a git ref runs from a worktree outside the repository."""

import subprocess

from bench.suite import REPO_DIR, checkout


def test_checkout_is_a_detached_worktree_at_the_ref_and_is_removed():
    head = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with checkout("HEAD") as (path, sha):
        assert sha == head
        assert not path.is_relative_to(REPO_DIR)
        assert (path / "server" / "cli.py").is_file()
        at = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
        assert at == head
    assert not path.exists()
    worktrees = subprocess.run(["git", "-C", str(REPO_DIR), "worktree", "list"], check=True, capture_output=True,
                               text=True).stdout
    assert str(path) not in worktrees
