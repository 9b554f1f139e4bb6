"""Type stub for the private native module ``nyala._native`` (checked by mypy.stubtest).

Public code wraps these classes; users should not import ``nyala._native`` directly.
"""

__version__: str

def error_classes() -> list[str]: ...
