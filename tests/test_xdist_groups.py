"""The suite's pytest-xdist groups (tests/conftest.py) reach the workers: under `--dist loadgroup`
(.ci/run, .ci/gpu_suite.sh) every test's node id carries its group after an "@", which is what
keeps a module's tests, and the programs its fixtures compile, on one worker."""

from __future__ import annotations

import os

import pytest


def test_a_test_under_loadgroup_carries_its_modules_group(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("checks runs under pytest-xdist's --dist loadgroup (.ci/run)")
    nodeid = request.node.nodeid
    assert nodeid.endswith("@tests/test_xdist_groups.py"), (
        f"{nodeid}: pytest-xdist did not append the test's group (a pytest this xdist cannot "
        "mark; see the pytest pin in pyproject.toml)"
    )
