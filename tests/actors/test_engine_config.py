"""The Ray settings a run brings: calls inline up to ``INLINE_ARGS_BYTES``."""

from __future__ import annotations

import pytest

from actors import engine


def test_a_cluster_we_start_sends_calls_inline_up_to_one_mib(monkeypatch) -> None:
    monkeypatch.delenv(engine.INLINE_ARGS_ENV, raising=False)
    config = engine.ray_system_config()
    assert config["max_direct_call_object_size"] == engine.INLINE_ARGS_BYTES == 1 << 20
    # an existing cluster's workers get it from the job's environment
    assert engine.inline_args_env() == {"RAY_max_direct_call_object_size": "1048576"}


@pytest.mark.parametrize("value", ["102400", "4194304"])
def test_a_users_setting_wins(monkeypatch, value: str) -> None:
    monkeypatch.setenv(engine.INLINE_ARGS_ENV, value)
    assert "max_direct_call_object_size" not in engine.ray_system_config()  # Ray reads the env
    assert engine.inline_args_env() == {"RAY_max_direct_call_object_size": value}
