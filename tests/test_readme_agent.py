"""The README's "Writing an agent" example runs: its code is executed as written, with the last call
shortened (2 log points of 20 updates instead of 20 of 100) to keep the test quick."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def writing_an_agent_block() -> str:
    text = README.read_text()
    section = text[text.index("## Writing an agent"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_writing_an_agent_example_runs_and_reports_episodes(monkeypatch):
    monkeypatch.chdir(README.parent)  # the example loads configs/ by a relative path
    code = writing_an_agent_block()
    last_call = "_, metrics = jax.jit(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(0), 4))"
    assert last_call in code, "the example's final call changed: update this test"
    code = code.replace(last_call, "_, metrics = jax.jit(jax.vmap(lambda k: train(k, 2, 20)))(jax.random.split(jax.random.PRNGKey(0), 2))")
    namespace = {}
    exec(compile(code, str(README), "exec"), namespace)
    metrics = namespace["metrics"]
    np.testing.assert_array_equal(np.asarray(metrics["step"])[0], [20 * 8 * 16, 2 * 20 * 8 * 16])
    assert np.all(np.asarray(metrics["episodes"]) > 0) and np.all(np.isfinite(np.asarray(metrics["episode_return"])))
