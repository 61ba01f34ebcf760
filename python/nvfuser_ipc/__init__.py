"""nvfuser-ipc: CUDA IPC handle exchange for multi-GPU programs.

The wheel carries the C library (``libnvfuser_ipc.so``), its headers, CMake package and
pkg-config file (see :func:`cmake_prefix_path`), the ``nvfipc`` program, and this Python API
over the C ABI (:class:`Context`, :class:`Cache`, :class:`Request`, ...).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _dist_version

from ._api import (
    LOG_DEBUG,
    LOG_INFO,
    LOG_OFF,
    LOG_TRACE,
    LOG_WARN,
    RECV,
    SEND,
    Cache,
    Context,
    HostBuffer,
    Mapped,
    NvfipcError,
    NvfipcInvalidArgument,
    NvfipcTimeout,
    Request,
    cuda_available,
    ipc_counters,
    set_log_callback,
    set_log_level,
    version,
    vmm_counters,
)
from ._paths import cmake_prefix_path, include_dir, library_dir, library_path, pkgconfig_dir

try:
    __version__ = _dist_version("nvfuser-ipc")
except PackageNotFoundError:  # a source checkout
    __version__ = "0.0.0+source"

__all__ = [
    "LOG_DEBUG",
    "LOG_INFO",
    "LOG_OFF",
    "LOG_TRACE",
    "LOG_WARN",
    "RECV",
    "SEND",
    "Cache",
    "Context",
    "HostBuffer",
    "Mapped",
    "NvfipcError",
    "NvfipcInvalidArgument",
    "NvfipcTimeout",
    "Request",
    "cuda_available",
    "ipc_counters",
    "set_log_callback",
    "set_log_level",
    "version",
    "vmm_counters",
    "__version__",
    "cmake_prefix_path",
    "include_dir",
    "library_dir",
    "library_path",
    "pkgconfig_dir",
]
