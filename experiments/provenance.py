"""Where a result came from: the commit of the checkout the scripts run in."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit() -> tuple[str, bool]:
    """(HEAD's hash, whether tracked files differ from it) of this checkout; ("unknown", False) outside a git
    checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return head.stdout.strip(), bool(status.stdout.strip())
