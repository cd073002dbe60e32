#!/usr/bin/env python3
"""Set up the kermac development environment and run its tasks (standard library only, Python >= 3.10).

    python3 scripts/dev.py setup [--force]   create or refresh .venv: torch, every packages/* member editable, dev tools
    python3 scripts/dev.py test [ARGS...]    setup, then ``python -m pytest ARGS``
    python3 scripts/dev.py bench [ARGS...]   setup, then ``kermac bench ARGS``
    python3 scripts/dev.py docs [ARGS...]    setup, build the performance dashboard from perf-history/ into
                                             docs/performance/dashboard/, then ``mkdocs build --strict ARGS``
    python3 scripts/dev.py wheels [--check]  setup, then build the wheel of every packages/* member into dist/;
                                             --check installs them into a fresh environment and imports them,
                                             then installs the example plugin there and runs its tests
    python3 scripts/dev.py compile-floor [ARGS...]
                                             setup, install the oldest supported Triton into .venv-triton-floor/
                                             if it is not there, then ``python -m pytest ARGS`` on the tests that
                                             compile Triton kernels to cubins, with that Triton
    python3 scripts/dev.py torch             install the right torch into the interpreter running this script
                                             (hatch's pre-install step; see the root pyproject.toml)

Torch is installed first and on its own, so that nothing installed after it can pull another build:
without an NVIDIA GPU it is ``torch==2.13.0`` (a CPU wheel where one is on the package index or in
pip's find-links), with one ``torch>=2.4``.  ``KERMAC_TORCH_SPEC`` replaces that requirement with
any pip arguments, e.g. ``KERMAC_TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"``.
Without a GPU on Linux, set-up refuses a torch build that would bring CUDA libraries (several GB).

``wheels --check`` installs the wheels with ``--no-deps`` into a new virtual environment in a private
temporary directory that sees .venv's packages (torch, the CUDA wheels, ...) after its own, so nothing
is downloaded again; there it imports every package from the wheels, reads the shipped package data
and runs ``kermac info``.  It also checks that every file git tracks under ``packages/*/src/`` is in a
wheel (package data such as kernel sources and cost tables).  The NVRTC backend cannot find the
NVRTC library there (cuda-pathfinder looks in the environment's own site-packages only), so it
shows as unavailable in that ``kermac info``.  Then the example plugin (examples/kermac-backend-numpy)
is installed there with its README's one pip command, its conformance tests run with that
environment's python (pytest comes from .venv), and ``kermac info`` there must list its backend.

``compile-floor`` compiles the suite's cubin jobs again with ``triton==3.6.0`` (``TRITON_FLOOR``, the oldest
Triton kermac-backend-triton accepts), installed with ``pip --no-deps --target`` into the ignored
.venv-triton-floor/ and put first on ``PYTHONPATH``: the jobs pass with .venv's Triton in ``test``, and a
kernel one Triton compiles may spill or fail to compile with another.  The tests run are those of the test
modules naming ``compile_in_clean_process`` (tests/cubin_jobs.py) that call it, themselves or through a
fixture (the pytest plugin tests/cubin_only.py deselects the others); the compiling processes run without
``TRITON_INTERPRET``.  The directory is reused while its stamp (the requirement and the interpreter) holds.

``setup`` is idempotent: it records a hash of every pyproject.toml, this script, the interpreter
and the torch choice in .venv, and does nothing while they are unchanged (members are editable,
so source edits need no reinstall).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".kermac-dev-stamp"
TORCH_CONSTRAINT = VENV / ".kermac-torch-constraint.txt"

CPU_TORCH = "torch==2.13.0"
GPU_TORCH = "torch>=2.4"
MIN_PIP = "pip>=25.1"  # first pip with --group (PEP 735 dependency groups)
DEV_GROUP = "dev"  # [dependency-groups] in the root pyproject.toml
# Members with CUDA-library extras, and whether they are worth installing without a GPU:
# NVRTC compiles to cubin on any machine (the CPU test tier does), cuSOLVER needs a GPU to run.
CUDA_EXTRA_WITHOUT_GPU = {"kermac-backend-nvrtc": True, "kermac-linalg": False}
DEFAULT_CUDA_MAJOR = 13  # what the NVRTC wheels are taken for when torch has no CUDA
TRITON_FLOOR = "3.6.0"  # the oldest Triton kermac-backend-triton accepts (its pyproject.toml), as the GPU machine runs
FLOOR_DIR = ROOT / ".venv-triton-floor"
FLOOR_STAMP = FLOOR_DIR / ".kermac-floor-stamp"
TESTS = ROOT / "tests"
CUBIN_CALL = "compile_in_clean_process"  # tests/cubin_jobs.py: how the suite compiles Triton kernels to cubins


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def fail(message: str) -> None:
    print(f"[dev] error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd: list[str], what: str, cwd: Path = ROOT) -> None:
    """Run ``cmd`` in ``cwd`` (the repository root); exit with a message naming ``what`` if it fails."""
    where = "" if cwd == ROOT else f"(in {cwd.relative_to(ROOT).as_posix()}) "
    say(f"{where}$ " + shlex.join(str(c) for c in cmd))
    if subprocess.run(cmd, cwd=cwd).returncode != 0:
        fail(f"{what} failed (command above)")


def has_nvidia_gpu() -> bool:
    """True if an NVIDIA GPU is visible: a /dev/nvidia0 device node or a working ``nvidia-smi -L``."""
    if Path("/dev/nvidia0").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def torch_spec(gpu: bool) -> list[str]:
    """The pip arguments that install torch: ``KERMAC_TORCH_SPEC`` or the default for this machine."""
    override = os.environ.get("KERMAC_TORCH_SPEC", "").strip()
    if override:
        return shlex.split(override)
    return [GPU_TORCH if gpu else CPU_TORCH]


def pip(python: Path | str, *args: str) -> list[str]:
    quiet = [] if sys.stdout.isatty() else ["--progress-bar", "off"]
    return [str(python), "-m", "pip", "install", *quiet, *args]


def resolved_torch(python: Path | str, spec: list[str]) -> dict:
    """What pip would install for ``spec`` (pip >= 22.2 ``--dry-run --report``), without installing it."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), *spec]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            fail(f"pip cannot resolve the torch requirement {shlex.join(spec)}")
        entries = json.loads(report.read_text())["install"]
    for entry in entries:
        if entry["metadata"]["name"].lower() == "torch":
            return entry
    return {}  # already installed and satisfying: nothing to install


def install_torch(python: Path | str, gpu: bool) -> str:
    """Install torch into ``python`` (before anything else) and return its version string.

    Without a GPU on Linux, a torch whose metadata asks for NVIDIA CUDA wheels is refused before
    anything is downloaded: that build is several GB and useless on this machine.
    """
    spec = torch_spec(gpu)
    if not gpu and platform.system() == "Linux":
        entry = resolved_torch(python, spec)
        cuda_deps = [r for r in entry.get("metadata", {}).get("requires_dist", []) if r.lower().startswith("nvidia-")]
        if cuda_deps:
            version = entry["metadata"]["version"]
            fail(
                f"no NVIDIA GPU here, but {shlex.join(spec)} resolves to torch {version}, a CUDA build "
                f"(needs {cuda_deps[0]}, ...: several GB). Set KERMAC_TORCH_SPEC to a CPU build, e.g. "
                '"torch --index-url https://download.pytorch.org/whl/cpu", and run again.'
            )
    run(pip(python, *spec), "installing torch")
    probe = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__); print(torch.version.cuda or '')"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        fail(f"torch was installed but does not import:\n{probe.stderr}")
    version, cuda = probe.stdout.split("\n")[:2]
    say(f"torch {version} ({'CUDA ' + cuda if cuda else 'CPU only'})")
    return version


def torch_cuda_major(python: Path) -> int | None:
    out = subprocess.run(
        [str(python), "-c", "import torch; print(torch.version.cuda or '')"], capture_output=True, text=True, check=True
    )
    cuda = out.stdout.strip()
    return int(cuda.split(".")[0]) if cuda else None


def members() -> list[Path]:
    """Every workspace member: the folders under packages/ with a pyproject.toml."""
    return sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))


