# cosyserve, CPU image:  docker build -t cosyserve:0.1.0 .
# The GPU image is Dockerfile.cuda. Models are not in the image: mount a model dir and set
# engine.model_dir (COSYSERVE_ENGINE__MODEL_DIR); deploy/kubernetes does both.
FROM python:3.11-slim-bookworm

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
# The same steps and pins as `make setup` (tests/unit/test_images.py checks that they agree),
# except torch: the CPU build from PyTorch's CPU index, explicitly. A plain `pip install torch`
# on x86_64 Linux pulls the CUDA build and several GB of NVIDIA libraries.
ARG TORCH_VERSION=2.13.0
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}+cpu" \
 && pip install --no-deps -r requirements/nodeps.txt \
 && rm -f /opt/venv/lib/python3.11/site-packages/torchaudio/lib/*.so \
 && pip install -r requirements/engine.txt

COPY pyproject.toml README.md ./
COPY app ./app
COPY config.yaml ./
# The build proves it got the CPU torch, and that every name a released config refers to imports
# (the installed CosyVoice has v1 and v2 classes), its training data pipeline included
# (cosyvoice.dataset.processor: a training-only stand-in, as pyarrow/pyworld are not installed,
# see docs/install.md).
RUN pip install --no-deps . \
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
