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
    if iris.runtime.SELECTED == "cpu":  # a sparse heap: what the machine's shared memory can back
        assert "heap memory: sparse POSIX shared memory" in out and "free)" in out, out


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
    from iris.runtime import backend_class

    assert native_replay_meaning(True, backend_class("cuda")) == "on: repeated calls launched from C"
    assert native_replay_meaning(False, backend_class("cuda")) == "off"
    assert "no effect on the hip backend" in native_replay_meaning(True, backend_class("hip"))
    assert "no effect on the cpu backend" in native_replay_meaning(True, backend_class("cpu"))


def test_info_shows_every_setting_the_config_table_declares_for_users(monkeypatch):
    """The switch list comes from iris.config.VARIABLES (every switch and setting a user sets), so a new one
    cannot be left out: IRIS_CPU_CUDA, IRIS_QUIET_AMD_OPTIONS and IRIS_HEAP_BASES_PREFIX included."""
    from iris import config
    from iris.launch.info import collect, render

    monkeypatch.setenv("IRIS_QUIET_AMD_OPTIONS", "maybe")
    monkeypatch.setenv("IRIS_HEAP_BASES_PREFIX", "run7")
    facts = collect()
    users = [v.name for v in config.VARIABLES if v.kind in ("switch", "setting")]
    assert list(facts["switches"]) == users
    assert {"IRIS_CPU_CUDA", "IRIS_QUIET_AMD_OPTIONS", "IRIS_HEAP_BASES_PREFIX", "IRIS_CPU_BIND"} <= set(users)
    quiet = facts["switches"]["IRIS_QUIET_AMD_OPTIONS"]
    assert quiet["value"] == "maybe" and quiet["means"].startswith("refused: IRIS_QUIET_AMD_OPTIONS='maybe'"), quiet
    assert facts["switches"]["IRIS_HEAP_BASES_PREFIX"]["value"] == "run7"
    assert "run7_rank_<r>_heap_bases.json" in facts["switches"]["IRIS_HEAP_BASES_PREFIX"]["means"]
    text = render(facts)
    assert all(f"  {name} " in text for name in users), text
    # a switch or setting without words of its own in info: on or off, its value, or its default, said so
    monkeypatch.delenv("IRIS_NODE_MAP", raising=False)
    monkeypatch.setenv("IRIS_DEBUG", "")
    switches = collect()["switches"]
    assert switches["IRIS_DEBUG"]["means"] == "off (default)"
    assert switches["IRIS_NODE_MAP"]["means"] == "from the ranks' host names (default)"
    monkeypatch.setenv("IRIS_DEBUG", "Yes")
    monkeypatch.setenv("IRIS_NODE_MAP", "0,1")
    switches = collect()["switches"]
    assert switches["IRIS_DEBUG"]["means"] == "on" and switches["IRIS_NODE_MAP"]["means"] == "0,1"
