"""The GEMM + all-scatter examples (the overlap taxonomy) run and validate on 2 ranks, as a user runs them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "02_gemm_all_scatter"


@pytest.mark.parametrize("pattern", ["bulk_synchronous", "producer_consumer", "workgroup_specialization"])
def test_gemm_all_scatter_example_validates(pattern):
    timeout = float(os.environ.get("IRIS_TEST_TIMEOUT", "300"))
    result = subprocess.run([sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", str(int(timeout)),
                             str(EXAMPLES / f"{pattern}.py"), "--validate", "--benchmark"],
                            capture_output=True, text=True, timeout=timeout + 60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count(": ok") == 2, output[-4000:]
