"""deploy/: the Kubernetes manifests, validated against the current Kubernetes release's
schemas (kubernetes-validate, strict: an unknown field fails) and the Prometheus
Operator's CRDs (the cloudcoil models generated from them), and tied to the code: the
options, the configuration, the port and probes the agent serves, the RBAC contract,
the image's sources."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodecheck.agent.config import AgentConfig, load_config
from nodecheck.checks.registry import load_checks
from tests.agent.test_daemon import free_port, get, wait_for
from tests.conftest import CLEAN_ENVIRON, Node

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
TAINT_KEY = "nodecheck.io/unhealthy"
# The Prometheus Operator's kinds: CRDs, not in Kubernetes' own schemas.
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}
MONITOR_FILES = {"servicemonitor.yaml", "podmonitor.yaml"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) of every manifest in deploy/kubernetes."""
    found = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [(path.name, doc) for doc in documents(path)]
    return found


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    matching = [
        doc
        for _, doc in manifests()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matching) == 1, f"{kind} {name}: {len(matching)} documents"
    return matching[0]


def daemonset() -> dict[str, Any]:
    return the("DaemonSet", "nodecheck-agent")


def agent_container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = daemonset()["spec"]["template"]["spec"]["containers"]
    [container] = containers
    assert container["name"] == "agent"
    return container


# -- the schemas ---------------------------------------------------------------------


def kubernetes_validator() -> Any:
    """kubernetes-validate, which has no type information."""
    return importlib.import_module("kubernetes_validate")


def kubernetes_validate(document: dict[str, Any]) -> str:
    validator = kubernetes_validator()
    version: str = validator.validate(document, validator.latest_version(), strict=True)
    return version


@pytest.mark.parametrize(
    ("file", "document"),
    [(f, d) for f, d in manifests() if d["kind"] not in OPERATOR_KINDS],
    ids=lambda value: (
        value if isinstance(value, str) else f"{value['kind']}/{value['metadata']['name']}"
    ),
)
def test_each_manifest_is_valid_for_the_newest_kubernetes(
    file: str, document: dict[str, Any]
) -> None:
    version = kubernetes_validate(document)
    print(f"{file}: {document['kind']} valid for Kubernetes {version} (strict)")


