"""Builds ik_llama.cpp's `llama-server` (and its `llama-perplexity`) for this CPU, once, into
SwiftSpec's cache; prints the server's path.

ik_llama.cpp (a llama.cpp fork with its own CPU matmul kernels and run-time repacking, `-rtr`) is
the second CPU peer of `swiftspec bench` (modes ikllama-ar and ikllama-spec), which finds the build
through the file ik_server_record() names.  Its source comes from
the `ik-llama-cpp-python` sdist on PyPI (pinned below), which vendors the fork under
`vendor/ik_llama.cpp` but lacks `common/cmake/build-info-gen-cpp.cmake`, the script that writes the
build-info source from its template: it is written here, with fixed values (the sdist has no git).  The CPU features are the ones tools/llamacpp_cmake_args.py
gives llama.cpp (this CPU's own, capped by SWIFTSPEC_ISA, AMX and -march=native off), so the two
peers are built alike.  Its iqk kernels take 30+ minutes on 2 cores; the build runs at low
priority (nice 19) with a progress line, and a finished build is reused: the cache directory is
named by the version and the CMake arguments.

Run: python tools/build_ikllama.py   (or `make install-ikllama`)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from swiftspec.bench.peers_llamacpp import ik_server_record

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_cmake_args import cmake_args  # noqa: E402

PACKAGE, VERSION = "ik-llama-cpp-python", "0.1.5"
TARGETS = ("llama-server", "llama-perplexity")  # the bench's peer; its perplexity (docs/bench/perplexity.md)
EXTRA = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DGGML_IQK_FA_ALL_QUANTS=OFF",
         "-DBUILD_SHARED_LIBS=OFF")


def cache_root() -> Path:
    return Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache" / "swiftspec")) / "ikllama"


def source_dir(root: Path) -> Path:
    """The unpacked fork (downloaded once with pip)."""
    src = root / f"ik_llama_cpp_python-{VERSION}" / "vendor" / "ik_llama.cpp"
    if src.is_dir():
        return src
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"{PACKAGE}=={VERSION}", "-d", str(root)], check=True)
    with tarfile.open(root / f"ik_llama_cpp_python-{VERSION}.tar.gz") as tar:
        tar.extractall(root, filter="data")
    return src


def write_build_info(src: Path) -> None:
    """common/cmake/build-info-gen-cpp.cmake, which the build runs to write common/build-info.cpp from its
    template: the sdist has neither the script nor git, so the values are fixed ones."""
    script = src / "common" / "cmake" / "build-info-gen-cpp.cmake"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        f'set(BUILD_NUMBER 0)\nset(BUILD_COMMIT "{PACKAGE}-{VERSION}")\nset(BUILD_COMPILER "c++")\n'
        'set(BUILD_TARGET "x86_64-linux")\n'
        'configure_file("${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp.in" "${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp" @ONLY)\n')


def build(src: Path, out: Path, args: list[str]) -> Path:
    """Configure and build TARGETS into out; prints ninja's [n/N] progress on one line."""
    nice = ["nice", "-n", "19"]
    subprocess.run(nice + ["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", *args], check=True,
                   stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    proc = subprocess.Popen(nice + ["cmake", "--build", str(out), "-j", jobs, "--target", *TARGETS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors: list[str] = []
    for line in proc.stdout:
        step = re.match(r"\[(\d+)/(\d+)\]", line)
        if step:
            print(f"\rbuilding ik_llama.cpp: {step.group(1)}/{step.group(2)}", end="", file=sys.stderr, flush=True)
        else:
            errors = (errors + [line.rstrip()])[-20:]
    if proc.wait() != 0:
        print("\n" + "\n".join(errors), file=sys.stderr)
        raise SystemExit(f"error: the ik_llama.cpp build failed (rerun: cmake --build {out})")
    print(file=sys.stderr)
    return out / "bin" / "llama-server"


def avx512_flags(args: list[str]) -> list[str]:
    """The fork's CMake adds only -mavx512f -mavx512bw for GGML_AVX512, but its AVX-512 kernels
    (iqk's HAVE_FANCY_SIMD) need VL and DQ as well, and fail to compile without them (v_tanh on
    __m512); the CPUs with AVX-512 VNNI all have both, so they are added beside it."""
    if "-DGGML_AVX512_VNNI=ON" not in args:
        return []
    flags = "-mavx512vl -mavx512dq -mavx512cd"
    return [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]


def main() -> None:
    args = cmake_args().split() + list(EXTRA)
    args += avx512_flags(args)
    root = cache_root()
    out = root / f"build-{VERSION}-{hashlib.sha1(' '.join(args).encode()).hexdigest()[:10]}"
    server = out / "bin" / "llama-server"
    if not all((out / "bin" / target).exists() for target in TARGETS):
        src = source_dir(root)
        write_build_info(src)
        server = build(src, out, args)
    ik_server_record().write_text(f"{server}\n")  # where `swiftspec bench` finds it
    print(server)


if __name__ == "__main__":
    main()
