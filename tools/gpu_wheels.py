"""Download the wheels a GPU machine without network needs to run ``bench.gpu_check``, into ``.whl/``.

    python -m tools.gpu_wheels            # or: make gpu-wheels
    python -m tools.gpu_wheels --text-normalization   # also wetext (+46 MB): engine.text_normalization auto

The machine is assumed to have a CUDA PyTorch stack already (torch, torchaudio,
transformers, numpy, onnx, onnxruntime, scipy, numba, ...): ``IMAGE`` below is the package
list of the GPU image this project's checks run on (its ``pip list``, 2026-11-17). What the
check imports beyond it (measured: the distributions loaded by a run of the check and a
model build) is ``ROOTS``; this script follows their requirements (markers evaluated for
Linux x86-64, Python ``--python``), stops at what the image has, takes each version from
this environment (the project's pinned, tested set), and downloads one wheel each for that
Python. CosyVoice's own packages go without their dependencies, as ``make setup`` installs
them (their metadata pulls CUDA builds, onnxruntime-gpu and triton). openai-whisper ships
no wheel: it is built here (pure Python). Prints each wheel and the total size.

On the GPU machine (docs/gpu.md)::

    python3 -m pip install -q --no-index --no-deps --target .cache/gpu-site .whl/*.whl
    PYTHONPATH=.cache/gpu-site:. python3 -m bench gpu      # or: make gpu-check (does both)
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the check imports that the GPU image lacks (the engine, CosyVoice, the model builder).
ROOTS = ("cosyvoice-minicpmo", "openai-whisper", "hyperpyyaml", "conformer", "diffusers", "inflect", "omegaconf",
         "librosa", "soundfile")
TEXT_NORMALIZATION = ("wetext", "kaldifst", "contractions")
NO_DEPS = {"cosyvoice-minicpmo", "openai-whisper"}  # as make setup: their real runtime deps are listed themselves
# The GPU image's Python packages (device kind nvidia-h200, image 'cuda', read 2026-11-17).
IMAGE = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
LIMIT_MB = 60  # the device tool carries the tree and the wheels together, 64 MiB in all


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...], python: str) -> dict[str, str]:
    """``{name: version}``: the roots and what they require, minus the image's packages."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    out: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = norm(todo.pop())
        if name in out or name in IMAGE:
            continue
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"gpu_wheels: {name} is not installed here; run `make setup` first") from None
        if name in NO_DEPS:
            continue
        for line in md.requires(name) or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return out


def fetch(name: str, version: str, dest: Path, python: str) -> Path:
    before = set(dest.glob("*.whl"))
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *platforms, "-d", str(dest), f"{name}=={version}"]
    if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:  # no wheel: build one (pure Python)
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest),
                                f"{name}=={version}"], capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"gpu_wheels: no wheel for {name}=={version}:\n{built.stderr[-2000:]}")
    new = sorted(set(dest.glob("*.whl")) - before)
    if len(new) != 1:
        raise SystemExit(f"gpu_wheels: expected one new wheel for {name}=={version}, got {[w.name for w in new]}")
    wheel = new[0]
    py_tag, abi_tag = wheel.name[:-4].split("-")[-3:-1]
    if not ({"py3", f"cp{python.replace('.', '')}"} & set(py_tag.split(".")) or abi_tag == "abi3"):
        raise SystemExit(f"gpu_wheels: {wheel.name} is not for Python {python}")
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default=str(ROOT / ".whl"))
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    ap.add_argument("--text-normalization", action="store_true", help="also wetext and its FSTs (~46 MB)")
    args = ap.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):  # one version of each: two would stop the install there
        stale.unlink()
    wanted = closure(ROOTS + (TEXT_NORMALIZATION if args.text_normalization else ()), args.python)
    total = 0
    for name, version in sorted(wanted.items()):
        wheel = fetch(name, version, dest, args.python)
        total += wheel.stat().st_size
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:8.2f} MiB  in all: {len(wanted)} wheels in {dest} (limit {LIMIT_MB} MiB with the tree)")
    return 0 if total <= LIMIT_MB * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
