# cosyserve, CPU image. For GPUs, start from a CUDA base image, install the CUDA torch build
# and mount an upstream CosyVoice checkout (engine.cosyvoice_path); see docs/install.md.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make libsndfile1 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/cosyserve
COPY pyproject.toml Makefile README.md ./
COPY requirements ./requirements
COPY app ./app
# PIP_EXTRA_INDEX_URL may point at PyTorch's CPU wheel index to keep the image small.
ARG PIP_EXTRA_INDEX_URL=""
RUN make setup PYTHON=python3.11
COPY config.yaml ./
ENV PATH=/srv/cosyserve/.venv/bin:$PATH \
    COSYSERVE_SERVER__HOST=0.0.0.0
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["cosyserve"]
CMD ["serve", "--config", "config.yaml", "--host", "0.0.0.0"]
