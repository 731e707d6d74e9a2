"""What every benchmark's results carry: the commit, and a tidy CSV under benchmarks/results/."""

import csv
import os
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    """The commit the results belong to.

    IRIS_COMMIT when set (a copy of a working tree whose .git is stale or absent, as on the GPU
    machines: ``IRIS_COMMIT=$(git rev-parse --short HEAD)`` where the tree came from); otherwise
    the checkout's short commit, with "-dirty" when files differ from it; "unknown" without git.
    """
    if os.environ.get("IRIS_COMMIT"):
        return os.environ["IRIS_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                             cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10,
                             check=False)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"CSV: {path}")
