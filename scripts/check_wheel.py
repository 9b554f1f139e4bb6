#!/usr/bin/env python3
"""Checks what ``make wheel`` left in DIST before it is shipped (issue #37).

* exactly one wheel, tagged ``cp311-abi3-manylinux_2_28_x86_64``: one file for CPython 3.11 and
  every later 3.x, for glibc 2.28 and later;
* at most 30 MB unpacked (the native library without debug info);
* ``auditwheel show``: no external libraries, and the glibc symbols it needs allow
  manylinux_2_28 (not skipped: the tag is only true if this passes); ``objdump -T``: no glibc
  symbol version above 2.28;
* ``abi3audit --strict``: the native library uses only the stable ABI of CPython 3.11, so the
  interpreters the tag claims can load it;
* the sdist beside it.

Prints the sizes and exits non-zero on the first failed check. ``tests/packaging/test_wheel.py``
imports this module for the expected tag and size limit.

Usage: python scripts/check_wheel.py DIST_DIR
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: The one tag nyala's wheel carries.
EXPECTED_TAG = "cp311-abi3-manylinux_2_28_x86_64"
#: The newest glibc symbol version the wheel may need (its manylinux tag's floor).
GLIBC_MAX = (2, 28)
#: Unpacked size limit, bytes (30 MB).
UNPACKED_BYTES_MAX = 30_000_000

MB = 1_000_000


class CheckFailed(Exception):
    """A check did not pass; the message says which and why."""


def find_one(dist: Path, pattern: str) -> Path:
    """The one file in ``dist`` matching ``pattern``."""
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        raise CheckFailed(f"expected one {pattern} in {dist}, found {[p.name for p in found]}")
    return found[0]


def wheel_tag(wheel: Path) -> str:
    """``python-abi-platform`` from the file name ``name-version[-build]-py-abi-plat.whl``."""
    return "-".join(wheel.stem.split("-")[-3:])


def unpacked_bytes(wheel: Path) -> int:
    with zipfile.ZipFile(wheel) as archive:
        return sum(info.file_size for info in archive.infolist())


def dist_info(wheel: Path, name: str) -> str:
    """The text of ``*.dist-info/NAME`` in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            parent, _, base = member.rpartition("/")
            if parent.endswith(".dist-info") and "/" not in parent and base == name:
                return archive.read(member).decode()
    raise CheckFailed(f"{wheel.name} has no .dist-info/{name}")


def native_libraries(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [name for name in archive.namelist() if name.endswith(".so")]


def tool(name: str) -> str:
    """The command ``name`` from this interpreter's environment if it has one, else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def glibc_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def check_names(wheel: Path) -> None:
    tag = wheel_tag(wheel)
    if tag != EXPECTED_TAG:
        raise CheckFailed(f"{wheel.name}: tag {tag}, expected {EXPECTED_TAG}")
    tags = re.findall(r"^Tag: (.+)$", dist_info(wheel, "WHEEL"), flags=re.MULTILINE)
    if tags != [EXPECTED_TAG]:
        raise CheckFailed(f"{wheel.name}: WHEEL says Tag {tags}, expected {[EXPECTED_TAG]}")
    libraries = native_libraries(wheel)
    if [Path(name).name for name in libraries] != ["_native.abi3.so"]:
        raise CheckFailed(f"{wheel.name}: native libraries {libraries}, expected _native.abi3.so")


def check_size(wheel: Path) -> None:
    size = unpacked_bytes(wheel)
    if size > UNPACKED_BYTES_MAX:
        raise CheckFailed(
            f"{wheel.name}: {size / MB:.1f} MB unpacked, limit {UNPACKED_BYTES_MAX / MB:.0f} MB"
        )


def check_auditwheel(wheel: Path) -> None:
    command = [tool("auditwheel"), "show", "--json", str(wheel)]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise CheckFailed(f"auditwheel show failed:\n{run.stdout}{run.stderr}")
    report = json.loads(run.stdout)
    if report["external_libs"]:
        raise CheckFailed(f"auditwheel: external libraries {sorted(report['external_libs'])}")
    # overall_tag is the most compatible tag the wheel's contents allow; ours must not be older.
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", report["overall_tag"])
    if match is None or (int(match[1]), int(match[2])) > GLIBC_MAX:
        raise CheckFailed(f"auditwheel: the wheel only allows {report['overall_tag']}")
    print(f"auditwheel show: consistent with {report['overall_tag']}, no external libraries")


def check_glibc_symbols(wheel: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        for name in native_libraries(wheel):
            library = archive.extract(name, tmp)
            table = subprocess.run(
                ["objdump", "-T", library], capture_output=True, text=True, check=True
            ).stdout
            # Lines like "0000... w DF *UND* 0000... (GLIBC_2.28) statx": version, then symbol.
            needed = [
                (glibc_version(m[1]), m[2])
                for m in re.finditer(r"GLIBC_([0-9.]+)\)?\s+(\S+)$", table, flags=re.MULTILINE)
            ]
            too_new = sorted(symbol for version, symbol in needed if version > GLIBC_MAX)
            if too_new:
                raise CheckFailed(f"{name} needs glibc symbols newer than {GLIBC_MAX}: {too_new}")
            newest = ".".join(map(str, max(version for version, _ in needed)))
            print(f"objdump -T {Path(name).name}: newest glibc symbol version {newest}")


def check_abi3(wheel: Path) -> None:
    command = [tool("abi3audit"), "--strict", "--report", str(wheel)]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise CheckFailed(f"abi3audit failed:\n{run.stdout}{run.stderr}")
    (spec,) = json.loads(run.stdout)["specs"].values()
    for extension in spec["wheel"]:
        result = extension["result"]
        if not (result["is_abi3"] and result["is_abi3_baseline_compatible"]):
            raise CheckFailed(f"abi3audit: {extension['name']}: {result}")
        if result["non_abi3_symbols"] or result["future_abi3_objects"]:
            raise CheckFailed(f"abi3audit: {extension['name']} leaves the stable ABI: {result}")
        print(
            f"abi3audit --strict {extension['name']}: stable ABI only, tagged for "
            f"{result['baseline']}, needs {result['computed']}"
        )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    dist = Path(argv[1])
    try:
        wheel = find_one(dist, "nyala-*.whl")
        sdist = find_one(dist, "nyala-*.tar.gz")
        check_names(wheel)
        check_size(wheel)
        check_auditwheel(wheel)
        check_glibc_symbols(wheel)
        check_abi3(wheel)
    except CheckFailed as failure:
        print(f"check_wheel: {failure}", file=sys.stderr)
        return 1
    print(
        f"wheel OK: {wheel.name}: {wheel.stat().st_size / MB:.1f} MB, "
        f"{unpacked_bytes(wheel) / MB:.1f} MB unpacked; sdist {sdist.name}: "
        f"{sdist.stat().st_size / MB:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
