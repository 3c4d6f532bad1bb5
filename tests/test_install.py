"""The install: `make install` takes the CPU lock, `make install GPU=1` the CUDA lock (issue 41, GPU install).

Checked with `make -n` (prints the recipe, runs nothing) into a venv path that does not exist, so
nothing is installed; and the two locks are held together line by line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements"
SWAPPED = {"torch==2.13.0+cpu": "torch===2.13.0", "fbgemm-gpu-cpu==1.8.0": "fbgemm-gpu==1.8.0"}


def _make_n(tmp_path: Path, *args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Under `make test` (CI) the outer make's MAKELEVEL/MAKEFLAGS reach this one: a nested make then prints
    # "Entering/Leaving directory" lines around the recipe, hence --no-print-directory and the cleaned environment.
    outer = ("GPU", "CUDA_LOCK", "PIP_INDEX_ARGS", "VENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(["make", "-n", "--no-print-directory", *args, f"VENV={tmp_path / 'venv'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout


def test_the_make_variable_gpu_selects_the_cuda_lock(tmp_path):
    gpu = _make_n(tmp_path, "install", "GPU=1")
    assert "-r requirements/cuda.lock.txt" in gpu and "cpu.lock.txt" not in gpu
    assert "pip uninstall -qq -y fbgemm-gpu-cpu" in gpu  # the CPU build's fbgemm_gpu folder goes first
    assert gpu.strip().splitlines()[-1] == f"touch {tmp_path / 'venv'}/.installed-cuda"
    cpu = _make_n(tmp_path, "install")
    assert "-r requirements/cpu.lock.txt" in cpu and "cuda.lock.txt" not in cpu
    assert "pip uninstall -qq -y fbgemm-gpu\n" in cpu
    assert cpu.strip().splitlines()[-1] == f"touch {tmp_path / 'venv'}/.installed"
    for recipe in (gpu, cpu):
        assert "--no-deps" in recipe.split("-r requirements/")[0].splitlines()[-1]  # every lock: --no-deps
    indexed = _make_n(tmp_path, "install", "GPU=1", "PIP_INDEX_ARGS=--extra-index-url file:///srv/wheels")
    assert "pip install -q --no-deps --extra-index-url file:///srv/wheels -r requirements/cuda.lock.txt" in indexed
    (tmp_path / "cu126.lock.txt").write_text("torch==2.13.0+cu126\n")  # a lock of another CUDA build
    own = _make_n(tmp_path, "install", "GPU=1", f"CUDA_LOCK={tmp_path / 'cu126.lock.txt'}")
    assert f"-r {tmp_path / 'cu126.lock.txt'} -r requirements/test.lock.txt" in own


def test_the_readme_commands_and_ci_stay_on_the_cpu_lock(tmp_path):
    assert "-r requirements/cpu.lock.txt" in _make_n(tmp_path, "test")
    assert "-r requirements/cpu.lock.txt" in _make_n(tmp_path, "pipeline")
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def _pins(name: str) -> list[str]:
    return [line for line in (REQUIREMENTS / name).read_text().splitlines() if line and not line.startswith("#")]


def test_the_cuda_lock_is_the_cpu_lock_with_the_cuda_builds():
    cpu, cuda = _pins("cpu.lock.txt"), _pins("cuda.lock.txt")
    assert cuda[: len(cpu)] == [SWAPPED.get(line, line) for line in cpu]  # the CPU lock line for line, two swapped
    runtime = cuda[len(cpu) :]
    assert "triton==3.7.1" in runtime and "cuda-toolkit==13.0.3.0" in runtime and len(runtime) == 19
    assert all(re.fullmatch(r"(nvidia-[a-z0-9-]+|cuda-[a-z-]+|triton)==[0-9.]+", line) for line in runtime)
    names = [re.split(r"[=<>!~]", line)[0].lower().replace("_", "-") for line in cuda]
    assert len(names) == len(set(names))  # one pin per package


def test_no_requirement_file_or_makefile_names_a_package_index_address():
    for path in [*REQUIREMENTS.glob("*.txt"), REPO / "Makefile"]:
        text = path.read_text()
        assert "://" not in text.replace("file:///srv/wheels", ""), path
        assert not re.search(r"^\s*-(-index-url|-extra-index-url|i|f|-find-links)\b", text, re.M), path
