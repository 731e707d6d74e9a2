"""The switches of iris.config: defaults and how a user turns each off."""

import pytest

from iris import config


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("on", True), ("0", False), ("off", False),
                                       ("false", False), ("no", False)])
def test_graph_replay_is_on_unless_turned_off(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("IRIS_GRAPH_REPLAY", raising=False)
    else:
        monkeypatch.setenv("IRIS_GRAPH_REPLAY", value)
    assert config.graph_replay() is on


def test_a_switch_given_a_word_it_does_not_know_says_so(monkeypatch):
    monkeypatch.setenv("IRIS_GRAPH_REPLAY", "maybe")
    with pytest.raises(ValueError, match="IRIS_GRAPH_REPLAY='maybe'.*0 or 1"):
        config.graph_replay()


def test_a_context_refuses_a_switch_it_cannot_read_before_allocating(monkeypatch):
    import iris

    monkeypatch.setenv("IRIS_GRAPH_REPLAY", "sometimes")
    with pytest.raises(ValueError, match="IRIS_GRAPH_REPLAY='sometimes'"):
        iris.iris(1 << 20)
