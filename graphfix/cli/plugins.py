"""`graphfix plugins build|path`: build the TensorRT plugin library and say where it is."""

from __future__ import annotations

import argparse
from pathlib import Path

from graphfix.plugins.build import (
    PluginLibraries,
    build_plugins,
    find_plugin_libraries,
    trtexec_command,
)
from graphfix.progress import step


def _describe(libraries: PluginLibraries) -> str:
    width = max(len(how) for how, _ in libraries.loading_flags())
    return "\n".join(f"{how:<{width}}  {path}" for how, path in libraries.loading_flags())


def _cmd_build(args: argparse.Namespace) -> int:
    build = build_plugins(
        build_dir=args.build_dir,
        cuda_archs=args.cuda_archs,
        jobs=args.jobs,
        progress=step,
    )
    print(f"built in {build.build_dir} for CUDA architectures {build.cuda_archs}")
    print(f"TensorRT headers: {build.headers.include_dir} ({build.headers.origin})")
    for note in build.notes:
        print(note)
    if build.nvinfer_library is None:
        print(
            f"{build.libraries.static.name} takes getPluginRegistry from the process that loads "
            "it (no libnvinfer was found to link; see plugins/README.md)"
        )
    print(_describe(build.libraries))
    print(trtexec_command("model.onnx", libraries=build.libraries))
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    libraries = find_plugin_libraries(build_dir=args.build_dir)
    if args.which == "static":
        print(libraries.static)
    elif args.which == "dynamic":
        print(libraries.dynamic)
    else:
        print(_describe(libraries))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `plugins build` and `plugins path` to the graphfix command line."""
    plugins = subparsers.add_parser(
        "plugins", help="build the TensorRT plugin library and show where it is"
    )
    actions = plugins.add_subparsers(dest="plugins_command", required=True)

    build = actions.add_parser("build", help="compile the plugin libraries with CMake and nvcc")
    build.add_argument(
        "--build-dir", type=Path, default=None, help="build folder (default: in ~/.cache/graphfix)"
    )
    build.add_argument(
        "--cuda-archs",
        default=None,
        help="CUDA architectures, e.g. 90 or '75;80;86;89;90' (default: $GRAPHFIX_CUDA_ARCHS, "
        "$CUDAARCHS, else the visible GPU's; with no GPU visible, sm_75 to sm_90 plus 100/120 "
        "where nvcc has them, several times slower)",
    )
    build.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs")
    build.set_defaults(func=_cmd_build)

    path = actions.add_parser("path", help="print the built libraries and the flag each goes with")
    path.add_argument(
        "which",
        nargs="?",
        choices=("all", "static", "dynamic"),
        default="all",
        help="static: the self-registering library; dynamic: the getCreators library",
    )
    path.add_argument("--build-dir", type=Path, default=None, help="build folder to look in")
    path.set_defaults(func=_cmd_path)
