"""What every benchmark's results carry: the commit, and a tidy CSV under benchmarks/results/."""

import csv
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    """The short commit of this checkout, or "unknown" (a copy without git, as on the GPU machines)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
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
