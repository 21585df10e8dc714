"""`make test-images`: build both images and run them as deploy/kubernetes does (python3, stdlib only).

First deploy/images/preflight: the engine must run a one-line build step with its network (a
package missing from tests/images/install-deps.sh is named in one line, not minutes into a build).

CPU image (Dockerfile): built with deploy/images/build, then run read-only, with a tmpfs /tmp, no
capabilities, no privilege escalation, as uid 10001 and with a model dir mounted read-only (a
tiny random-weight CosyVoice2 dir built on the host by `cosyserve make-tiny-model`, as a user
builds one): it must get ready, answer /v1/tts with a 24 kHz WAV and /metrics with cosyserve's
metrics, and on SIGTERM finish the request in flight and exit 0. A host file of that dir made
0600 must stop it at start with exit 2 and one "permission denied" line naming the file and uid.

CUDA image (Dockerfile.cuda), on a machine without a GPU, with a tiny dir the image itself writes
as uid 10001: `engine.device: cuda` must exit 2 at once with one line that says why; `auto` must
serve on the CPU (same checks as above) and say "built for CUDA ... no usable GPU" once. Its NVIDIA
wheels must be the ones requirements/cuda-constraints.txt pins. Which CosyVoice it carries (the pinned upstream checkout,
or, where GitHub cannot be reached, the v1/v2-only variant from the installed package) is printed.

Neither image may carry the host's pip configuration. Both images are removed at the end (the
base-image stand-in is kept: it is the cache), so CI's disk stays bounded.

    python3 tests/images/run.py [--only cpu|cuda] [--keep]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import wave
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
TAGS = {"cpu": f"cosyserve:{VERSION}", "cuda": f"cosyserve-cuda:{VERSION}"}
# deploy/kubernetes/base/deployment.yaml: securityContext, the /tmp emptyDir and the variables pointing there
K8S_RUN = ["--read-only", "--tmpfs", "/tmp:rw,mode=1777,size=2g", "--cap-drop=ALL",
           "--security-opt", "no-new-privileges", "--user", "10001:0",
           "-e", "HOME=/tmp", "-e", "XDG_CACHE_HOME=/tmp/cache", "-e", "NUMBA_CACHE_DIR=/tmp/numba",
           "-e", "COSYSERVE_DEV__TINY_CACHE_DIR=~/cosyserve-models", "-e", "OMP_NUM_THREADS=1"]
CUDA_WARNING = "built for CUDA"
results: list[tuple[str, str]] = []


def say(line: str) -> None:
    print(f"test-images: {line}", flush=True)


def record(what: str, value: str) -> None:
    results.append((what, value))
    say(f"{what}: {value}")


class Engine:
    """docker or podman, as deploy/images/engine.sh picks and configures it."""

    def __init__(self) -> None:
        script = 'source deploy/images/engine.sh && echo "$ENGINE" && echo "${CONTAINERS_CONF:-}"'
        out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
        self.name, conf = out.stdout.splitlines()[:2]
        self.env = {**os.environ, **({"CONTAINERS_CONF": conf} if conf else {})}

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        r = subprocess.run([self.name, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"{self.name} {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r


def build(engine: Engine, kind: str) -> None:
    t0 = time.monotonic()
    env = {**engine.env, "ENGINE": engine.name}
    env.setdefault("COSYVOICE", "auto")  # CI reaches only the package registries: no GitHub, no checkout
    r = subprocess.run(["deploy/images/build", kind], cwd=ROOT, env=env, text=True, check=False,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - t0
    log = ROOT / "reports" / f"image-{kind}-build.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text(r.stdout)
    if r.returncode != 0:
        print(r.stdout[-8000:])
        raise AssertionError(f"{kind} image: build failed (exit {r.returncode}); full log: {log}")
    size = int(engine("image", "inspect", "--format", "{{.Size}}", TAGS[kind]).stdout.strip())
    record(f"{kind} image build", f"{seconds / 60:.1f} min ({seconds:.0f} s), {size / 1e9:.2f} GB")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: dict | None = None,
            timeout: float = 60) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"content-type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def wav_seconds(data: bytes) -> float:
    with wave.open(BytesIO(data)) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1, (w.getframerate(), w.getnchannels())
        # a streamed WAV's header cannot know its length: count the frames that came
        return len(w.readframes(w.getnframes())) / (w.getsampwidth() * w.getframerate())


def preflight(engine: Engine) -> None:
    """deploy/images/preflight: can this engine build here at all? One line naming what is missing if not."""
    t0 = time.monotonic()
    r = subprocess.run(["deploy/images/preflight"], cwd=ROOT, env={**engine.env, "ENGINE": engine.name},
                       capture_output=True, text=True, check=False, timeout=300)
    if r.returncode != 0:
        raise AssertionError((r.stderr.strip() or r.stdout.strip()) + " (tests/images/install-deps.sh installs "
                             "what the images need: a missing package belongs in its list)")
    record("preflight", f"{engine.name} runs a one-line build step with its network ({time.monotonic() - t0:.1f} s)")


def host_model_dir(where: Path) -> Path:
    """A tiny CosyVoice2 dir written on the host by `cosyserve make-tiny-model` (as root here), as a user does."""
    cosyserve = ROOT / ".venv" / "bin" / "cosyserve"  # `make setup`, which `make test-images` depends on
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    out = where / "tiny2"
    subprocess.run([str(cosyserve), "make-tiny-model", "--version", "2", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=600)
    return out


def check_unreadable_model_dir(engine: Engine, kind: str, models: Path) -> None:
    """A host file the image's uid may not read: exit 2 at start, one line, "permission denied", path and uid."""
    weights = models / "tiny2" / "CosyVoice-BlankEN" / "model.safetensors"
    weights.chmod(0o600)
    try:
        r = engine("run", "--rm", *K8S_RUN, "-v", f"{models}:/models:ro", "-e",
                   "COSYSERVE_ENGINE__MODEL_DIR=/models/tiny2", TAGS[kind], check=False, timeout=180)
    finally:
        weights.chmod(0o644)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    expected = "cosyserve: permission denied: /models/tiny2/CosyVoice-BlankEN/model.safetensors (mode 0600"
    assert lines[0].startswith(expected) and "not readable by uid 10001 " in lines[0], lines[0]
    record(f"{kind} image, a host file mode 0600", f"exit 2 at start: {lines[0][:120]}...")