def test_the_validation_is_strict_and_can_fail() -> None:
    validator = kubernetes_validator()

    print(f"kubernetes-validate: Kubernetes {validator.latest_version()}")
    broken = copy.deepcopy(daemonset())
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(validator.ValidationError, match="privilegd"):
        kubernetes_validate(broken)
    wrong_type = copy.deepcopy(daemonset())
    wrong_type["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(validator.ValidationError):
        kubernetes_validate(wrong_type)


def operator_model(kind: str) -> Any:
    """The Prometheus Operator CRD's model (cloudcoil-models-prometheus-operator, generated
    from prometheus-operator's CRDs). Imported by name: mypy need not read its 2 MB."""
    module = importlib.import_module("cloudcoil.models.prometheus_operator.v1")
    return getattr(module, kind)


def operator_validate(document: dict[str, Any]) -> None:
    """Valid for the CRD, strictly: the models ignore unknown fields, so the document
    must come back whole from them (a field they dropped is one the CRD lacks)."""
    model = operator_model(document["kind"]).model_validate(document)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == document


@pytest.mark.parametrize("kind", sorted(OPERATOR_KINDS))
def test_the_monitors_are_valid_for_the_operators_crds(kind: str) -> None:
    document = the(kind, "nodecheck-agent")
    operator_validate(document)
    broken = copy.deepcopy(document)
    endpoints = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    broken["spec"][endpoints][0]["scrape_interval"] = "30s"
    with pytest.raises(AssertionError):
        operator_validate(broken)
    wrong_type = copy.deepcopy(document)
    wrong_type["spec"][endpoints][0]["relabelings"] = "node"
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        operator_validate(wrong_type)


def test_the_kustomization_lists_every_manifest_but_the_monitors() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    # The admission policy is opt-in: it locks the agent out of clusters before 1.30.
    assert listed == present - MONITOR_FILES - {"admission-policy.yaml"}
    assert all((KUBE / name).is_file() for name in listed)


KUBECTL = shutil.which("kubectl")


def kustomize(folder: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl to run kustomize with")
def test_what_kubectl_apply_k_sends_is_valid() -> None:
    rendered = kustomize(KUBE)
    assert {d["kind"] for d in rendered} == {
        "Namespace",
        "ResourceQuota",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "DaemonSet",
    }
    for document in rendered:
        kubernetes_validate(document)


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl to run kustomize with")
def test_what_kubectl_apply_k_sends_for_npd_is_valid() -> None:
    rendered = kustomize(KUBE / "npd")
    assert sorted((d["kind"], d["metadata"]["namespace"]) for d in rendered) == [
        ("ConfigMap", "kube-system"),
        ("DaemonSet", "kube-system"),
    ]
    for document in rendered:
        kubernetes_validate(document)


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl to run kustomize with")
def test_reading_the_jobs_environments_is_an_opt_in_of_two_capabilities() -> None:
    """deploy/kubernetes-job-environments is the default agent plus SYS_PTRACE and
    DAC_READ_SEARCH, each with its reason in the overlay, and nothing else changed."""
    rendered = kustomize(DEPLOY / "kubernetes-job-environments")
    for document in rendered:
        kubernetes_validate(document)
    [reading] = [d for d in rendered if d["kind"] == "DaemonSet"]
    [container] = reading["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["capabilities"]["add"] == [
        "SYSLOG",
        "SYS_PTRACE",
        "DAC_READ_SEARCH",
    ]
    default = copy.deepcopy(reading)
    default["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"][
        "add"
    ] = ["SYSLOG"]
    [plain] = [d for d in kustomize(KUBE) if d["kind"] == "DaemonSet"]
    assert default == plain
    overlay = (DEPLOY / "kubernetes-job-environments" / "kustomization.yaml").read_text()
    for capability in ("SYS_PTRACE", "DAC_READ_SEARCH"):
        assert f"# - {capability}: " in overlay


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl to run kustomize with")
def test_the_privileged_variant_is_the_same_agent_privileged() -> None:
    rendered = kustomize(DEPLOY / "kubernetes-privileged")
    [privileged] = [d for d in rendered if d["kind"] == "DaemonSet"]
    for document in rendered:
        kubernetes_validate(document)
    context = privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert context["privileged"] is True
    # The API server refuses privileged with allowPrivilegeEscalation false
    # ("cannot set `allowPrivilegeEscalation` to false and `privileged` to true":
    # kubernetes/kubernetes pkg/apis/core/validation/validation.go).
    assert context.get("allowPrivilegeEscalation", True) is True
    assert context["readOnlyRootFilesystem"] is True
    base = copy.deepcopy(daemonset())
    base["spec"]["template"]["spec"]["containers"][0]["securityContext"] = context
    assert privileged == base  # nothing else differs


# -- the DaemonSet and the code --------------------------------------------------------


def agent_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck", "agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_the_daemonsets_options_are_the_agents() -> None:
    container = agent_container()
    assert "command" not in container  # the image's ENTRYPOINT: nodecheck agent
    options = [arg for arg in container["args"] if arg.startswith("--")]
    assert options == ["--config", "--sysfs-root", "--procfs-root"]
    offered = set(re.findall(r"^\s+(--[a-z-]+)", agent_help(), re.MULTILINE))
    assert set(options) <= offered, set(options) - offered


def mounts() -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in agent_container()["volumeMounts"]}


def volumes() -> dict[str, dict[str, Any]]:
    spec = daemonset()["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


def option(name: str) -> str:
    args = agent_container()["args"]
    return str(args[args.index(name) + 1])


def test_the_host_is_mounted_read_only_where_the_options_point() -> None:
    for path, host in ((option("--sysfs-root"), "/sys"), (option("--procfs-root"), "/proc")):
        mount = mounts()[path]
        assert mount["readOnly"] is True
        assert volumes()[mount["name"]]["hostPath"] == {"path": host, "type": "Directory"}
    kmsg = mounts()["/dev/kmsg"]
    assert kmsg["readOnly"] is True
    assert volumes()[kmsg["name"]]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}


def configmap_toml() -> str:
    configmap = the("ConfigMap", "nodecheck-agent")
    text: str = configmap["data"]["agent.toml"]
    return text


def knows_kubernetes_section() -> bool:
    return "kubernetes" in {f.name for f in dataclasses.fields(AgentConfig)}


def without_kubernetes_table(text: str) -> str:
    """The configuration without its [kubernetes] table (the last one in the file)."""
    head, _, _ = text.partition("[kubernetes]")
    return head


def test_the_mounted_configuration_is_where_the_agent_reads_it_and_parses(
    tmp_path: Path,
) -> None:
    config_path = Path(option("--config"))
    mount = mounts()[str(config_path.parent)]
    assert mount["readOnly"] is True
    assert volumes()[mount["name"]]["configMap"]["name"] == "nodecheck-agent"
    assert config_path.name in the("ConfigMap", "nodecheck-agent")["data"]
    text = configmap_toml()
    kubernetes = tomllib.loads(text)["kubernetes"]
    assert kubernetes == {"enabled": True, "taint": False}
    file = tmp_path / "agent.toml"
    # The [kubernetes] table is read by the agent's reporter's section of the loader;
    # where that is not in this tree yet, the rest of the file is checked.
    file.write_text(text if knows_kubernetes_section() else without_kubernetes_table(text))
    config = load_config(file, set(load_checks()))
    if knows_kubernetes_section():
        settings: Any = config.kubernetes  # type: ignore[attr-defined,unused-ignore]
        assert settings.enabled is True and settings.taint is False
    # Its writable paths are the DaemonSet's hostPath volumes.
    assert config.state_dir is not None and config.results_file is not None
    for path in (Path(config.state_dir), config.results_file.parent):
        mount = mounts()[str(path)]
        assert mount.get("readOnly", False) is False
        assert volumes()[mount["name"]]["hostPath"]["path"] == str(path)
    assert str(config.kernel_log) == "/dev/kmsg"


def container_port() -> int:
    [port] = agent_container()["ports"]
    assert port["name"] == "metrics"
    number: int = port["containerPort"]
    return number


def _start_daemonset_agent(
    dgx: Node, tmp_path: Path, text: str, port: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """The agent with the DaemonSet's options and configuration `text`, the host's paths
    replaced by the replica's and the port by `port`; its log file."""
    text = without_kubernetes_table(text).replace(f":{container_port()}", f":{port}")
    text = text.replace("/var/lib/nodecheck", str(tmp_path / "state"))
    text = text.replace("/run/nodecheck/agent", str(tmp_path / "results"))
    (tmp_path / "agent.toml").write_text(text)
    replaced = {
        option("--config"): str(tmp_path / "agent.toml"),
        option("--sysfs-root"): str(dgx.root / "sys"),
        option("--procfs-root"): str(dgx.root / "proc"),
    }
    args = [replaced.get(arg, arg) for arg in agent_container()["args"]]
    log = tmp_path / "agent.log"  # a pipe nobody reads would block the agent once full
    with log.open("wb") as sink:
        agent = subprocess.Popen(
            [sys.executable, "-m", "nodecheck", *dgx.cli_args, "agent", *args],
            env={**CLEAN_ENVIRON, **dgx.env},
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    return agent, log


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_port_and_the_probes_are_what_the_agent_serves(dgx: Node, tmp_path: Path) -> None:
    """The agent started with the DaemonSet's own options and configuration (the host's
    paths replaced by the replica's, the port by a free one): each probe's path answers
    200 on the port the configuration listens on, the container's port."""
    text = configmap_toml()
    assert f'listen = ":{container_port()}"' in text
    (tmp_path / "state").mkdir()  # the DaemonSet's hostPath volume; one given must exist
    (tmp_path / "results").mkdir()  # the hostPath volume, DirectoryOrCreate
    # A port free when picked may be another socket's by the time the agent binds it (an
    # outgoing connection's local port): then the agent says so and exits, and the test
    # picks another. Any other exit is the test's failure, below.
    for _ in range(3):
        port = free_port()
        agent, log = _start_daemonset_agent(dgx, tmp_path, text, port)

        def bound(agent: subprocess.Popen[bytes] = agent, port: int = port) -> bool:
            return agent.poll() is not None or _listening(port)

        wait_for(bound, 60, "the agent to bind")
        if agent.poll() is None or "address in use" not in log.read_text():
            break
    try:
        for probe in ("livenessProbe", "readinessProbe"):
            http = agent_container()[probe]["httpGet"]
            assert http["port"] == "metrics"
            url = f"http://127.0.0.1:{port}{http['path']}"

            def answered(url: str = url) -> int | None:
                if agent.poll() is not None:
                    pytest.fail(f"the agent died: {log.read_text()}")
                try:
                    return get(url)[0]
                except OSError:
                    return None

            assert wait_for(answered, 60, f"{probe} {url}") == 200
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def test_no_gpu_is_requested_and_the_runtime_exposes_them() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    for container in spec["containers"] + spec.get("initContainers", []):
        for kind in ("requests", "limits"):
            asked = container.get("resources", {}).get(kind, {})
            assert not [name for name in asked if name.startswith("nvidia.com/")], container
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in agent_container()["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_unprivileged_with_every_added_capability_said_why() -> None:
    context = agent_container()["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    added = context["capabilities"]["add"]
    # Other pods' environments only where the operator opts in (below).
    assert added == ["SYSLOG"]
    lines = (KUBE / "daemonset.yaml").read_text().splitlines()
    for capability in added:
        [at] = [n for n, line in enumerate(lines) if line.strip() == f"- {capability}"]
        comment: list[str] = []
        for line in reversed(lines[:at]):
            if not line.strip().startswith("#"):
                break
            comment.insert(0, line.strip().lstrip("# "))
        said = " ".join(comment)
        assert said.startswith(f"{capability}:"), (capability, said)
        assert len(said) > 80, (capability, said)  # a reason, not a label


def test_it_tolerates_its_own_taint_and_runs_critical_on_gpu_nodes() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # Off a node whose driver the GPU Operator is upgrading, as NVML clients must be.
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {
            "key": "nvidia.com/gpu.deploy.client",
            "operator": "NotIn",
            "values": ["false", "paused-for-driver-upgrade"],
        }
    ]
    assert spec["hostPID"] is True
    assert daemonset()["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    resources = agent_container()["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]
    quota = the("ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"]
    assert quota == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
    ]


def test_the_rbac_is_exactly_the_contracts() -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in documents(KUBE / "rbac.yaml"):
        by_kind.setdefault(document["kind"], []).append(document)
    assert sorted(by_kind) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    [account] = by_kind["ServiceAccount"]
    assert account["metadata"] == {
        "name": "nodecheck",
        "namespace": "nodecheck",
        "labels": {"app.kubernetes.io/name": "nodecheck"},
    }
    [cluster_role] = by_kind["ClusterRole"]
    assert cluster_role["metadata"]["name"] == "nodecheck-agent"
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    [role] = by_kind["Role"]
    assert (role["metadata"]["name"], role["metadata"]["namespace"]) == (
        "nodecheck-events",
        "default",
    )
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    subject = {"kind": "ServiceAccount", "name": "nodecheck", "namespace": "nodecheck"}
    for binding, role_kind, role_name in (
        (by_kind["ClusterRoleBinding"], "ClusterRole", "nodecheck-agent"),
        (by_kind["RoleBinding"], "Role", "nodecheck-events"),
    ):
        [bound] = binding
        assert bound["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role_name,
        }
        assert bound["subjects"] == [subject]
    assert daemonset()["spec"]["template"]["spec"]["serviceAccountName"] == "nodecheck"


def test_the_monitors_scrape_the_agents_port() -> None:
    labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    pod_monitor = the("PodMonitor")["spec"]
    assert pod_monitor["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in pod_monitor["podMetricsEndpoints"]] == ["metrics"]
    assert [e["path"] for e in pod_monitor["podMetricsEndpoints"]] == ["/metrics"]
    service = the("Service", "nodecheck-agent")["spec"]
    assert service["selector"].items() <= labels.items()
    [port] = service["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == (
        "metrics",
        container_port(),
        "metrics",
    )
    service_monitor = the("ServiceMonitor")["spec"]
    labels_of_service = the("Service", "nodecheck-agent")["metadata"]["labels"]
    assert service_monitor["selector"]["matchLabels"].items() <= labels_of_service.items()
    assert [e["port"] for e in service_monitor["endpoints"]] == ["metrics"]


# -- the image ---------------------------------------------------------------------------


def dockerfile_copies(path: Path) -> list[str]:
    """The build-context sources of a Dockerfile's COPY lines (not --from= ones)."""
    sources = []
    for line in path.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            sources += words[1:-1]
    return sources


def test_the_images_sources_exist_and_hold_every_package() -> None:
    sources = dockerfile_copies(DEPLOY / "Dockerfile")
    for source in sources:
        assert (ROOT / source).exists(), source
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = set(project["tool"]["setuptools"]["package-dir"].values())
    assert {s.rstrip("/") for s in sources} >= package_dirs | {"pyproject.toml", "README.md"}
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert 'ENTRYPOINT ["nodecheck", "agent"]' in text
    # What the Dockerfile's own ignore file lets through is what it copies.
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {s.rstrip("/") for s in sources}


def container_engine() -> str | None:
    for engine in ("docker", "podman"):
        path = shutil.which(engine)
        if path is None:
            continue
        info = subprocess.run([path, "info"], capture_output=True, timeout=30, check=False)
        if info.returncode == 0:
            return path
    return None


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    found = container_engine()
    if found is None:
        pytest.skip("no docker or podman that answers `info` (a daemon) on this machine")
    yield found


def test_the_image_builds_and_runs_nodecheck(engine: str) -> None:
    tag = f"nodecheck-test:{int(time.time())}"
    built = subprocess.run(
        [engine, "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    try:
        ran = subprocess.run(
            [engine, "run", "--rm", "--read-only", tag, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0 and "--procfs-root" in ran.stdout, ran.stderr
        which = subprocess.run(
            [
                engine,
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                tag,
                "-c",
                "command -v nodecheck; command -v gcc cc || true",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert which.stdout.split() == ["/usr/local/bin/nodecheck"], which.stdout
    finally:
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120, check=False)


# -- node-problem-detector mode ------------------------------------------------------------


def npd_config() -> dict[str, Any]:
    text = (KUBE / "npd" / "nodecheck-plugin-monitor.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def test_npd_runs_the_plugin_where_the_image_installs_it() -> None:
    # pip in python:3.11-slim (prefix /usr/local) installs console scripts in
    # /usr/local/bin; NPD refuses a config whose rule path does not exist.
    assert {rule["path"] for rule in npd_config()["rules"]} == {"/usr/local/bin/nodecheck"}
    npd_dockerfile = (KUBE / "npd" / "Dockerfile").read_text()
    assert "COPY --from=npd /node-problem-detector /node-problem-detector" in npd_dockerfile
    assert dockerfile_copies(KUBE / "npd" / "Dockerfile") == []


def npd_daemonset() -> dict[str, Any]:
    [daemon_set] = documents(KUBE / "npd" / "daemonset.yaml")
    return daemon_set


def test_npd_daemonset_mounts_what_the_rules_name() -> None:
    spec = npd_daemonset()["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["name"] == "node-problem-detector"
    assert not any(k.startswith("nvidia.com/") for k in container["resources"]["limits"])
    monitor = [c for c in container["command"] if c.startswith("--config.custom-plugin-monitor=")]
    [path] = [c.split("=", 1)[1] for c in monitor]
    by_path = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = by_path[str(Path(path).parent)]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    kustomization = yaml.safe_load((KUBE / "npd" / "kustomization.yaml").read_text())
    [generated] = kustomization["configMapGenerator"]
    assert volume["configMap"]["name"] == generated["name"]
    assert generated["files"] == [Path(path).name]
    assert kustomization["resources"] == ["daemonset.yaml"]
    args = npd_config()["rules"][0]["args"]
    for root in (args[args.index("--sysfs-root") + 1], args[args.index("--procfs-root") + 1]):
        assert by_path[root]["readOnly"] is True
    assert "/run/nodecheck/agent" in by_path  # the agent's results, when it runs too


# What NPD's own DaemonSet runs and mounts (kubernetes/node-problem-detector
# deployment/node-problem-detector.yaml, v0.8.19), which the GPU nodes' NPD keeps.
UPSTREAM_MONITORS = (
    "--config.system-log-monitor=/config/kernel-monitor.json,"
    "/config/readonly-monitor.json,/config/docker-monitor.json"
)
UPSTREAM_MOUNTS = {
    "log": "/var/log",
    "kmsg": "/dev/kmsg",
    "localtime": "/etc/localtime",
    "config": "/config",
}


def test_npd_on_gpu_nodes_keeps_everything_npd_does_and_cpu_nodes_keep_npd() -> None:
    """One NPD per node: nodecheck's, with the NVIDIA runtime, on the GPU nodes only (a
    CPU node cannot start a pod of runtimeClassName nvidia), running NPD's own monitors
    beside the plugin, with NPD's ServiceAccount, mounts, ConfigMap and tolerations; NPD's
    own DaemonSet patched off exactly those nodes, its own requirement kept, nothing else
    touched."""
    daemon_set = npd_daemonset()
    kubernetes_validate(daemon_set)  # raises on a field Kubernetes does not know
    spec = daemon_set["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["command"][:3] == [
        "/node-problem-detector",
        "--logtostderr",
        UPSTREAM_MONITORS,
    ]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert UPSTREAM_MOUNTS.items() <= mounts.items()
    [config] = [v for v in spec["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == "node-problem-detector-config"
    assert [i["key"] for i in config["configMap"]["items"]] == [
        "kernel-monitor.json",
        "readonly-monitor.json",
        "docker-monitor.json",
    ]
    assert spec["serviceAccountName"] == "node-problem-detector"
    assert spec["runtimeClassName"] == "nvidia"
    assert {"effect": "NoSchedule", "operator": "Exists"} in spec["tolerations"]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    gpu_only = {e["key"]: (e["operator"], e["values"]) for e in term["matchExpressions"]}
    assert gpu_only == {
        "kubernetes.io/os": ("In", ["linux"]),
        "nvidia.com/gpu.present": ("In", ["true"]),
        "nvidia.com/gpu.deploy.client": ("NotIn", ["false", "paused-for-driver-upgrade"]),
    }
    patch = yaml.safe_load((KUBE / "npd" / "upstream-patch.yaml").read_text())
    assert list(patch["spec"]["template"]["spec"]) == ["affinity"]
    upstream_terms = patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]

    def runs(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
        """Whether a node with `labels` matches the terms (ORed; expressions ANDed)."""

        def holds(e: dict[str, Any]) -> bool:
            value = labels.get(e["key"])
            if e["operator"] == "In":
                return value in e["values"]
            return value not in e["values"]  # NotIn: a missing label matches too

        return any(all(holds(e) for e in term["matchExpressions"]) for term in terms)

    gpu_terms = [term]
    linux = {"kubernetes.io/os": "linux"}
    # One NPD on every Linux node, whatever its GPU labels; none on another OS.
    for labels in (
        linux,
        {**linux, "nvidia.com/gpu.present": "true"},
        {**linux, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "true"},
        {**linux, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "false"},
        {
            **linux,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.client": "paused-for-driver-upgrade",
        },
    ):
        assert runs(upstream_terms, labels) + runs(gpu_terms, labels) == 1, labels
    assert not runs(upstream_terms, {"kubernetes.io/os": "windows"})


# -- the admission policy ------------------------------------------------------------

SERVICE_ACCOUNT_USER = "system:serviceaccount:nodecheck:nodecheck"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
OUR_CONDITIONS = ("NodecheckGpuHardware", "NodecheckGpuPerformance", "NodecheckNodeConfig")


def admission_policy() -> dict[str, Any]:
    [policy] = [
        d
        for d in documents(KUBE / "admission-policy.yaml")
        if d["kind"] == "ValidatingAdmissionPolicy"
    ]
    return policy


def denials(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    status: bool = False,
    token_node: str | None = "gpu-1",
    user: str = SERVICE_ACCOUNT_USER,
) -> list[str] | None:
    """The policy's verdict on an update of `old` to `new` as the API server evaluates it
    (matchConditions, then the variables in order, then each validation): None when it
    does not apply, else the messages of the validations that deny (an evaluation error
    denies too, failurePolicy Fail). The CEL is evaluated by cel-python."""
    celpy = importlib.import_module("celpy")
    spec = admission_policy()["spec"]
    environment = celpy.Environment()
    extra = {NODE_NAME_EXTRA: [token_node]} if token_node else {}
    request = {
        "userInfo": {"username": user, "extra": extra},
        "subResource": "status" if status else "",
        "operation": "UPDATE",
    }
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "variables": celpy.celtypes.MapType({}),
    }

    def evaluate(expression: str) -> Any:
        program = environment.program(environment.compile(expression))
        return program.evaluate(activation)

    for condition in spec["matchConditions"]:
        if evaluate(condition["expression"]) != celpy.celtypes.BoolType(True):
            return None
    for variable in spec["variables"]:
        value = evaluate(variable["expression"])
        variables = dict(activation["variables"])
        variables[celpy.celtypes.StringType(variable["name"])] = value
        activation["variables"] = celpy.celtypes.MapType(variables)
    denied = []
    for validation in spec["validations"]:
        try:
            allowed = evaluate(validation["expression"]) == celpy.celtypes.BoolType(True)
        except Exception:  # an error in evaluation: the API server denies
            allowed = False
        if not allowed:
            denied.append(" ".join(validation["message"].split()))
    return denied


def a_node(name: str = "gpu-1") -> dict[str, Any]:
    """A node as the API server holds it (the fields the policy reads, and more)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDRs": ["10.0.1.0/24"],
            "providerID": "metal://gpu-1",
            "unschedulable": True,
            "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": TAINT_KEY, "value": "rma", "effect": "NoExecute"},  # an admin's
            ],
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8", "cpu": "224"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "220"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "NodecheckGpuHardware", "status": "False", "reason": "NoFailingCheck"},
            ],
        },
    }


def changed(node: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(node)
    change(new)
    return new


def test_the_admission_policy_lets_the_agent_write_only_its_own_nodes_taint_and_conditions() -> (
    None
):
    node = a_node()
    ours = {"key": TAINT_KEY, "value": "gpu-hardware", "effect": "NoSchedule"}

    def taint(new: dict[str, Any]) -> None:
        new["spec"]["taints"].append(ours)
        new["metadata"]["annotations"]["nodecheck.io/taint"] = '{"fingerprint":"a"}'

    def condition(new: dict[str, Any]) -> None:
        new["status"]["conditions"][1].update(status="True", reason="GpuXidFailed")
        new["status"]["conditions"].append({"type": "NodecheckNodeConfig", "status": "False"})

    # What the agent does, on its node: allowed (the test can pass, not only deny).
    assert denials(node, changed(node, taint)) == []
    tainted = changed(node, taint)
    untaint = changed(tainted, lambda n: n["spec"]["taints"].remove(ours))
    assert denials(tainted, untaint) == []
    assert denials(node, changed(node, condition), status=True) == []
    # Someone else's update: the policy does not apply.
    assert denials(node, changed(node, lambda n: n["spec"].pop("unschedulable")), user="x") is None

    def denied(new: dict[str, Any], words: str, **how: Any) -> None:
        messages = denials(node, new, **how)
        assert messages and any(words in m for m in messages), messages

    other = a_node("gpu-2")
    denied(changed(other, taint), "only write the node its pod runs on", token_node="gpu-1")
    denials_other = denials(other, changed(other, taint))
    assert denials_other and "only write the node its pod runs on" in denials_other[0]
    denied(changed(node, taint), "names no node", token_node=None)
    denied(changed(node, lambda n: n["spec"]["taints"].pop(0)), "only its taint")
    denied(changed(node, lambda n: n["spec"]["taints"].pop(1)), "only its taint")  # NoExecute
    denied(changed(node, lambda n: n["spec"].pop("unschedulable")), "only its taint")
    denied(changed(node, lambda n: n["spec"].update(providerID="x")), "only its taint")
    denied(
        changed(node, lambda n: n["metadata"]["annotations"].update(x="1")), "only its annotation"
    )
    denied(changed(node, lambda n: n["metadata"]["annotations"].clear()), "only its annotation")
    denied(changed(node, lambda n: n["metadata"]["labels"].update(x="1")), "labels")
    denied(
        changed(node, lambda n: n["status"]["conditions"][0].update(status="False")),
        "only its conditions",
        status=True,
    )
    denied(
        changed(node, lambda n: n["status"]["capacity"].update({"nvidia.com/gpu": "16"})),
        "only its conditions",
        status=True,
    )
    denied(
        changed(node, lambda n: n["status"]["addresses"].clear()),
        "only its conditions",
        status=True,
    )


def test_the_admission_policy_matches_what_the_rbac_grants() -> None:
    policy = admission_policy()
    [binding] = [
        d
        for d in documents(KUBE / "admission-policy.yaml")
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    cluster_role = the("ClusterRole", "nodecheck-agent")
    patched = {r for rule_ in cluster_role["rules"] for r in rule_["resources"]}
    assert set(rule["resources"]) == patched and rule["operations"] == ["UPDATE"]
    [account] = [d for d in documents(KUBE / "rbac.yaml") if d["kind"] == "ServiceAccount"]
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    assert user == SERVICE_ACCOUNT_USER
    assert f'"{user}"' in spec["matchConditions"][0]["expression"]
    text = json.dumps(spec)
    assert all(kind in text for kind in OUR_CONDITIONS)
    from nodecheck.agent.kubernetes.fault_classes import CONDITION_TYPES
    from nodecheck.agent.kubernetes.reporter import OWNERSHIP_ANNOTATION, TAINT_EFFECT
    from nodecheck.agent.kubernetes.reporter import TAINT_KEY as AGENTS_TAINT_KEY

    assert set(CONDITION_TYPES.values()) == set(OUR_CONDITIONS)
    assert AGENTS_TAINT_KEY in text and OWNERSHIP_ANNOTATION in text
    assert f"t.effect == '{TAINT_EFFECT}'" in text


# -- the fleet rules' view of the agents ----------------------------------------------


def rule_jobs() -> set[str]:
    """Every job="..." the shipped alert and recording rules match on."""
    found: set[str] = set()
    for path in sorted((ROOT / "monitoring").glob("*.yml")):
        found |= set(re.findall(r'job="([^"]+)"', path.read_text()))
    return found


@pytest.mark.parametrize(("kind", "target"), [("ServiceMonitor", "Service"), ("PodMonitor", None)])
def test_the_monitors_give_the_job_the_rules_expect(kind: str, target: str | None) -> None:
    # The Operator names the job after the Service (or namespace/PodMonitor) unless
    # jobLabel names a label of the Service (or Pod) whose value becomes the job.
    monitor = the(kind, "nodecheck-agent")
    label = monitor["spec"]["jobLabel"]
    if target is not None:
        labels = the(target, "nodecheck-agent")["metadata"]["labels"]
    else:
        labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    assert rule_jobs() == {labels[label]}


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_the_monitors_keep_one_instance_per_node_across_pod_restarts(kind: str) -> None:
    # The fleet rules know a node by `instance`: a pod's IP:port changes at every
    # rollout, its node's name does not. (No hostNetwork for it: that would put the
    # unauthenticated endpoints on the node's network, where no NetworkPolicy applies.)
    monitor = the(kind, "nodecheck-agent")
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    [endpoint] = endpoints
    relabelings = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabelings["instance"] == ["__meta_kubernetes_pod_node_name"]
    assert "hostNetwork" not in daemonset()["spec"]["template"]["spec"]
