"""The tree is formatted and linted: `ruff format --check` and `ruff check` (100 columns; the
rules in pyproject.toml's [tool.ruff]) pass on every file, so nothing unformatted lands."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: `pip install -e .[test]` installs it")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_format_leaves_every_file_unchanged():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check_finds_nothing():
    result = ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr
