"""deploy/kubernetes/ holds together: every command line parses with the real programs' own parsers, the
server.conf in the ConfigMap loads, and the names and paths the pieces share agree (region directory, kubelet's
device-plugin directory, the controller's Service, etcd's, oriond's pid file). No cluster runs here: what a
cluster would reject for its own reasons (an image that does not exist) is not checked."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import _parser as controller_parser
from host_agent.daemon import oriond, pidfile
from host_agent.daemon.config import ServerConfig
from host_agent.k8s import cli as plugin_cli
from host_agent.k8s.api import DEVICE_PLUGIN_DIR, RESOURCE_NAME

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NODE_IP = "10.1.2.3"


def _documents() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


DOCS = _documents()


def _pod(kind: str, name: str) -> dict[str, Any]:
    return DOCS[(kind, name)]["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, the downward API's node IP as NODE_IP."""
    return {e["name"]: e.get("value", NODE_IP) for e in container.get("env", [])}


def _argv(container: dict[str, Any]) -> list[str]:
    """The program's argv: `sh -c "[mkdir …] && exec PROG ARGS"` with the environment substituted, as sh would."""
    command = container["command"]
    if command[:2] != ["sh", "-c"]:
        return list(command)
    script = command[2].split("exec ", 1)[1]
    for name, value in _env(container).items():
        script = script.replace(f"${name}", value)
    return shlex.split(script)


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    """{mount path in the container: host path (or configmap:NAME, secret:NAME)}."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            out[mount["mountPath"]] = volume["hostPath"]["path"]
        elif "secret" in volume:
            out[mount["mountPath"]] = f"secret:{volume['secret']['secretName']}"
        else:
            out[mount["mountPath"]] = f"configmap:{volume['configMap']['name']}"
    return out


@pytest.fixture
def server_conf(tmp_path: Path) -> Path:
    path = tmp_path / "server.conf"
    path.write_text(DOCS[("ConfigMap", "orion-server-conf")]["data"]["server.conf"])
    return path


def test_every_piece_of_orions_deployment_is_there_in_one_namespace() -> None:
    assert set(DOCS) >= {("Namespace", "orion-system"), ("ConfigMap", "orion-server-conf"),
                         ("StatefulSet", "orion-etcd"), ("Service", "orion-etcd"), ("Deployment", "orion-controller"),
                         ("Service", "orion-controller"), ("DaemonSet", "oriond"), ("DaemonSet", "orion-plugin"),
                         ("Pod", "cuda-on-orion"), ("NetworkPolicy", "orion-etcd-from-controllers-only")}
    for (kind, name), doc in DOCS.items():
        if kind not in ("Namespace", "Pod"):
            assert doc["metadata"]["namespace"] == "orion-system", (kind, name)


def test_the_configmaps_server_conf_loads_and_names_the_sealed_region_directory(server_conf: Path) -> None:
    config = ServerConfig.load(str(server_conf), environ={})
    assert config.unknown_keys == ()
    assert config.shm.path_base == "/dev/shm/orion-k8s/"
    oriond_script = _pod("DaemonSet", "oriond")["containers"][0]["command"][2]
    assert oriond_script.startswith("mkdir -p -m 0700 /dev/shm/orion-k8s && exec oriond ")
    for name in ("oriond", "orion-plugin"):  # both see the host's /dev/shm where the regions are, at its own path
        assert _mounts(_pod("DaemonSet", name))["/dev/shm"] == "/dev/shm", name
        assert _mounts(_pod("DaemonSet", name))["/etc/orion"] == "configmap:orion-server-conf", name


def test_the_plugins_command_line_is_orions_and_parses(server_conf: Path) -> None:
    pod = _pod("DaemonSet", "orion-plugin")
    argv = _argv(pod["containers"][0])
    assert argv[0] == "orion-k8s-plugin" and argv[1] == "-controller"  # Orion's entrypoint spelling
    args = plugin_cli._parse([a if a != "/etc/orion/server.conf" else str(server_conf) for a in argv[1:]])
    config = ServerConfig.load(str(server_conf), environ={})
    assert args.controller == config.controller_addr == "orion-controller.orion-system.svc.cluster.local:9123"
    assert args.node == NODE_IP
    assert _mounts(pod)[DEVICE_PLUGIN_DIR.rstrip("/")] == DEVICE_PLUGIN_DIR.rstrip("/")
    run = str(Path(pidfile.DEFAULT_PID_FILE).parent)  # where oriond's pid file is, to wake it
    assert _mounts(pod)[run] == _mounts(_pod("DaemonSet", "oriond"))[run] == run
    assert pod["hostPID"] is True


def test_oriond_is_named_by_its_nodes_ip_and_its_command_parses(server_conf: Path) -> None:
    pod = _pod("DaemonSet", "oriond")
    argv = _argv(pod["containers"][0])
    assert argv[0] == "oriond"
    args = oriond._parse([a if a != "/etc/orion/server.conf" else str(server_conf) for a in argv[1:]])
    assert args.b == NODE_IP  # the same name the plugin looks for in the pool (-node)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "privileged" not in str(pod)


def test_the_controller_reaches_etcd_through_its_service_and_nothing_else_may() -> None:
    container = _pod("Deployment", "orion-controller")["containers"][0]
    args = controller_parser().parse_args(container["command"][1:])
    service = DOCS[("Service", "orion-etcd")]
    port = service["spec"]["ports"][0]["port"]
    assert args.etcd == f"http://orion-etcd.orion-system.svc.cluster.local:{port}"
    assert args.listen == f"0.0.0.0:{DOCS[('Service', 'orion-controller')]['spec']['ports'][0]['targetPort']}"
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/v1/health"
    policy = DOCS[("NetworkPolicy", "orion-etcd-from-controllers-only")]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app": "orion-etcd"}}
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"app": "orion-controller"}}}],
                                  "ports": [{"protocol": "TCP", "port": port}]}]


def test_the_example_pod_needs_only_the_resource_limit_and_orion_gmem() -> None:
    spec = DOCS[("Pod", "cuda-on-orion")]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {RESOURCE_NAME: 1}
    assert _env(container) == {"ORION_GMEM": "4096"}
    assert "hostIPC" not in spec and "volumes" not in spec  # the plugin mounts its region


def test_oriond_and_the_controller_hold_the_cluster_key_and_the_plugin_does_not(server_conf: Path) -> None:
    """The cluster key (docs/security.md) reaches oriond and the controller as one file of the Secret, mounted by
    subPath (a Secret volume's own files are links, which a key file may not be), at the path both are told."""
    key = str(ServerConfig.load(str(server_conf), environ={}).cluster_key_file)
    assert _mounts(_pod("DaemonSet", "oriond"))[key] == "secret:orion-cluster-key"
    controller = _pod("Deployment", "orion-controller")
    command = controller["containers"][0]["command"]
    assert command[command.index("--key-file") + 1] == key and _mounts(controller)[key] == "secret:orion-cluster-key"
    mounts = [m for c in (controller, _pod("DaemonSet", "oriond")) for m in c["containers"][0]["volumeMounts"]
              if m["mountPath"] == key]
    assert all(m.get("subPath") == "cluster.key" and m.get("readOnly") for m in mounts) and len(mounts) == 2
    assert not any("secret" in v for v in _pod("DaemonSet", "orion-plugin")["volumes"])


def test_the_host_image_carries_oriond_s_compiled_modules(tmp_path: Path) -> None:
    """issue 31: the image has no compiler, so its oriond ran without the compiled hot path. Its build stage now
    builds the hot path and the relay pump into ORION_CACHE_DIR, which the runtime stage sets. Those steps run here:
    built into a scratch cache, then loaded by a process that has no compiler, as in the image."""
    import os
    import subprocess
    import sys

    text = (DEPLOY / "Dockerfile").read_text()
    build_stage, runtime_stage = text.split("\nFROM debian:12-slim\n")
    cache = "/opt/orion/native"
    modules = ("host_agent.session.hot_path", "host_agent.relay.compiled_pump")
    for module in modules:
        assert f"ORION_CACHE_DIR={cache} /opt/orion/bin/python -m {module}" in build_stage, module
    assert f"ORION_CACHE_DIR={cache}" in runtime_stage and "gcc" not in runtime_stage
    repo = DEPLOY.parents[1]
    env = {"PYTHONPATH": str(repo), "PATH": os.environ["PATH"], "ORION_CACHE_DIR": str(tmp_path / "native")}
    for module in modules:
        done = subprocess.run([sys.executable, "-m", module], env=env, cwd=repo, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    loads = ("from host_agent.session import hot_path; from host_agent.relay import compiled_pump; "
             "assert hot_path.load() is not None and compiled_pump.PROGRAM.load() is not None")
    done = subprocess.run([sys.executable, "-c", loads], env=env | {"PATH": "/nonexistent", "CC": "/nonexistent/cc"},
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
