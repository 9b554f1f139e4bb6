"""nyala's Spark integration: the PySpark Python data source ``nyala`` (DESIGN.md §9, §10).

Usage (PySpark ≥ 4.0, ``pip install nyala[spark]``)::

    import nyala.spark
    nyala.spark.register(spark)
    df.write.format("nyala").option("nyala.masters", M).option("nyala.table", T) \\
        .option("nyala.operation", "upsert").mode("append").save()
    spark.read.format("nyala").option("nyala.masters", M).option("nyala.table", T).load()

This package owns the data source (``source``), its options (``options``), the Spark ↔ nyala
type and schema mapping (``schema_map``), filter pushdown (``filters``) and the Spark-free write
core that ``nyala table load`` shares (``load``). pyspark is imported only by ``source`` and
``filters``, and only when a Spark job needs them, so ``import nyala.spark`` works without it.
"""

from __future__ import annotations

from typing import Any

from nyala.common.extras import require

#: The Spark SQL conf that lets a Python data source receive filters (off by default in
#: PySpark 4.1+, where a reader that implements ``pushFilters`` fails while it is off).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Registers format ``nyala`` on the SparkSession ``spark`` and turns on Python data
    source filter pushdown for it. Without PySpark 4.0 or later (its Python data source API),
    ``MissingDependencyError`` names the extra to install."""
    require("pyspark.sql.datasource", extra="spark", needed_by="nyala.spark.register")
    from nyala.spark.source import NyalaDataSource

    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    spark.dataSource.register(NyalaDataSource)


__all__ = ["FILTER_PUSHDOWN_CONF", "register"]
