"""The built wheel as a user gets it (issue #37): its tags and size, and a fresh venv with
nothing but the wheel and its dependencies running ``wheel_smoke.py`` (a cluster of real
processes, the client, the command line, the paths without pandas and PySpark).

Skipped unless a wheel has been built: ``make wheel`` leaves it in ``dist/`` (``make test``
builds it before the Python tests), or ``NYALA_WHEEL`` names one. The smoke runs on the
interpreters named in ``NYALA_WHEEL_PYTHONS`` (paths, space-separated; the Makefile passes the
newest CPython ≥ 3.12 that pyenv has here), which is how the one abi3 wheel is seen to load on a
later CPython, or, when none is named, on the interpreter running these tests.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("wheel_smoke.py")
INSTALL_TIMEOUT_S = 600
SMOKE_TIMEOUT_S = 300


def load_checks() -> ModuleType:
    """``scripts/check_wheel.py``, the one definition of the expected tag and size limit."""
    spec = importlib.util.spec_from_file_location("check_wheel", REPO / "scripts/check_wheel.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built_wheels() -> list[Path]:
    named = os.environ.get("NYALA_WHEEL")
    if named:
        return [Path(named)]
    return sorted((REPO / "dist").glob("nyala-*.whl"))


WHEELS = built_wheels()
pytestmark = pytest.mark.skipif(
    not WHEELS, reason="no wheel built: run `make wheel`, or set NYALA_WHEEL to a wheel's path"
)
checks = load_checks()


@pytest.fixture(scope="module")
def wheel() -> Path:
    assert len(WHEELS) == 1, f"more than one wheel in dist/: {[w.name for w in WHEELS]}"
    return WHEELS[0]


def test_one_wheel_for_cpython_311_and_later_on_manylinux_2_28(wheel: Path) -> None:
    assert checks.wheel_tag(wheel) == "cp311-abi3-manylinux_2_28_x86_64"
    wheel_file = checks.dist_info(wheel, "WHEEL")
    assert re.findall(r"^Tag: (.+)$", wheel_file, flags=re.MULTILINE) == [checks.EXPECTED_TAG]
    assert "Requires-Python: >=3.11" in checks.dist_info(wheel, "METADATA")
    assert [Path(name).name for name in checks.native_libraries(wheel)] == ["_native.abi3.so"]


def test_wheel_is_at_most_30_mb_unpacked(wheel: Path) -> None:
    assert checks.UNPACKED_BYTES_MAX == 30_000_000
    assert checks.unpacked_bytes(wheel) <= checks.UNPACKED_BYTES_MAX


def test_native_library_has_no_debug_info(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = checks.native_libraries(wheel)
        library = archive.extract(name, tmp_path)
    sections = subprocess.run(
        ["readelf", "-S", "-W", library], capture_output=True, text=True, check=True
    ).stdout
    assert ".debug_" not in sections
    exported = subprocess.run(
        ["readelf", "--dyn-syms", "-W", library], capture_output=True, text=True, check=True
    ).stdout
    assert "PyInit__native" in exported


def interpreters() -> list[str]:
    """The Pythons named in ``NYALA_WHEEL_PYTHONS``, else the one running the tests.

    ``make test`` installs the wheel into .venv and runs the whole suite on that interpreter
    against it, so a fresh venv of the same interpreter adds only the check that the wheel's
    declared dependencies suffice, which a fresh venv of a later CPython makes as well.
    """
    named = os.environ.get("NYALA_WHEEL_PYTHONS", "").split()
    return named or [sys.executable]


def clean_env(venv: Path) -> dict[str, str]:
    """The environment without the development venv or the source tree on any path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.parametrize("python", interpreters())
def test_fresh_venv_installs_the_wheel_and_runs_a_cluster(
    wheel: Path, python: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    env = clean_env(venv)
    subprocess.run([python, "-m", "venv", str(venv)], check=True, env=env, cwd=tmp_path)
    install = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    smoke = subprocess.run(
        [str(venv / "bin/python"), str(SMOKE), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )
    print(smoke.stdout)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert smoke.stdout.splitlines()[-1] == "smoke OK"
