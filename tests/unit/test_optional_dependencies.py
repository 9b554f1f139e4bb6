"""A feature whose optional dependency is missing says which extra to install (issue #37).

The dependency is hidden by a ``None`` entry in ``sys.modules``, which makes its import fail as
if it were not installed.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from nyala.client.scanner import Scanner
from nyala.common.extras import require
from nyala.errors import MissingDependencyError, NyalaError


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_error_is_a_nyala_error_and_an_import_error() -> None:
    assert issubclass(MissingDependencyError, NyalaError)
    assert issubclass(MissingDependencyError, ImportError)


def test_require_returns_the_module_when_it_is_there() -> None:
    assert require("json", extra="none", needed_by="this test") is sys.modules["json"]


def test_to_pandas_without_pandas_names_the_pandas_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "pandas")
    read: list[bool] = []

    def to_arrow() -> pa.Table:
        read.append(True)
        return pa.table({"id": [1]})

    # The method alone, on a stand-in scanner: no cluster is needed to reach the import.
    scanner: Any = SimpleNamespace(to_arrow=to_arrow)
    with pytest.raises(MissingDependencyError) as caught:
        Scanner.to_pandas(scanner)
    message = str(caught.value)
    assert "Scanner.to_pandas needs pandas" in message
    assert "pip install 'nyala[pandas]'" in message
    assert caught.value.extra == "pandas"
    assert caught.value.name == "pandas"
    assert isinstance(caught.value.__cause__, ImportError)
    assert not read, "the scan must not run when its result cannot be converted"


def test_to_pandas_with_pandas_converts(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pandas")
    scanner: Any = SimpleNamespace(to_arrow=lambda: pa.table({"id": [1, 2]}))
    assert Scanner.to_pandas(scanner)["id"].tolist() == [1, 2]


def test_spark_register_without_pyspark_names_the_spark_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import nyala.spark

    hide(monkeypatch, "pyspark", "pyspark.sql", "pyspark.sql.datasource")
    session = SimpleNamespace()  # register must fail before it touches the session
    with pytest.raises(MissingDependencyError) as caught:
        nyala.spark.register(session)
    message = str(caught.value)
    assert "nyala.spark.register needs pyspark" in message
    assert "pip install 'nyala[spark]'" in message
    assert caught.value.extra == "spark"


def test_import_nyala_spark_needs_no_pyspark() -> None:
    # A fresh interpreter, so no earlier test has imported PySpark already.
    code = "import sys; sys.modules['pyspark'] = None; import nyala.spark; nyala.spark.register"
    subprocess.run([sys.executable, "-c", code], check=True)