def make_model_dir(engine: Engine, image: str, where: Path) -> None:
    """A tiny random-weight CosyVoice2 dir, written by the image itself as uid 10001."""
    where.mkdir(mode=0o777)
    where.chmod(0o777)
    engine("run", "--rm", *K8S_RUN, "-v", f"{where}:/models", image, "make-tiny-model", "--version", "2",
           "/models/tiny2")


def serve_and_check(engine: Engine, kind: str, models: Path) -> str:
    """Run the image as the Deployment does; ready, WAV, /metrics, SIGTERM drains and exits 0. Returns its log."""
    image, name, port = TAGS[kind], f"cosyserve-test-{kind}", free_port()
    engine("rm", "-f", name, check=False)
    t0 = time.monotonic()
    engine("run", "-d", "--name", name, *K8S_RUN, "-v", f"{models}:/models:ro",
           "-e", "COSYSERVE_ENGINE__MODEL_DIR=/models/tiny2", "-e", "COSYSERVE_SERVER__DRAIN_DELAY_S=1",
           "-p", f"127.0.0.1:{port}:8000", image)
    try:
        user = engine("inspect", "--format", "{{.Config.User}}", name).stdout.strip()
        assert user.split(":")[0] == "10001", user
        deadline = time.monotonic() + 300
        while True:
            try:
                if request(port, "GET", "/health/ready", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            state = engine("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", f"{kind}: the container stopped ({state}):\n" + engine("logs", name).stderr
            assert time.monotonic() < deadline, f"{kind}: not ready in 300 s:\n" + engine("logs", name).stderr
            time.sleep(1)
        record(f"{kind} image ready", f"{time.monotonic() - t0:.0f} s after start (read-only root, tmpfs /tmp, "
                                      f"no capabilities, uid {user})")
        status, headers, body = request(port, "POST", "/v1/tts", {"text": "Hello from the image."})
        assert status == 200 and headers.get("content-type", "").startswith("audio/wav"), (status, headers, body[:300])
        record(f"{kind} /v1/tts", f"200, {wav_seconds(body):.2f} s of 24 kHz WAV")
        status, _, body = request(port, "GET", "/metrics")
        assert status == 200 and b"tts_requests_total" in body and b"tts_slots" in body, (status, body[:300])

        # SIGTERM with a streamed request in flight: it must finish whole, then the server exit 0
        done: dict = {}

        def in_flight() -> None:
            try:
                done["response"] = request(port, "POST", "/v1/tts", {
                    "text": "A longer sentence, so that this request is still streaming when the signal comes in, "
                            "and the server has to finish it before it stops.", "stream": True}, timeout=120)
            except Exception as exc:  # noqa: BLE001 - reported below
                done["error"] = exc

        thread = threading.Thread(target=in_flight)
        thread.start()
        time.sleep(0.3)
        t1 = time.monotonic()
        engine("kill", "--signal", "TERM", name)
        exit_code = int(engine("wait", name, timeout=120).stdout.strip().splitlines()[-1])
        thread.join(120)
        log = engine("logs", name).stdout + engine("logs", name).stderr
        assert "error" not in done, f"{kind}: the in-flight request failed: {done.get('error')}\n{log}"
        status, _, body = done["response"]
        assert status == 200 and wav_seconds(body) > 0, (status, body[:300])
        assert exit_code == 0, f"{kind}: exit {exit_code} after SIGTERM\n{log}"
        assert "received SIGTERM: draining" in log, log
        record(f"{kind} SIGTERM", f"request in flight finished ({wav_seconds(body):.2f} s of audio), exit 0, "
                                  f"{time.monotonic() - t1:.1f} s")
        return log
    finally:
        engine("rm", "-f", name, check=False)


def check_no_pip_config(engine: Engine, kind: str) -> None:
    # the image's own ENV sets these two; anything else would be the host's (deploy/images/pip-host-config)
    r = engine("run", "--rm", "--entrypoint", "sh", TAGS[kind], "-c",
               "pip config list | grep -v '^:env:.\\(no-cache-dir\\|disable-pip-version-check\\)='; "
               "ls /etc/pip.conf /etc/xdg/pip 2>/dev/null; find /run -type f -size +0 2>/dev/null; true")
    assert r.stdout.strip() == "", f"{kind}: the image carries pip configuration:\n{r.stdout}"


def check_cuda(engine: Engine, models: Path) -> None:
    image = TAGS["cuda"]
    labels = json.loads(engine("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout or "{}") or {}
    source = labels.get("io.cosyserve.cosyvoice", "?")
    record("cuda image CosyVoice", "the v1/v2-only variant: the installed cosyvoice package (no upstream checkout)"
           if source.startswith("none@") else f"upstream checkout {source} (v1, v2 and v3)")

    # engine.device: cuda without a GPU: exit 2 at once, one line
    t0 = time.monotonic()
    r = engine("run", "--rm", *K8S_RUN, "-v", f"{models}:/models:ro", "-e", "COSYSERVE_ENGINE__MODEL_DIR=/models/tiny2",
               "-e", "COSYSERVE_ENGINE__DEVICE=cuda", image, check=False, timeout=180)
    seconds = time.monotonic() - t0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("cosyserve: engine.device is 'cuda' but"), r.stderr
    record("cuda image, engine.device cuda, no GPU", f"exit 2 in {seconds:.1f} s: {lines[0][:110]}...")

    # engine.device: auto serves on the CPU and says so once
    log = serve_and_check(engine, "cuda", models)
    warnings = [line for line in log.splitlines() if CUDA_WARNING in line]
    assert len(warnings) == 1, "\n".join(warnings) or log
    assert "cpu" in next(line for line in log.splitlines() if "ready: model" in line)
    record("cuda image, engine.device auto, no GPU", "serves on the CPU; the no-GPU warning logged once")

    # the NVIDIA wheels are the pinned ones
    freeze = dict(line.split("==", 1) for line in engine("run", "--rm", "--entrypoint", "pip", image,
                                                            "freeze").stdout.splitlines() if "==" in line)
    canon = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in freeze.items()}
    pins = dict(line.split("==", 1) for line in (ROOT / "requirements" / "cuda-constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    nvidia = {k: v for k, v in pins.items() if k.startswith(("nvidia-", "cuda-", "triton", "torch"))}
    wrong = {k: (v, canon.get(k)) for k, v in nvidia.items() if canon.get(k) != v}
    assert not wrong, f"cuda image: not the pinned wheels (pinned, installed): {wrong}"
    record("cuda image wheels", f"{len(nvidia)} NVIDIA/CUDA/torch wheels as requirements/cuda-constraints.txt pins")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("cpu", "cuda"))
    parser.add_argument("--keep", action="store_true", help="keep the images afterwards")
    args = parser.parse_args()
    kinds = [args.only] if args.only else ["cpu", "cuda"]
    t0 = time.monotonic()
    engine = Engine()
    say(f"engine: {engine.name} ({engine('--version').stdout.strip()})")
    tmp = Path(tempfile.mkdtemp(prefix="cosyserve-images-"))
    ok = False
    try:
        preflight(engine)
        # the CPU image serves a dir built on the host (what a user mounts), the CUDA image one it writes itself
        host_models = tmp / "host"
        if "cpu" in kinds:
            host_model_dir(host_models)
        for kind in kinds:
            build(engine, kind)
            check_no_pip_config(engine, kind)
            if kind == "cpu":
                check_unreadable_model_dir(engine, "cpu", host_models)
                serve_and_check(engine, "cpu", host_models)
            else:
                models = tmp / "models"
                make_model_dir(engine, TAGS[kind], models)
                check_cuda(engine, models)
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not args.keep:
            for kind in kinds:
                engine("rmi", "-f", TAGS[kind], check=False)
            engine("image", "prune", "-f", check=False)  # the dangling layers of the builds' stages
        record("make test-images", f"{'passed' if ok else 'FAILED'} in {(time.monotonic() - t0) / 60:.1f} min")
        print("\n".join(f"  {what}: {value}" for what, value in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
