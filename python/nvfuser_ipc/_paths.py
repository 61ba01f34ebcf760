"""Where the installed package keeps the C library, its headers, CMake package and pkg-config file."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_LIB_NAME = "libnvfuser_ipc.so"


def _prefix() -> Path:
    """The installation prefix: the package directory in a wheel, else (a source checkout whose
    package was not staged) nothing."""
    return _PACKAGE


def cmake_prefix_path() -> str:
    """The directory to add to ``CMAKE_PREFIX_PATH`` so that ``find_package(nvfuser_ipc)`` finds
    the library (as ``torch.utils.cmake_prefix_path``)."""
    return str(_prefix())


def include_dir() -> str:
    """The directory holding ``nvfuser_ipc.h`` and the C++ headers."""
    return str(_prefix() / "include")


def library_dir() -> str:
    """The directory holding ``libnvfuser_ipc.so``."""
    return str(_prefix() / "lib")


def pkgconfig_dir() -> str:
    """The directory holding ``nvfuser-ipc.pc`` (for ``PKG_CONFIG_PATH``)."""
    return str(_prefix() / "lib" / "pkgconfig")


def library_path() -> str:
    """The C library the Python API loads: ``NVFIPC_LIBRARY`` when set, else the one in this
    package, else ``target/release`` of the source checkout this package lies in."""
    override = os.environ.get("NVFIPC_LIBRARY")
    if override:
        return override
    packaged = _prefix() / "lib" / _LIB_NAME
    if packaged.exists():
        return str(packaged)
    checkout = _PACKAGE.parent.parent / "target" / "release" / _LIB_NAME
    if checkout.exists():
        return str(checkout)
    raise FileNotFoundError(
        f"{_LIB_NAME} is neither in this package ({packaged}) nor in a source checkout "
        f"({checkout}): install the wheel, build with `cargo build --release`, or set NVFIPC_LIBRARY"
    )
