"""`iris info`: what a bug report needs about this machine and this process, without starting a job."""

import json
import os
import subprocess
import sys

import pytest
import torch
import triton

import iris


def _info(*args, **env):
    environment = {name: value for name, value in os.environ.items() if name != "IRIS_GRAPH_REPLAY"} | env
    return subprocess.run([sys.executable, "-m", "iris", "info", *args], capture_output=True, text=True, timeout=120,
                          env=environment)


def test_info_names_versions_backend_devices_and_switches():
    proc = _info()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"iris {iris.__version__}" in out
    assert f"torch {torch.__version__}" in out and f"triton {triton.__version__}" in out
    assert f"backend: {iris.runtime.SELECTED}" in out
    assert "IRIS_GRAPH_REPLAY" in out and "heap provider: ipc" in out


def test_info_as_json_holds_the_same_facts():
    proc = _info("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["versions"]["iris"] == iris.__version__
    assert facts["backend"]["name"] == iris.runtime.SELECTED
    replay = facts["switches"]["IRIS_GRAPH_REPLAY"]
    assert replay["value"] == "" and replay["means"].startswith("on (default)"), replay
    assert ("no effect on the cpu backend" in replay["means"]) == (iris.runtime.SELECTED == "cpu"), replay
    if iris.runtime.SELECTED == "cpu":
        assert facts["devices"] == []
        assert any(gap["feature"] == "cuda_graph" for gap in facts["gaps"])


@pytest.mark.slow
def test_info_reports_a_setting_it_cannot_read_instead_of_failing():
    proc = _info("--json", IRIS_GRAPH_REPLAY="sometimes", IRIS_HEAP="nvlink")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    switches = json.loads(proc.stdout)["switches"]
    assert switches["IRIS_GRAPH_REPLAY"]["value"] == "sometimes" and "refused" in switches["IRIS_GRAPH_REPLAY"]["means"]
    assert switches["IRIS_HEAP"]["value"] == "nvlink" and "not a heap provider" in switches["IRIS_HEAP"]["means"]


def test_the_native_replay_says_where_it_changes_nothing():
    """The C path launches graphs by the CUDA driver: on HIP (graph.replay()) and the CPU (no graphs) it is
    on in name only, and iris info says so."""
    from iris.launch.info import native_replay_meaning

    assert native_replay_meaning(True, "cuda") == "on: repeated calls launched from C"
    assert native_replay_meaning(False, "cuda") == "off"
    assert "no effect on the hip backend" in native_replay_meaning(True, "hip")
    assert "no effect on the cpu backend" in native_replay_meaning(True, "cpu")
