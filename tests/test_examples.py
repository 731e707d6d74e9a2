"""The examples run and validate as a user runs them: hello on 1 to 3 ranks, the GEMM + all-scatter ones
(the overlap taxonomy) on 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)

ROOT = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = ROOT / "02_gemm_all_scatter"


def _iris_run(n, script, *args):
    timeout = float(os.environ.get("IRIS_TEST_TIMEOUT", "300"))
    result = subprocess.run([sys.executable, "-m", "iris", "run", "-n", str(n), "--timeout", str(int(timeout)),
                             str(script), *args], capture_output=True, text=True, timeout=timeout + 60, check=False)
    return result.returncode, result.stdout + result.stderr


def test_hello_says_what_each_rank_did():
    code, output = _iris_run(3, ROOT / "00_hello" / "example.py", "--validate")
    assert code == 0, output[-4000:]
    assert "[rank 0] rank 0: stored 4096 ones into rank 1's buffer" in output, output
    assert "[rank 1] rank 1: received 4096 ones from rank 0" in output, output
    assert "[rank 2] rank 2: idle" in output, output


def test_hello_on_one_rank_says_it_needs_two():
    code, output = _iris_run(1, ROOT / "00_hello" / "example.py", "--validate")
    assert code == 2, output[-4000:]
    assert "needs at least 2 ranks" in output, output


@pytest.mark.parametrize("pattern", ["bulk_synchronous", "producer_consumer", "workgroup_specialization"])
def test_gemm_all_scatter_example_validates(pattern):
    code, output = _iris_run(2, EXAMPLES / f"{pattern}.py", "--validate", "--benchmark")
    assert code == 0, output[-4000:]
    assert output.count(": ok") == 2, output[-4000:]


def test_traced_gemm_all_scatter_validates_and_writes_every_ranks_timeline(tmp_path):
    import json

    trace = tmp_path / "trace.json"
    code, output = _iris_run(2, EXAMPLES / "traced.py", "--validate", "--trace", str(trace))
    assert code == 0, output[-4000:]
    assert output.count(": ok") == 2, output[-4000:]
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        names = {e["name"] for e in events if e["pid"] == rank}
        assert names == {"compute", "store"}, names
        stores = [e for e in events if e["pid"] == rank and e["name"] == "store"]
        assert {e["args"]["target_rank"] for e in stores} == {0, 1}


def _first_kernel(tmp_path):
    """README's "A first kernel", as a user pastes it into script.py."""
    readme = (ROOT.parent / "README.md").read_text()
    section = readme.split("## A first kernel", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "script.py"
    script.write_text(code)
    return script


def test_readmes_first_kernel_runs_on_two_ranks_and_explains_one(tmp_path):
    script = _first_kernel(tmp_path)
    code, output = _iris_run(2, script)
    assert code == 0, output[-4000:]
    code, output = _iris_run(1, script)
    assert code == 1 and "run me on 2 ranks or more" in output, output[-4000:]
