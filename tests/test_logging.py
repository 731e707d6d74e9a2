import os
import subprocess
import sys

import iris


def test_log_lines_carry_rank_and_world(capsys):
    ctx = iris.iris(1 << 16)
    try:
        iris.set_logger_level(iris.INFO)
        ctx.info("hello there")
        ctx.debug("not shown")
        iris.set_logger_level("DEBUG")
        ctx.debug("now shown")
        ctx.warning("careful")
        ctx.error("broken")
    finally:
        iris.set_logger_level(iris.WARNING)
        ctx.close()
    err = capsys.readouterr().err
    assert "[Iris] [0/1] hello there" in err
    assert "not shown" not in err
    assert "[Iris] [0/1] now shown" in err and "[Iris] [0/1] careful" in err and "[Iris] [0/1] broken" in err


def test_log_level_from_environment():
    code = "import iris\nc = iris.iris(1 << 16)\nc.debug('dbg line')\nc.close()\n"
    # one process, no job: the default heap (a shmem heap needs torch.distributed, and says so)
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_HEAP", "IRIS_NODE_MAP")}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "IRIS_LOG_LEVEL": "DEBUG"},
                         capture_output=True, text=True, timeout=120)
    assert "[Iris] [0/1] dbg line" in out.stderr


def test_bad_level_is_refused():
    import pytest

    with pytest.raises(ValueError, match="log level"):
        iris.set_logger_level("LOUD")
