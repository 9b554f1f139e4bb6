"""The README runs as written (issue 35, item 5): every ```python and ```sh block of README.md is
run as it stands, in a fresh directory, with ``nyala`` on PATH. The Python tour starts its own
``nyala.LocalCluster``; the shell tour starts and stops a background ``local-cluster``. Blocks
fenced without a language (make, pip, the layout) are not run. The shell tour is marked
``slow``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
BLOCKS = [(kind, body) for kind, body in _BLOCK.findall(README.read_text())]


def _env(bin_dir: Path) -> dict[str, str]:
    """PATH with a ``nyala`` that runs this checkout's package (as ``pip install`` would)."""
    bin_dir.mkdir()
    shim = bin_dir / "nyala"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nyala.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "NYALA_MASTERS"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_readme_has_runnable_python_and_shell_blocks() -> None:
    kinds = [kind for kind, _ in BLOCKS]
    assert kinds.count("python") >= 2
    assert kinds.count("sh") >= 1


# The shell tour starts 3 masters and 3 tservers and runs a load generator (~1.5 min on two
# cores): it runs with the slow tests (part of `make test`); the Python blocks always run.
_PARAMS = [
    pytest.param(kind, body, id=f"{kind}-{i}", marks=[pytest.mark.slow] if kind == "sh" else [])
    for i, (kind, body) in enumerate(BLOCKS)
]


@pytest.mark.parametrize(("kind", "body"), _PARAMS)
def test_a_readme_block_runs_as_written(kind: str, body: str, tmp_path: Path) -> None:
    if kind == "sh" and "jq " in body and shutil.which("jq") is None:
        pytest.skip("the shell tour uses jq, which is not installed")
    env = _env(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    command = [sys.executable, "-c", body] if kind == "python" else ["bash", "-eu", "-c", body]
    try:
        done = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
        )
    finally:
        cluster = work / "nyala-cluster"
        if cluster.exists():  # stop what a failed shell tour left running
            subprocess.run(
                ["nyala", "local-cluster", "stop", "--dir", str(cluster)],
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )
    assert done.returncode == 0, f"{kind} block failed:\n{body}\n{done.stdout}\n{done.stderr}"
