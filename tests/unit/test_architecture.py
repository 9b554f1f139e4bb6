"""The plan of the house, checked: every import in ``python/nyala`` points down the layers of
DESIGN.md §2, and the Rust core crates know nothing of Python.

Layers (a module may import its own layer and the ones listed for it)::

    cli ─► everything             (nothing imports cli)
    chaos ─► testing, client      local_cluster ─► testing, client
    spark ─► client ─► rpc        testing ─► rpc, consensus core (EntryKind)
    master, tserver ─► server ─► tablet ─► consensus core, storage
                                 consensus runtime ─► consensus core, rpc
    storage, rowops, partition ─► schema;  rpc ─► schema, security (─► foundation)
    common (─► errors, _native), errors, _native, _proto: importable from everywhere

Masters and tablet servers never import each other: they meet on the wire. Imports are read
from the source (``ast``), including those inside functions and ``TYPE_CHECKING`` blocks: a
lazy import is still a dependency. ``from nyala import X`` counts as an import of ``nyala.X``
when ``X`` is a module; otherwise it reaches for the package's public face, which only the
command line may do.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "nyala"

FOUNDATION = frozenset({"errors", "common", "_native", "_proto"})
#: What masters and tablet servers may stand on (never on each other).
SERVER_SIDE = frozenset(
    {
        "server",
        "tablet",
        "consensus",
        "consensus.runtime",
        "storage",
        "rpc",
        "schema",
        "rowops",
        "partition",
        "security",
    }
)
#: Layer -> the other layers it may import (besides itself and the foundation).
ALLOWED: dict[str, frozenset[str]] = {
    "schema": frozenset(),
    "rowops": frozenset({"schema"}),
    "partition": frozenset({"schema"}),
    "storage": frozenset({"schema", "rowops"}),
    "security": frozenset(),
    "rpc": frozenset({"schema", "security"}),
    "consensus": frozenset(),
    "consensus.runtime": frozenset({"consensus", "rpc", "schema"}),
    "tablet": frozenset({"consensus", "consensus.runtime", "storage", "schema", "rowops"}),
    "server": SERVER_SIDE - {"server", "partition"},
    "master": SERVER_SIDE,
    "tserver": SERVER_SIDE,
    "client": frozenset({"rpc", "schema", "rowops", "partition", "security"}),
    "spark": frozenset({"client", "rpc", "schema", "rowops", "partition", "security"}),
    "testing": frozenset({"rpc", "schema", "rowops", "partition", "consensus", "security"}),
    "local_cluster": frozenset(
        {"testing", "client", "rpc", "schema", "rowops", "partition", "security"}
    ),
    "chaos": frozenset({"testing", "client", "rpc", "schema", "rowops", "partition", "consensus"}),
}
#: Layers that may import anything: the command line, and the package's lazy public face.
TOP = frozenset({"cli", "nyala"})
#: What the consensus core must never reach, even through the foundation.
CORE_FORBIDDEN_FOUNDATION = frozenset({"_native", "_proto"})

#: Rust crates that form the core: no pyo3, and no arrow "pyarrow" feature (which pulls pyo3).
RUST_CORE_CRATES = ("rust/common", "rust/wal", "rust/storage", "rust/consensus", "rust/copy")
PYTHON_FEATURES = frozenset({"pyarrow", "pyo3", "python"})


@dataclass(frozen=True)
class Import:
    """One ``import`` edge: ``module`` (as named in the file) at ``path:line``."""

    path: str
    line: int
    source_module: str
    module: str


def layer_of(module: str) -> str | None:
    """The layer of a ``nyala.*`` module (None outside the package)."""
    parts = module.split(".")
    if parts[0] != "nyala":
        return None
    if len(parts) == 1:
        return "nyala"
    if parts[1] == "consensus" and len(parts) > 2 and parts[2] == "runtime":
        return "consensus.runtime"
    return parts[1]


def module_name(path: Path, root: Path) -> str:
    """``nyala.x.y`` for ``root/nyala/x/y.py`` (``__init__`` names its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, path: str, source_module: str, is_module: set[str]) -> Iterator[Import]:
    """Every absolute import of a ``nyala`` module in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, source_module, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "nyala":
                for alias in node.names:
                    name = f"nyala.{alias.name}"
                    yield Import(
                        path, node.lineno, source_module, name if name in is_module else "nyala"
                    )
            else:
                yield Import(path, node.lineno, source_module, node.module)


def violation(edge: Import) -> str | None:
    """Why ``edge`` points the wrong way, or None if it is allowed."""
    source, target = layer_of(edge.source_module), layer_of(edge.module)
    if source is None or target is None or source == target:
        return None
    where = f"{edge.path}:{edge.line}: {edge.source_module} imports {edge.module}"
    if target == "cli":
        return f"{where} (nothing imports the command line)"
    if source in TOP:
        return None
    if target == "nyala":
        return f"{where} (the package's public face; import the defining module)"
    if source in FOUNDATION:
        if source == "common" and target in ("errors", "_native"):
            return None
        return f"{where} (the foundation imports nothing above it)"
    if source == "consensus" and target in CORE_FORBIDDEN_FOUNDATION:
        return f"{where} (the consensus core is sans-I/O: no native extension, no protobufs)"
    if target in FOUNDATION:
        return None
    if source not in ALLOWED:
        return f"{where} (layer {source!r} is not in the plan: add it to ALLOWED)"
    if target not in ALLOWED[source]:
        return f"{where} ({source} may import only {sorted(ALLOWED[source])} and the foundation)"
    return None


def package_imports(package: Path) -> list[Import]:
    """Every ``nyala`` import in the package's sources (generated protobuf code aside)."""
    root = package.parent
    sources = [p for p in sorted(package.rglob("*.py")) if "_proto" not in p.parts]
    is_module = {module_name(p, root) for p in sources} | {"nyala._native", "nyala._proto"}
    edges: list[Import] = []
    for path in sources:
        rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        edges.extend(imports_in(path.read_text(), rel, module_name(path, root), is_module))
    return edges


