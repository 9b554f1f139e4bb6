"""What a user does first after ``pip install nyala``, run inside a fresh venv by
``test_wheel.py`` (not collected by pytest: it needs the installed wheel, not the source tree).

A cluster of real processes (one master, one tablet server), rows inserted and scanned back
through the client and loaded and counted through the command line, ``nyala --version``, and
the optional-dependency paths: without pandas or PySpark installed, ``to_pandas`` and
``nyala.spark.register`` say which extra to install, while ``import nyala.spark`` works.
Prints one line per step and ``smoke OK``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import nyala
import nyala.spark
from nyala import errors

NYALA = str(Path(sys.executable).parent / "nyala")


def step(text: str) -> None:
    print(text, flush=True)


def check_installed() -> None:
    native = importlib.util.find_spec("nyala._native")
    assert native is not None
    assert native.origin is not None
    origin = Path(native.origin)
    site_packages = Path(sysconfig.get_paths()["platlib"])
    assert origin.is_relative_to(site_packages), f"nyala._native from {origin}, not the venv"
    assert origin.name == "_native.abi3.so", origin.name
    for absent in ("pandas", "pyspark", "pytest", "maturin"):
        assert importlib.util.find_spec(absent) is None, f"{absent} is installed"
    step(f"installed: {origin.name} (abi3) on Python {sys.version.split()[0]}, no dev tools")


def check_cluster(workdir: Path) -> None:
    with nyala.LocalCluster(masters=1, tservers=1, path=workdir / "cluster") as cluster:
        client = cluster.client
        schema = nyala.Schema.parse("id:int64, name:string?, v:double?", key=["id"])
        table = client.create_table(
            "smoke", schema, partitioning=nyala.HashPartitioning(["id"], buckets=2), replicas=1
        )
        result = table.insert({"id": [1, 2, 3], "name": ["a", "b", None], "v": [0.5, 1.5, 2.5]})
        assert result.ok, result.row_errors
        rows = table.scan(columns=["id", "name"]).to_arrow().sort_by("id").to_pylist()
        assert rows == [
            {"id": 1, "name": "a"},
            {"id": 2, "name": "b"},
            {"id": 3, "name": None},
        ], rows
        step("client: 3 rows inserted and scanned back")

        # The command line's loader and counter: Arrow and the client only, no PySpark.
        parquet = workdir / "more.parquet"
        pq.write_table(
            pa.table({"id": pa.array([4, 5], pa.int64()), "name": ["d", "e"], "v": [4.5, 5.5]}),
            parquet,
        )
        env_masters = ["--masters", cluster.masters]
        load = run_cli("table", "load", "smoke", str(parquet), *env_masters, "--format", "json")
        assert json.loads(load)["rows"] == 2, load
        count = run_cli("table", "count", "smoke", *env_masters, "--format", "json")
        assert json.loads(count)["rows"] == 5, count
        step("command line: 2 rows loaded from Parquet, 5 counted")

        message = missing_extra(lambda: table.scan().to_pandas())
        assert "pip install 'nyala[pandas]'" in message, message
        step("to_pandas without pandas: names nyala[pandas]")


def check_spark_free() -> None:
    assert nyala.spark.FILTER_PUSHDOWN_CONF
    message = missing_extra(lambda: nyala.spark.register(object()))
    assert "pip install 'nyala[spark]'" in message, message
    step("import nyala.spark without PySpark works; register names nyala[spark]")


def missing_extra(call: Callable[[], object]) -> str:
    """The message of the ``MissingDependencyError`` that ``call`` raises."""
    try:
        call()
    except errors.MissingDependencyError as missing:
        return str(missing)
    raise AssertionError("worked without its optional dependency")


def run_cli(*args: str) -> str:
    run = subprocess.run([NYALA, *args], capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"nyala {' '.join(args)}: exit {run.returncode}\n{run.stderr}"
    return run.stdout


def main() -> None:
    workdir = Path(sys.argv[1])
    check_installed()
    version = run_cli("--version").strip()
    assert version == f"nyala, version {nyala.__version__}", version
    step(f"nyala --version: {version}")
    check_spark_free()
    check_cluster(workdir)
    print("smoke OK")


if __name__ == "__main__":
    main()
