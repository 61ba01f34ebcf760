"""``python -m nvfuser_ipc --cmake-prefix`` and friends: where the installed library lies, for
build systems (``cmake -DCMAKE_PREFIX_PATH="$(python -m nvfuser_ipc --cmake-prefix)"``)."""

from __future__ import annotations

import argparse
import sys

from . import _paths, __version__


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvfuser_ipc",
        description="Print where the nvfuser-ipc library, headers, CMake package and "
        "pkg-config file of this installation lie.",
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmake-prefix", action="store_true",
                       help="the directory for CMAKE_PREFIX_PATH (find_package(nvfuser_ipc))")
    group.add_argument("--include", action="store_true", help="the headers' directory")
    group.add_argument("--libdir", action="store_true", help="the directory of libnvfuser_ipc.so")
    group.add_argument("--pkgconfig", action="store_true",
                       help="the directory of nvfuser-ipc.pc (for PKG_CONFIG_PATH)")
    group.add_argument("--library", action="store_true",
                       help="the path of the library the Python API loads")
    group.add_argument("--version", action="store_true", help="the package's version")
    args = parser.parse_args(argv)
    if args.cmake_prefix:
        print(_paths.cmake_prefix_path())
    elif args.include:
        print(_paths.include_dir())
    elif args.libdir:
        print(_paths.library_dir())
    elif args.pkgconfig:
        print(_paths.pkgconfig_dir())
    elif args.library:
        print(_paths.library_path())
    else:
        print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
