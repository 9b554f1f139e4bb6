"""Type stub for the private native module ``nyala._native`` (checked by mypy.stubtest).

Public code wraps these classes; users should not import ``nyala._native`` directly.
Each binding module owns one section below; edit only your section.
"""

from typing_extensions import Buffer

__version__: str

def error_classes() -> list[str]: ...
def crc32c(data: Buffer, initial: int = 0) -> int: ...

# --- wal (pyext/src/wal.rs) ---------------------------------------------------------------

# --- storage (pyext/src/storage.rs) -------------------------------------------------------

# --- consensus (pyext/src/consensus.rs) ---------------------------------------------------
