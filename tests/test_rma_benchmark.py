"""benchmarks/rma.py --pairs all measures and validates every ordered pair of ranks (CPU: a smoke test)."""

import pytest

from benchmark_runs import import_benchmark, run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_rma_benchmark_covers_every_ordered_pair(tmp_path):
    rows = run_benchmark("rma.py", 3, "--sizes", "64K", "--iters", "1", "--warmup", "0", "--validate", "--pairs", "all",
                         csv_path=tmp_path / "rma.csv")
    pairs = {(int(r["actor"]), int(r["peer"])) for r in rows}
    assert pairs == {(a, b) for a in range(3) for b in range(3) if a != b}, pairs
    for pair in pairs:  # the four device ops, and one copy-engine row: a link copy where the peer has its own
        ops = sorted(r["op"] for r in rows if (int(r["actor"]), int(r["peer"])) == pair)  # GPU, else a local one
        assert ops[1:] == ["get", "load", "put", "store"], (pair, ops)
        assert ops[0] in ("copy_engine", "copy_engine_local"), (pair, ops)



def test_rma_benchmark_with_tracing_validates_and_records_every_op(tmp_path):
    """--trace: the kernel built to record each program's op, tracing on for the run; the data still exact."""
    rows = run_benchmark("rma.py", 2, "--sizes", "64K", "--iters", "1", "--warmup", "0", "--validate", "--trace",
                         csv_path=tmp_path / "rma.csv")
    assert {r["trace"] for r in rows} == {"1"} and {"get", "load", "put", "store"} <= {r["op"] for r in rows}

def test_plot_with_many_pairs_draws_one_line_per_op_with_the_spread_of_the_pairs():
    bandwidth_by_op = import_benchmark("rma").bandwidth_by_op
    MiB = 1 << 20
    rows = [{"actor": a, "peer": p, "op": op, "bytes": size * MiB, "gbps": gbps}
            for (a, p, op, size, gbps) in [(0, 1, "put", 1, 10.0), (1, 0, "put", 1, 30.0), (0, 2, "put", 1, 20.0),
                                           (0, 1, "put", 2, 40.0), (1, 0, "put", 2, 40.0), (0, 2, "put", 2, 50.0),
                                           (0, 1, "get", 1, 5.0)]]
    lines = bandwidth_by_op(rows)
    assert list(lines) == ["put", "get"]
    assert lines["put"] == [(1.0, 10.0, 20.0, 30.0), (2.0, 40.0, 40.0, 50.0)]  # (MiB, min, median, max)
    assert lines["get"] == [(1.0, 5.0, 5.0, 5.0)]
