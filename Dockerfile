# cosyserve, CPU image:  make image  (docker build -t cosyserve:0.1.0 . , or podman build)
# The GPU image is Dockerfile.cuda. Models are not in the image: mount a model dir and set
# engine.model_dir (COSYSERVE_ENGINE__MODEL_DIR); deploy/kubernetes does both.
# PYTHON_IMAGE: where no registry is reachable, `make image` builds a stand-in from Debian's
# packages (deploy/images/base-image) and passes it here.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libsndfile1 \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv

WORKDIR /srv/cosyserve
COPY requirements ./requirements
# The same steps and pins as `make setup` (tests/unit/deploy/test_images.py checks that they agree),
# except torch: the CPU build from PyTorch's CPU index, explicitly. A plain `pip install torch`
# on x86_64 Linux pulls the CUDA build and several GB of NVIDIA libraries.
# Not kept: torch's C++ unit-test binaries (torch/test) and C++ headers (torch/include), which only a
# compiler could use and the image has none (CPU image: 145 MB less, docs/deploy.md).
# pipconf: the host's pip configuration, only where the default indexes are unreachable
# (`make image` passes it, and TORCH_INDEX_URL empty: torch from the configured indexes). A build
# secret is mounted for the one RUN and is in no layer; without it pip reads no file. (DL3013:
# hadolint reads the optional --index-url as an unpinned package; torch is pinned.)
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pipconf export PIP_CONFIG_FILE=/run/secrets/pipconf \
 && pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}+cpu" \
 && pip install --no-deps -r requirements/nodeps.txt \
 && rm -f /opt/venv/lib/python3.11/site-packages/torchaudio/lib/*.so \
 && pip install -r requirements/engine.txt \
 && rm -rf /opt/venv/lib/python3.11/site-packages/torch/test /opt/venv/lib/python3.11/site-packages/torch/include

COPY pyproject.toml README.md ./
COPY app ./app
COPY config.yaml ./
# The build proves it got the CPU torch, and that every name a released config refers to imports
# (the installed CosyVoice has v1 and v2 classes), its training data pipeline included
# (cosyvoice.dataset.processor: a training-only stand-in, as pyarrow/pyworld are not installed,
# see docs/install.md); the training-only GAN wrapper (hifigan) is listed, not required.
RUN --mount=type=secret,id=pipconf export PIP_CONFIG_FILE=/run/secrets/pipconf \
 && pip install --no-deps . \
 && pip install . \
 && python -c "import torch, torchaudio, cosyvoice, matcha, whisper, av, fastapi, app; assert torch.version.cuda is None, torch.version.cuda; print('torch', torch.__version__)" \
 && cosyserve check-config --version 1 --version 2

# Non-root; runs with a read-only root filesystem (caches and temp files under /tmp).
RUN useradd --system --uid 10001 --gid 0 --no-create-home --home-dir /tmp cosyserve
USER 10001
ENV HOME=/tmp \
    COSYSERVE_SERVER__HOST=0.0.0.0
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["cosyserve"]
CMD ["serve", "--config", "config.yaml", "--host", "0.0.0.0"]
