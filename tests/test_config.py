"""The switches of iris.config: defaults and how a user turns each off."""

import ast
from pathlib import Path

import pytest

from iris import config


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("on", True), ("0", False), ("off", False),
                                       ("false", False), ("no", False)])
@pytest.mark.parametrize("name, read", [("IRIS_GRAPH_REPLAY", config.graph_replay),
                                        ("IRIS_NATIVE_REPLAY", config.native_replay)])
def test_graph_replay_and_its_native_launch_are_on_unless_turned_off(monkeypatch, value, on, name, read):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert read() is on


SWITCHES = {"IRIS_GRAPH_REPLAY": config.graph_replay, "IRIS_NATIVE_REPLAY": config.native_replay,
            "IRIS_DEBUG": config.debug_requested, "IRIS_SIMULATION": config.simulation, "IRIS_LL_PACK": config.ll_pack}


# Every switch the table declares (IRIS_QUIET_AMD_OPTIONS, IRIS_CPU_CUDA, IRIS_CPU_BIND and the rest), from config
TABLE_SWITCHES = [variable.name for variable in config.VARIABLES if variable.kind == "switch"]


def test_the_table_declares_the_switches_that_config_reads_as_switches():
    """A name read through switch() is a switch of the table (so check_switches() and ``iris info`` see it), and a
    switch of the table is read through switch()."""
    tree = ast.parse(Path(config.__file__).read_text())
    read = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "switch" and node.args
            and isinstance(node.args[0], ast.Constant)}
    assert read and sorted(read) == sorted(TABLE_SWITCHES)
    assert {"IRIS_QUIET_AMD_OPTIONS", "IRIS_CPU_CUDA", "IRIS_CPU_BIND", "IRIS_DEBUG"} <= set(TABLE_SWITCHES)


@pytest.mark.parametrize("name", SWITCHES)
def test_a_switch_given_a_word_it_does_not_know_says_so(monkeypatch, name):
    """A typo (``IRIS_DEBUG=ture``) must not leave a switch silently off."""
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=f"{name}='maybe'.*0, false, no or off"):
        SWITCHES[name]()


@pytest.mark.parametrize("name", TABLE_SWITCHES)
def test_every_switch_refuses_a_word_naming_the_variable_the_value_and_the_accepted_spellings(monkeypatch, name):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError) as refused:
        config.switch(name)
    message = str(refused.value)
    assert message.startswith(f"{name}='maybe'"), message
    assert "1, true, yes or on" in message and "0, false, no or off" in message, message
    with pytest.raises(ValueError, match=f"{name}='maybe'"):
        config.check_switches()


@pytest.mark.parametrize("value, on", [("TRUE", True), (" On ", True), ("yes", True), ("Off", False), ("NO", False),
                                       ("0", False), ("", None)])
def test_every_spelling_of_on_and_off_is_read_alike(monkeypatch, value, on):
    for name in TABLE_SWITCHES:
        monkeypatch.setenv(name, value)
        default = {"1": True, "0": False}.get(next(v.default for v in config.VARIABLES if v.name == name))
        assert config.switch(name) is (default if on is None else on), name
    config.check_switches()  # every switch readable: nothing refused


def test_check_switches_passes_when_every_switch_is_unset(monkeypatch):
    for name in TABLE_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    config.check_switches()


@pytest.mark.parametrize("name", ["IRIS_DEBUG", "IRIS_SIMULATION", "IRIS_LL_PACK"])
@pytest.mark.parametrize("value, on", [(None, False), ("1", True), ("TRUE", True), ("0", False), ("", False)])
def test_debug_and_simulation_are_off_unless_turned_on(monkeypatch, name, value, on):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    unset = name == "IRIS_LL_PACK" and not value  # ll's packing: its own choice by size (None) unless set
    assert SWITCHES[name]() is (None if unset else on)


@pytest.mark.parametrize("value, numel, packed", [(None, 32768, False), (None, 32769, True), ("0", 1 << 17, False),
                                                  ("1", 1, True)])
def test_ll_packs_16_bit_elements_past_its_unpacked_capacity_unless_told(monkeypatch, value, numel, packed):
    from iris.ccl.all_reduce.push import ll_elements, ll_pack

    if value is None:
        monkeypatch.delenv("IRIS_LL_PACK", raising=False)
    else:
        monkeypatch.setenv("IRIS_LL_PACK", value)
    assert ll_pack(2, numel) == (2 if packed else 1)
    assert ll_pack(4, numel) == 1  # 32-bit elements: one a word
    assert ll_elements(2) == (32768 if value == "0" else 256 << 10)  # unset: packed 16-bit messages to 512 KiB
    assert ll_elements(4) == (128 << 10 if value == "1" else 32768)


@pytest.mark.parametrize("name", SWITCHES)
def test_a_context_refuses_a_switch_it_cannot_read_before_allocating(monkeypatch, name):
    import iris

    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(ValueError, match=f"{name}='sometimes'"):
        iris.iris(1 << 20)


@pytest.mark.parametrize("name", ["IRIS_QUIET_AMD_OPTIONS", "IRIS_CPU_BIND"])
def test_a_context_refuses_every_switch_it_cannot_read(monkeypatch, name):
    import iris

    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(ValueError, match=f"{name}='sometimes'"):
        iris.iris(1 << 20).close()


@pytest.mark.parametrize("value, worlds", [(None, (2,)), ("8", (8,)), ("4, 8", (4, 8)), ("2,3,4", (2, 3, 4))])
def test_the_test_worlds_are_2_unless_named(monkeypatch, value, worlds):
    if value is None:
        monkeypatch.delenv("IRIS_TEST_WORLDS", raising=False)
    else:
        monkeypatch.setenv("IRIS_TEST_WORLDS", value)
    assert config.test_worlds() == worlds


@pytest.mark.parametrize("value", ["", "1", "two", "4,0", "2,,4"])
def test_test_worlds_that_are_not_sizes_of_two_or_more_are_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("IRIS_TEST_WORLDS", value)
    with pytest.raises(ValueError, match="IRIS_TEST_WORLDS"):
        config.test_worlds()