def test_every_python_import_points_down_the_layers() -> None:
    found = [v for v in map(violation, package_imports(PACKAGE)) if v is not None]
    assert not found, "imports that point the wrong way:\n" + "\n".join(found)


def test_every_package_is_in_the_plan() -> None:
    layers = {layer_of(module_name(p, PACKAGE.parent)) for p in PACKAGE.rglob("*.py")}
    unplanned = layers - set(ALLOWED) - FOUNDATION - TOP - {None}
    assert not unplanned, f"layers missing from ALLOWED: {sorted(x for x in unplanned if x)}"


@pytest.mark.parametrize(
    ("source_module", "module", "expected"),
    [
        ("nyala.master.server", "nyala.tserver.heartbeater", "master may import only"),
        ("nyala.tserver.server", "nyala.master.catalog", "tserver may import only"),
        ("nyala.consensus.core", "nyala.consensus.runtime.transport", "consensus may import"),
        ("nyala.consensus.core", "nyala.rpc.channel", "consensus may import only"),
        ("nyala.consensus.log", "nyala._native", "sans-I/O"),
        ("nyala.consensus.runtime.wire", "nyala.tablet.replica", "consensus.runtime may import"),
        ("nyala.client.table", "nyala.cli.output", "nothing imports the command line"),
        ("nyala.testing.mini_cluster", "nyala.cli.process", "nothing imports the command line"),
        ("nyala.rpc.channel", "nyala.client.rpc", "rpc may import only"),
        ("nyala.chaos.client_run", "nyala", "public face"),
        ("nyala.common.clock", "nyala.schema", "foundation imports nothing above"),
        ("nyala.newpart.x", "nyala.schema", "not in the plan"),
    ],
)
def test_a_planted_wrong_way_import_is_reported(
    source_module: str, module: str, expected: str
) -> None:
    found = violation(Import("planted.py", 1, source_module, module))
    assert found is not None
    assert expected in found


def test_a_planted_wrong_way_import_in_a_source_tree_is_found(tmp_path: Path) -> None:
    (tmp_path / "nyala" / "consensus").mkdir(parents=True)
    (tmp_path / "nyala" / "rpc").mkdir()
    (tmp_path / "nyala" / "__init__.py").write_text("")
    (tmp_path / "nyala" / "rpc" / "__init__.py").write_text("")
    (tmp_path / "nyala" / "consensus" / "__init__.py").write_text("")
    (tmp_path / "nyala" / "consensus" / "core.py").write_text(
        "def f():\n    from nyala.rpc import channel\n    return channel\n"
    )
    found = [v for v in map(violation, package_imports(tmp_path / "nyala")) if v]
    assert len(found) == 1
    assert "nyala.consensus.core imports nyala.rpc" in found[0]


def test_allowed_imports_pass() -> None:
    for source_module, module in [
        ("nyala.master.server", "nyala.server.base"),
        ("nyala.tserver.server", "nyala.server.consensus_service"),
        ("nyala.consensus.runtime.transport", "nyala.rpc.channel"),
        ("nyala.consensus.core", "nyala.errors"),
        ("nyala.cli.demo", "nyala"),
        ("nyala.spark.source", "nyala.client"),
    ]:
        assert violation(Import("ok.py", 1, source_module, module)) is None


def crate_python_dependencies(manifest: dict[str, object]) -> list[str]:
    """Dependencies of a crate manifest that bring Python in: pyo3 itself, or a feature of
    another crate that does (arrow's ``pyarrow``)."""
    found = []
    for section in ("dependencies", "dev-dependencies", "build-dependencies"):
        deps = manifest.get(section, {})
        assert isinstance(deps, dict)
        for name, spec in deps.items():
            if "pyo3" in name:
                found.append(f"{section}: {name}")
            features = spec.get("features", []) if isinstance(spec, dict) else []
            found.extend(f"{section}: {name} feature {f}" for f in features if f in PYTHON_FEATURES)
    return found


@pytest.mark.parametrize("crate", RUST_CORE_CRATES)
def test_rust_core_crates_never_depend_on_pyo3(crate: str) -> None:
    manifest = tomllib.loads((REPO / crate / "Cargo.toml").read_text())
    assert crate_python_dependencies(manifest) == []
    sources = "\n".join(p.read_text() for p in (REPO / crate).rglob("*.rs"))
    assert "pyo3" not in sources


def test_a_planted_pyo3_dependency_is_reported() -> None:
    manifest = tomllib.loads(
        '[dependencies]\npyo3 = "0.29"\narrow = { workspace = true, features = ["pyarrow"] }\n'
    )
    assert crate_python_dependencies(manifest) == [
        "dependencies: pyo3",
        "dependencies: arrow feature pyarrow",
    ]


def test_importing_the_consensus_core_loads_neither_grpc_nor_the_client() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, nyala.consensus, nyala.consensus.sim_cluster, nyala.storage; "
        "print(sorted(m for m in ('grpc', 'nyala.client', 'nyala.rpc') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