def member_requirements(gpu: bool, cuda_major: int) -> list[str]:
    """``-e`` arguments for every member, with the cuXX extra where the member needs CUDA wheels."""
    args = []
    for path in members():
        rel = path.relative_to(ROOT).as_posix()
        with_cuda = CUDA_EXTRA_WITHOUT_GPU.get(path.name)
        extra = f"[cu{cuda_major}]" if with_cuda is not None and (gpu or with_cuda) else ""
        args += ["-e", f"./{rel}{extra}"]
    return args


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_tool(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def stamp_of(gpu: bool) -> str:
    h = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", *(m / "pyproject.toml" for m in members()), Path(__file__).resolve()]:
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    h.update(repr((sys.version_info[:3], sys.executable, gpu, torch_spec(gpu))).encode())
    return h.hexdigest()


def venv_matches_interpreter() -> bool:
    py = venv_python()
    if not py.exists():
        return False
    out = subprocess.run([str(py), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == str(sys.version_info[:2])


def setup(force: bool = False) -> Path:
    """Create or refresh .venv; return its interpreter.  A no-op while nothing it depends on changed."""
    gpu = has_nvidia_gpu()
    stamp = stamp_of(gpu)
    if not force and venv_matches_interpreter() and STAMP.exists() and STAMP.read_text() == stamp:
        say(f"{VENV.relative_to(ROOT)} is up to date")
        return venv_python()
    if VENV.exists() and not venv_matches_interpreter():
        say(f"{VENV.relative_to(ROOT)} was made by another interpreter: recreating it")
        shutil.rmtree(VENV)
    STAMP.unlink(missing_ok=True)
    if not VENV.exists():
        run([sys.executable, "-m", "venv", str(VENV)], "creating the virtual environment")
    py = venv_python()
    say(f"NVIDIA GPU: {'yes' if gpu else 'no'}")
    run(pip(py, "--upgrade", MIN_PIP), "upgrading pip")
    version = install_torch(py, gpu)
    TORCH_CONSTRAINT.write_text(f"torch=={version}\n")  # nothing after this may replace torch
    cuda_major = torch_cuda_major(py) or DEFAULT_CUDA_MAJOR
    run(
        pip(py, "-c", str(TORCH_CONSTRAINT), *member_requirements(gpu, cuda_major), "--group", DEV_GROUP),
        "installing the workspace members and dev tools",
    )
    STAMP.write_text(stamp)
    say(f"ready: {py}")
    return py


def floor_stamp() -> str:
    """What .venv-triton-floor/ holds: the Triton requirement, for this interpreter's version and machine."""
    return f"triton=={TRITON_FLOOR} cp{sys.version_info[0]}{sys.version_info[1]} {sys.platform} {platform.machine()}\n"


def install_floor_triton(py: Path) -> None:
    """Install ``triton==TRITON_FLOOR`` into FLOOR_DIR unless its stamp says it is there (``--no-deps``: on
    Python >= 3.10 Triton requires nothing)."""
    stamp = floor_stamp()
    if FLOOR_STAMP.exists() and FLOOR_STAMP.read_text() == stamp:
        say(f"{FLOOR_DIR.relative_to(ROOT)} holds triton {TRITON_FLOOR}")
        return
    shutil.rmtree(FLOOR_DIR, ignore_errors=True)  # pip --target does not replace what is there
    run(pip(py, "--no-deps", "--target", str(FLOOR_DIR), f"triton=={TRITON_FLOOR}"), "installing the floor Triton")
    FLOOR_STAMP.write_text(stamp)


def cubin_test_files() -> list[str]:
    """The test modules (relative to the root) that name ``CUBIN_CALL``, in order."""
    modules = sorted(TESTS.rglob("test_*.py"))
    return [m.relative_to(ROOT).as_posix() for m in modules if CUBIN_CALL in m.read_text(encoding="utf-8")]


def floor_environment() -> dict[str, str]:
    """The environment of ``compile-floor``'s pytest: FLOOR_DIR first on ``PYTHONPATH``, then tests/ (for the
    plugin ``cubin_only``); ``TRITON_INTERPRET`` is left to tests/conftest.py, and the compiling processes
    drop it."""
    env = dict(os.environ)
    path = [str(FLOOR_DIR), str(TESTS), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def compile_floor(py: Path, args: list[str]) -> int:
    """Run the cubin tests with the floor Triton; return pytest's exit status."""
    install_floor_triton(py)
    env = floor_environment()
    probe = subprocess.run(
        [str(py), "-c", "import triton; print(triton.__version__)"], env=env, capture_output=True, text=True
    )
    if probe.returncode != 0 or probe.stdout.strip() != TRITON_FLOOR:
        fail(f"compile-floor: expected triton {TRITON_FLOOR} first on the path, got {probe.stdout or probe.stderr}")
    cmd = [str(py), "-m", "pytest", "-p", "cubin_only", *cubin_test_files(), *args]
    say(f"triton {TRITON_FLOOR} from {FLOOR_DIR.relative_to(ROOT)}: $ " + shlex.join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def build_wheels(py: Path, out: Path) -> list[Path]:
    """Build the wheel of every workspace member into ``out`` (earlier kermac wheels there are removed)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("kermac*.whl"):
        old.unlink()
    sources = [f"./{m.relative_to(ROOT).as_posix()}" for m in members()]
    run([str(py), "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), *sources], "building the wheels")
    wheels = sorted(out.glob("kermac*.whl"))
    if len(wheels) != len(sources):
        fail(f"expected {len(sources)} wheels in {out}, found {[w.name for w in wheels]}")
    return wheels


def missing_from_wheels(wheels: list[Path]) -> list[str]:
    """Files of the members' ``src/`` trees that git tracks but no wheel holds (package data left out)."""
    import zipfile

    shipped = set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            shipped.update(archive.namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "--", "packages/*/src/*"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [path for path in tracked if path.split("/src/", 1)[1] not in shipped]


#: Run by the environment that holds only the wheels: every package comes from there, the package
#: data ships (the cost tables), and the reference backend computes.
WHEEL_SMOKE_TEST = """
import sys
import torch
import kermac, kermac_backend_nvrtc, kermac_backend_triton, kermac_linalg
from kermac.costs import CostTables
outside = [m.__name__ for m in (kermac, kermac_backend_nvrtc, kermac_backend_triton, kermac_linalg)
           if not m.__file__.startswith(sys.prefix)]
assert not outside, f"imported from outside the wheels' environment: {outside}"
assert CostTables().table("sm_90") is not None, "the cost tables are missing from the kermac-core wheel"
x = torch.randn(5, 3, dtype=torch.float64)
assert torch.allclose(kermac.cdist(x, x, p=1.0, backend="torch"), torch.cdist(x, x, p=1.0))
print("wheels import from", sys.prefix, "kermac", kermac.__version__)
"""


def purelib(python: Path) -> str:
    """The site-packages directory of the interpreter ``python``."""
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


EXAMPLE_PLUGIN = ROOT / "examples" / "kermac-backend-numpy"
EXAMPLE_BACKEND = "numpy"


def check_example_plugin(py: Path, env_py: Path, env_bin: Path) -> None:
    """The worked third-party backend of examples/ in the wheels' environment: installed by the one pip
    command of its README, it passes its own conformance tests and ``kermac info`` lists it, available.

    Like kermac's own wheels it is built in pip's isolated build environment; ``--no-deps`` and
    ``--ignore-installed`` keep pip from fetching or replacing anything else (its dependencies,
    kermac-core and numpy, are already there).  Its tests run from its own directory with pytest
    from .venv's packages, which the environment sees after its own.
    """
    install = [str(py), "-m", "pip", "--python", str(env_py), "install", "--no-deps", "--ignore-installed"]
    run([*install, f"./{EXAMPLE_PLUGIN.relative_to(ROOT).as_posix()}"], "installing the example plugin")
    tests = [str(env_py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    run(tests, "the example plugin's conformance tests", cwd=EXAMPLE_PLUGIN)
    cmd = [str(env_bin / "kermac"), "info", "--json"]
    say("$ " + shlex.join(cmd))
    info = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if info.returncode != 0:
        fail(f"kermac info in the wheels' environment failed:\n{info.stderr}")
    rows = [row for row in json.loads(info.stdout)["backends"] if row["name"] == EXAMPLE_BACKEND]
    if not rows or not rows[0]["available"] or rows[0]["broken"]:
        fail(f"kermac info does not list the example's backend {EXAMPLE_BACKEND!r} as available: {rows}")
    say(f"kermac info lists backend {EXAMPLE_BACKEND!r} of {rows[0]['distribution']}")


def check_wheels(py: Path, wheels: list[Path]) -> None:
    """Install ``wheels`` (``--no-deps``) into a fresh environment that reuses .venv's packages; smoke-test them."""
    missing = missing_from_wheels(wheels)
    if missing:
        fail(f"files of the source trees missing from the wheels: {', '.join(missing)}")
    deps = purelib(py)
    with tempfile.TemporaryDirectory(prefix="kermac-wheels-") as tmp:
        env = Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", "--without-pip", str(env)], "creating the environment for the wheels")
        env_py = env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        site = purelib(env_py)
        # A plain path line: .venv's packages come after the environment's own, and .venv's .pth files
        # (its editable installs of these packages) are not processed.
        (Path(site) / "kermac-dev-dependencies.pth").write_text(deps + "\n")
        pip_install = [str(py), "-m", "pip", "--python", str(env_py), "install", "--no-deps", "--no-index"]
        pip_install.append("--ignore-installed")  # .venv's editable installs are visible: leave them alone
        run([*pip_install, *map(str, wheels)], "installing the wheels")
        run([str(env_py), "-c", WHEEL_SMOKE_TEST], "importing the installed wheels")
        env_bin = env / ("Scripts" if os.name == "nt" else "bin")
        run([str(env_bin / "kermac"), "info"], "kermac info from the wheels")
        check_example_plugin(py, env_py, env_bin)
    say(f"the {len(wheels)} wheels install and import; the example plugin installs and conforms")


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 10):  # noqa: UP036 -- this script may be started by any python3
        fail(f"Python >= 3.10 is needed, this is {platform.python_version()} ({sys.executable})")
    commands = ("setup", "test", "bench", "docs", "wheels", "compile-floor", "torch")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    if argv[0] not in commands:
        print(
            f"[dev] error: unknown command {argv[0]!r}; expected one of {', '.join(commands)} "
            "(python3 scripts/dev.py --help describes them)",
            file=sys.stderr,
        )
        return 2
    command, args = argv[0], argv[1:]
    if command == "torch":
        install_torch(sys.executable, has_nvidia_gpu())
        return 0
    if command == "setup":
        unknown = [a for a in args if a != "--force"]
        if unknown:
            fail(f"setup: expected no arguments or --force, got {shlex.join(unknown)}")
        setup(force="--force" in args)
        return 0
    if command == "wheels":
        unknown = [a for a in args if a != "--check"]
        if unknown:
            fail(f"wheels: expected no arguments or --check, got {shlex.join(unknown)}")
        py = setup()
        wheels = build_wheels(py, ROOT / "dist")
        say("built " + ", ".join(w.name for w in wheels) + " in dist/")
        if "--check" in args:
            check_wheels(py, wheels)
        return 0
    py = setup()
    if command == "compile-floor":
        return compile_floor(py, args)
    env = dict(os.environ)
    if command == "test":
        cmd = [str(py), "-m", "pytest", *args]
    elif command == "bench":
        cmd = [str(venv_tool("kermac")), "bench", *args]
    else:
        # The Performance history page links the dashboard, which asv builds from the stored results.
        publish = [str(py), str(ROOT / "tools" / "asv_suites.py"), "publish"]
        say("$ " + shlex.join(publish))
        if subprocess.run(publish, cwd=ROOT).returncode:
            fail("docs: building the performance dashboard failed (tools/asv_suites.py publish)")
        cmd = [str(venv_tool("mkdocs")), "build", "--strict", *args]
        env.setdefault("NO_MKDOCS_2_WARNING", "1")  # mkdocs-material's end-of-life banner
    say("$ " + shlex.join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
