"""A real node for tests: containerd, a kubelet, kube-proxy and kube-scheduler beside the control
plane of harness/controlplane.py, so that pods run.

Everything the node starts lives in namespaces and a cgroup of its own:

- a network namespace holding the control plane, containerd, the kubelet, kube-proxy, the pod
  bridge `cbr0` and every pod's veth; kube-proxy's and CNI's iptables rules live there, not on
  this machine. This machine's own namespace gets one veth end, `cpnode-<id>`, through which the
  tests reach the API server; nothing is routed further.
- a mount namespace where the kubelet's and containerd's mounts (volumes, overlay root
  filesystems, pod network namespaces) are made, with empty tmpfs over /run, /var/lib and
  /var/log (shim sockets, CNI's cache, pod logs), and the kernel settings the kubelet would
  change at start (vm.overcommit_memory, kernel.panic...: global ones) given to it as files of
  its own. These mounts vanish with the namespace.
- a cgroup, `configpin-node-<pid>-<id>` in every hierarchy: every process of the node, the
  containerd shims and containers included, is in it. Teardown kills what is in it and removes
  it, which takes the namespaces with it. A run killed outright (SIGKILL, no teardown) leaves
  its cgroup behind, named after the dead pid; the next start cleans it (`clean_stale_nodes`).

Addresses: a free /24 of 10.234.0.0/16 per node: pods in .0/25 (the bridge, and the node's
InternalIP, is .1), Services in .128/26, the link to this machine .252/30 (this machine .253,
the node .254).

    KUBEBUILDER_ASSETS=... python -m harness.node   # a node to poke at, until Ctrl-C
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from harness.controlplane import (
    PROVISION_SCRIPT,
    ControlPlane,
    ControlPlaneError,
    KeyPair,
    NodeNetwork,
    Placement,
    _pid_alive,
    _Process,
    binary_version,
    find_assets,
    issue_client_cert,
    issue_serving_cert,
    kubeconfig_text,
    running_control_plane,
    wait_for,
)

NODE_NAME = "configpin-node"
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
HOST_TOOLS = ("containerd", "ctr", "runc", "iptables", "conntrack", "ip", "nsenter", "unshare")
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")

POOL = ipaddress.ip_network("10.234.0.0/16")
CGROUP_PREFIX = "configpin-node-"
LINK_PREFIX = "cpnode-"  # + 6 hex digits: an interface name has at most 15 characters
BRIDGE = "cbr0"  # inside the node's network namespace, so it never meets another
# What the kubelet sets at start (setupKernelTunables) and that no namespace covers: in the
# node's mount namespace these are files holding this machine's values, which it may rewrite.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)

READY_TIMEOUT = 120.0
LOCK_FILE = (
    Path(
        os.environ.get("CONFIGPIN_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "configpin"
    )
    / ".node.lock"
)


class NodeError(ControlPlaneError):
    """The node could not be provisioned or started."""


# --- binaries -------------------------------------------------------------------------------


def find_node_assets(assets: Path | None = None) -> Path:
    """The assets folder (find_assets) once it also holds the node's binaries and this machine
    has containerd, runc, the CNI plugins and the rest: provisioned (`--node`) when they lack."""
    assets = assets or find_assets()
    missing = [b for b in NODE_BINARIES if not os.access(assets / b, os.X_OK)]
    missing += [t for t in HOST_TOOLS if not _which(t)]
    missing += [p for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
    if missing:
        major, minor = binary_version(assets / "kube-apiserver")
        version = f"{major}.{minor}"
        known = {"1.20": "1.20.2", "1.36": "1.36.2"}
        if version not in known:
            raise NodeError(
                f"{assets} lacks {', '.join(missing)} and no provisioning knows {version}"
            )
        proc = subprocess.run(
            ["bash", str(PROVISION_SCRIPT), "--node", known[version]],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "CONFIGPIN_ASSETS_DIR": str(assets)},
        )
        if proc.returncode != 0:
            raise NodeError(
                f"{PROVISION_SCRIPT.name} --node failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
            )
    return assets


def _which(tool: str) -> str | None:
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"]:
        path = Path(d) / tool
        if d and os.access(path, os.X_OK):
            return str(path)
    return None


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# --- addresses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeAddresses:
    """A node's /24 of POOL (see the module's docstring)."""

    block: ipaddress.IPv4Network

    def _at(self, offset: int) -> str:
        return str(self.block.network_address + offset)

    @property
    def pod_cidr(self) -> str:
        return f"{self._at(0)}/25"

    @property
    def node_ip(self) -> str:
        """The bridge's address: the node's InternalIP, the `kubernetes` Service's endpoint."""
        return self._at(1)

    @property
    def service_cidr(self) -> str:
        return f"{self._at(128)}/26"

    @property
    def host_end(self) -> str:
        """This machine's end of the link to the node."""
        return self._at(253)

    @property
    def node_end(self) -> str:
        """The node's end of that link: where the tests reach the API server."""
        return self._at(254)


def _addresses_in_use() -> set[ipaddress.IPv4Network]:
    out = _run("ip", "-o", "-4", "addr", "show").stdout
    used = set()
    for match in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
        address = ipaddress.ip_address(match[1])
        if address in POOL:
            used.add(ipaddress.ip_network(f"{address}/24", strict=False))
    return used


def _pick_block() -> NodeAddresses:
    """A /24 of POOL that no link of this machine uses (call under the node lock)."""
    used = _addresses_in_use()
    free = [b for b in POOL.subnets(new_prefix=24) if b not in used]
    if not free:
        raise NodeError(f"every /24 of {POOL} is in use on this machine")
    return NodeAddresses(random.choice(free))


# --- cgroups --------------------------------------------------------------------------------


def _cgroup_mounts() -> list[tuple[str, Path, str]]:
    """(type, mount point, options) of this machine's cgroup hierarchies (v1 controllers, the
    hybrid layout's unified one, or a pure v2 machine's one)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        fstype, _source, options = rest.split(" ")[:3]
        if fstype in ("cgroup", "cgroup2"):
            kept = ",".join(o for o in options.split(",") if o not in ("rw", "ro"))
            mounts.append((fstype, Path(fields.split(" ")[4]), kept))
    return mounts


def _cgroup_roots() -> list[Path]:
    """The mount points of this machine's cgroup hierarchies."""
    roots = [mount_point for _, mount_point, _ in _cgroup_mounts()]
    if not roots:
        raise NodeError("no cgroup hierarchy is mounted")
    if any(r == Path("/sys/fs/cgroup") for r in roots):
        # A pure v2 machine: runc would put containers under a cgroup holding processes,
        # which v2 forbids once controllers are enabled. Not needed on the machines we run.
        raise NodeError("a cgroup v2-only machine is not supported by harness/node.py yet")
    return roots


@dataclass(frozen=True)
class _Cgroup:
    """One cgroup name made in every hierarchy."""

    name: str

    def paths(self) -> list[Path]:
        return [root / self.name for root in _cgroup_roots()]

    def create(self) -> None:
        for path in self.paths():
            path.mkdir(exist_ok=True)
            if (path / "cpuset.cpus").exists():  # v1 cpuset: empty until given the parent's
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((path.parent / knob).read_text())

    def procs_files(self) -> tuple[Path, ...]:
        return tuple(path / "cgroup.procs" for path in self.paths())

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths():
            for dirpath, _, _ in os.walk(path):
                with contextlib.suppress(OSError):
                    found.update(
                        int(p) for p in (Path(dirpath) / "cgroup.procs").read_text().split()
                    )
        return found

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL everything in it (shims and containers included) until it stays empty, and
        give their parents (init, for the orphans) a moment to reap them."""
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed |= pids
            if time.monotonic() > deadline:
                raise NodeError(f"processes {sorted(pids)} outlive SIGKILL in cgroup {self.name}")
            time.sleep(0.05)
        reap_by = time.monotonic() + 5
        while any(_pid_alive(pid) for pid in killed) and time.monotonic() < reap_by:
            time.sleep(0.05)

    def remove(self, timeout: float = 30.0) -> None:
        """rmdir it, innermost first (runc's container cgroups are inside)."""
        deadline = time.monotonic() + timeout
        for path in self.paths():
            for dirpath, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
                while True:
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)


def clean_stale_nodes() -> list[str]:
    """Remove what nodes of runs that died without teardown left: their cgroups are named
    after the dead test process; what is still in them (containerd shims, containers) is
    killed, which releases the namespaces, the pod bridge, the veths and the mounts; the link
    to this machine is deleted. Returns the names of the cgroups cleaned."""
    cleaned = []
    names = {p.name for root in _cgroup_roots() for p in root.glob(f"{CGROUP_PREFIX}*-*")}
    for name in sorted(names):
        owner, _, run_id = name.removeprefix(CGROUP_PREFIX).partition("-")
        if not owner.isdigit() or _pid_alive(int(owner)):
            continue
        cgroup = _Cgroup(name)
        cgroup.kill()
        cgroup.remove()
        _delete_link(LINK_PREFIX + run_id)
        cleaned.append(name)
    return cleaned


def _delete_link(name: str, timeout: float = 10.0) -> None:
    """Delete a veth end of this machine (its peer goes with it); wait until it is gone (a
    namespace being destroyed takes its veths with it a moment later)."""
    deadline = time.monotonic() + timeout
    while Path("/sys/class/net", name).exists():
        _run("ip", "link", "delete", name, check=False)
        if time.monotonic() > deadline:
            raise NodeError(f"link {name} is still there after {timeout:g}s")
        time.sleep(0.05)


@contextlib.contextmanager
def _node_lock() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- the node's namespaces ------------------------------------------------------------------

# Runs as the first process of the node's new network, mount and cgroup namespaces (unshare),
# already in the node's cgroup, and stays (sleep) to hold them while the rest is started into
# them with nsenter. The cgroup hierarchies are mounted again from inside the cgroup namespace,
# so that "/" is the node's cgroup: containerd puts containers at /k8s.io/<id>, which lands
# inside it, with the rest of the node.
_HOLDER_SCRIPT = r"""
set -eu
sysctls="$1" ready="$2"
shift 2
for hierarchy in "$@"; do  # type:mount point:options
  type=${hierarchy%%:*} rest=${hierarchy#*:}
  dir=${rest%%:*} options=${rest#*:}
  umount "$dir"
  mount -t "$type" ${options:+-o "$options"} configpin-node "$dir"
done
for dir in /run /var/lib /var/log; do
  mount -t tmpfs -o mode=0755 configpin-node "$dir"
done
for file in "$sysctls"/*; do
  mount --bind "$file" "/proc/sys/$(basename "$file" | tr . /)"
done
ip link set lo up
: > "$ready"
exec sleep infinity
"""


@dataclass(frozen=True)
class _Enclosure:
    """The node's namespaces, cgroup and link, and how to start a process inside them."""

    run_id: str
    cgroup: _Cgroup
    holder: _Process
    addresses: NodeAddresses

    @property
    def link(self) -> str:
        return LINK_PREFIX + self.run_id

    @property
    def placement(self) -> Placement:
        pid = self.holder.popen.pid
        return Placement(
            (
                "nsenter",
                f"--cgroup=/proc/{pid}/ns/cgroup",
                f"--net=/proc/{pid}/ns/net",
                f"--mount=/proc/{pid}/ns/mnt",
                "--",
            ),
            self.cgroup.procs_files(),
        )


def _in_network(holder: int, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A short command in the network namespace that process `holder` holds (this machine's
    mounts)."""
    return _run("nsenter", f"--net=/proc/{holder}/ns/net", "--", *argv, check=check)


@contextlib.contextmanager
def _enclosure(workdir: Path) -> Iterator[_Enclosure]:
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    sysctls = workdir / "sysctl"
    sysctls.mkdir(exist_ok=True)
    for name in KUBELET_SYSCTLS:
        (sysctls / name.replace("/", ".")).write_text(Path("/proc/sys", name).read_text())
    ready = workdir / "holder.ready"
    run_id = secrets.token_hex(3)
    cgroup = _Cgroup(f"{CGROUP_PREFIX}{os.getpid()}-{run_id}")
    holder: _Process | None = None
    try:
        with _node_lock():
            clean_stale_nodes()
            addresses = _pick_block()
            cgroup.create()
            holder = _Process.start(
                "holder",
                ["unshare", "--net", "--mount", "--cgroup", "--propagation", "private", "--",
                 "sh", "-c", _HOLDER_SCRIPT, "holder", str(sysctls), str(ready),
                 *(f"{t}:{m}:{o}" for t, m, o in _cgroup_mounts())],
                log_dir,
                workdir,
                Placement((), cgroup.procs_files()),
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while not ready.exists():
                holder.check_running()
                if time.monotonic() > deadline:
                    raise NodeError(f"the node's namespaces are not ready:\n{holder.log_tail()}")
                time.sleep(0.02)
            enclosure = _Enclosure(run_id, cgroup, holder, addresses)
            # The link and its address: made while holding the lock, so that no other node
            # picks this block.
            a = addresses
            _run("ip", "link", "add", enclosure.link, "type", "veth",
                 "peer", "name", "uplink", "netns", str(holder.popen.pid))  # fmt: skip
            _run("ip", "addr", "add", f"{a.host_end}/30", "dev", enclosure.link)
        _run("ip", "link", "set", enclosure.link, "up")
        script = f"""
            set -e
            ip addr add {a.node_end}/30 dev uplink
            ip link set uplink up
            ip link add {BRIDGE} type bridge
            ip addr add {a.node_ip}/25 dev {BRIDGE}
            ip link set {BRIDGE} up
            # ClusterIPs need a route before kube-proxy's DNAT picks the pod (the API server
            # calls a webhook's Service from here); there is no default route to take them.
            ip route add {a.service_cidr} dev {BRIDGE} src {a.node_ip}
            echo 1 > /proc/sys/net/ipv4/ip_forward
            # Pod -> Service -> pod on the same bridge: the reply must be un-NATed too.
            echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
        """
        _in_network(holder.popen.pid, "sh", "-c", script)
        yield enclosure
    finally:
        if holder is not None:
            holder.stop()
        cgroup.kill()
        cgroup.remove()
        _delete_link(LINK_PREFIX + run_id)


# --- containerd and CNI ---------------------------------------------------------------------


def _containerd_config(root: Path, socket: Path, pause_ref: str, cni_conf_dir: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[{cri}]
  sandbox_image = "{pause_ref}"
  # runc fails with only "can't get final child's PID from pipe: EOF" on these VMs otherwise
  restrict_oom_score_adj = true
  # pod network namespaces under the state directory, not /run/netns
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1
"""


def _cni_config(addresses: NodeAddresses, ipam_dir: Path) -> dict[str, Any]:
    net = ipaddress.ip_network(addresses.pod_cidr)
    return {
        "cniVersion": "0.4.0",
        "name": "configpin-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # nothing leaves the node: no masquerading
                "ipMasq": False,
                # a pod reaching itself through a Service
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": str(net),
                                "rangeStart": str(net.network_address + 10),
                                "rangeEnd": str(net.broadcast_address - 1),
                                "gateway": addresses.node_ip,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


# --- kubelet, kube-proxy, scheduler ---------------------------------------------------------


def _client_kubeconfig(plane: ControlPlane, pair: KeyPair) -> str:
    return kubeconfig_text(
        plane.host,
        plane.ca_pem,
        {
            "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
            "client-key-data": base64.b64encode(pair.key_pem).decode(),
        },
    )


def _write(path: Path, text: str | bytes, private: bool = False) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _kubelet_config(
    minor: int, addresses: NodeAddresses, pki: Path, dirs: dict[str, Path], socket: Path
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": addresses.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        # What was found to work on these VMs (shared/k8s/README.md): cgroup v1, no systemd,
        # swap, no QoS cgroups or allocatable enforcement.
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "volumePluginDir": str(dirs["volume-plugins"]),
        # No cluster DNS, and not this machine's resolvers either: nothing leaves the node.
        "resolvConf": str(dirs["resolv.conf"]),
        # Images are imported, never pulled: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A test machine's disk may be fuller than a production node's.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        # Ready as soon as it is (the first status after registering is often NotReady: no
        # sandbox ever run yet); a status is still posted only when it changed, or each minute.
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "1m",
        # room for a fan-out to 50 Deployments rolling at once, beside everything else
        "maxPods": 250,
        "shutdownGracePeriod": "0s",
    }
    if minor >= 27:
        config["containerRuntimeEndpoint"] = f"unix://{socket}"
    if minor >= 31:
        config["failCgroupV1"] = False
    return config


# --- the node -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A running node and its control plane."""

    name: str
    plane: ControlPlane
    addresses: NodeAddresses
    workdir: Path
    log_dir: Path
    containerd_socket: Path
    link: str
    cgroup: str
    holder_pid: int
    startup_seconds: float

    @property
    def minor(self) -> int:
        return self.plane.minor

    def host_run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a short command in the node's host network namespace (where the kubelet and the
        API server run: ClusterIPs reach pods there as they do for the API server)."""
        return _in_network(self.holder_pid, *argv, check=check)

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into containerd's k8s.io namespace, where the kubelet looks;
        pods use it with imagePullPolicy: Never."""
        _import_image(self.containerd_socket, archive)

    def images(self) -> list[str]:
        """The names of the images containerd holds for the kubelet."""
        return self.ctr("images", "ls", "-q").stdout.split()

    def ctr(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`ctr` on the node's containerd, in the kubelet's (k8s.io) namespace."""
        return _run(*_ctr(self.containerd_socket), *argv)


def _ctr(socket: Path) -> tuple[str, ...]:
    return ("ctr", "--address", str(socket), "-n", "k8s.io")


def _import_image(socket: Path, archive: Path) -> None:
    _run(*_ctr(socket), "images", "import", str(archive), timeout=600)


def _node_ready(api: client.ApiClient, name: str) -> bool:
    try:
        node = client.CoreV1Api(api).read_node(name)
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())
    not_ready_taint = any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or ())
    return ready and not not_ready_taint


@contextlib.contextmanager
def running_node(
    workdir: Path,
    assets: Path | None = None,
    *,
    images: Sequence[Path] = (),
    pause_image: str,
    name: str = NODE_NAME,
) -> Iterator[Node]:
    """A control plane and one node that runs pods, under `workdir`; everything stopped and
    removed on the way out (see the module's docstring), whatever happens.

    `images`: OCI archives imported before the node registers, the pause image among them;
    `pause_image`: its name (containerd's sandbox image).
    """
    started = time.monotonic()
    assets = find_node_assets(assets)
    workdir.mkdir(parents=True, exist_ok=True)
    minor = binary_version(assets / "kubelet")[1]
    with contextlib.ExitStack() as stack:
        enclosure = stack.enter_context(_enclosure(workdir))
        a = enclosure.addresses
        network = NodeNetwork(a.node_end, a.node_ip, a.service_cidr, enclosure.placement)
        plane = stack.enter_context(
            running_control_plane(workdir / "control-plane", assets, network=network)
        )
        log_dir = workdir / "logs"
        procs: list[_Process] = []

        def launch(proc_name: str, argv: Sequence[str]) -> _Process:
            proc = _Process.start(proc_name, argv, log_dir, workdir, enclosure.placement)
            stack.callback(proc.stop)
            procs.append(proc)
            return proc

        # containerd
        ctr_dir = workdir / "containerd"
        socket = ctr_dir / "containerd.sock"
        cni_conf = workdir / "cni" / "net.d"
        _write(cni_conf / "10-configpin-node.conflist",
               json.dumps(_cni_config(a, workdir / "cni" / "ipam"), indent=2))  # fmt: skip
        config = _write(
            ctr_dir / "config.toml", _containerd_config(ctr_dir, socket, pause_image, cni_conf)
        )
        containerd = launch("containerd", ["containerd", "--config", str(config)])

        def containerd_up() -> bool:
            containerd.check_running()
            return socket.exists() and _run(*_ctr(socket), "version", check=False).returncode == 0

        wait_for(containerd_up, timeout=60, what="containerd")
        for archive in images:
            _import_image(socket, archive)

        # credentials
        ca = plane.ca()
        pki = workdir / "pki"
        _write(pki / "ca.crt", plane.ca_pem)
        kubelet_serving = issue_serving_cert(ca, name, (a.node_ip,), (name,))
        _write(pki / "kubelet.crt", kubelet_serving.cert_pem)
        _write(pki / "kubelet.key", kubelet_serving.key_pem, private=True)
        kubeconfigs = {}
        for who, user, groups in (
            ("kubelet", f"system:node:{name}", ["system:nodes"]),
            ("kube-proxy", "system:kube-proxy", []),
            ("kube-scheduler", "system:kube-scheduler", []),
        ):
            pair = issue_client_cert(ca, user, groups)
            kubeconfigs[who] = _write(
                workdir / f"{who}.kubeconfig", _client_kubeconfig(plane, pair), private=True
            )

        # kubelet
        kubelet_dir = workdir / "kubelet"
        dirs = {
            "volume-plugins": kubelet_dir / "volume-plugins",
            # Not this machine's resolvers: a name lookup in a pod fails at once.
            "resolv.conf": _write(workdir / "resolv.conf", "nameserver 127.0.0.1\n"),
        }
        dirs["volume-plugins"].mkdir(parents=True, exist_ok=True)
        kubelet_config = _write(
            workdir / "kubelet.yaml",
            yaml.safe_dump(_kubelet_config(minor, a, pki, dirs, socket), sort_keys=False),
        )
        launch(
            "kubelet",
            [
                str(assets / "kubelet"),
                f"--config={kubelet_config}",
                f"--kubeconfig={kubeconfigs['kubelet']}",
                f"--root-dir={kubelet_dir}",
                f"--cert-dir={pki}",
                f"--hostname-override={name}",
                f"--node-ip={a.node_ip}",
                *(
                    [
                        "--container-runtime=remote",
                        f"--container-runtime-endpoint=unix://{socket}",
                    ]
                    if minor < 27
                    else []
                ),
            ],
        )
        launch(
            "kube-proxy",
            [
                str(assets / "kube-proxy"),
                f"--kubeconfig={kubeconfigs['kube-proxy']}",
                f"--hostname-override={name}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={a.pod_cidr}",
                f"--bind-address={a.node_ip}",
                "--healthz-bind-address=127.0.0.1:10256",
                "--metrics-bind-address=127.0.0.1:10249",
                # global (not per network namespace) kernel settings: left as they are
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
            ],
        )
        launch(
            "kube-scheduler",
            [
                str(assets / "kube-scheduler"),
                f"--kubeconfig={kubeconfigs['kube-scheduler']}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                *(["--port=0"] if minor < 24 else []),
            ],
        )
        with plane.api_client() as api:

            def ready() -> bool:
                for proc in procs:
                    proc.check_running()
                return _node_ready(api, name)

            try:
                wait_for(ready, timeout=READY_TIMEOUT, interval=0.2, what=f"node {name} Ready")
            except AssertionError as e:
                tails = "\n".join(f"--- {p.name}:\n{p.log_tail()}" for p in procs)
                raise NodeError(f"{e}\n{tails}") from None
        node = Node(
            name,
            plane,
            a,
            workdir,
            log_dir,
            socket,
            enclosure.link,
            enclosure.cgroup.name,
            enclosure.holder.popen.pid,
            time.monotonic() - started,
        )
        yield node
        for proc in procs:
            proc.check_running()


# --- what a node leaves on this machine -----------------------------------------------------


def _iptables_rules() -> list[str]:
    rules = []
    for save in ("iptables-save", "iptables-legacy-save", "ip6tables-save"):
        if _which(save):
            out = _run(save, check=False).stdout
            rules += [f"{save}: {line}" for line in out.splitlines() if not line.startswith("#")]
    # counters and table headers change on their own
    return [re.sub(r"\[\d+:\d+\]", "", r) for r in rules]


_NODE_MOUNT_PLACES = ("/run", "/var", "/sys/fs/cgroup", "/proc/sys", "/usr/libexec/kubernetes")


def machine_state(
    workdir: Path | None = None, exclude_runs: Iterable[str] = ()
) -> dict[str, list[str]]:
    """What a node could leave on this machine: links, network namespaces, mounts, iptables
    rules, processes (in a node's cgroup, or a node's program naming `workdir`), node cgroups,
    the kernel settings the kubelet changes. Items of other nodes running at the same time
    (their run ids in `exclude_runs`) are left out."""
    excluded = tuple(exclude_runs)

    def keep(item: str) -> bool:
        return not any(run in item for run in excluded)

    links = sorted(p.name for p in Path("/sys/class/net").iterdir())
    netns_dir = Path("/run/netns")
    netns = sorted(p.name for p in netns_dir.iterdir()) if netns_dir.is_dir() else []
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        point = fields.split(" ")[4]
        fstype, source = rest.split(" ")[:2]
        # where a node's mounts would land, not the mounts other work on this machine makes
        # and removes meanwhile (a chroot's /dev, say)
        if (
            (workdir is not None and point.startswith(str(workdir)))
            or point.startswith(_NODE_MOUNT_PLACES)
            or fstype in ("overlay", "nsfs")
            or source == "configpin-node"
        ):
            mounts.append(f"{point} {fstype} {source}")
    mounts.sort()
    cgroups = sorted(str(p) for root in _cgroup_roots() for p in root.glob(f"{CGROUP_PREFIX}*"))
    node_programs = {*NODE_BINARIES, "containerd", "containerd-shim-runc-v2", "runc", "pause",
                     "kube-apiserver", "kube-controller-manager", "etcd"}  # fmt: skip
    processes = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (proc / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue  # dead, waiting for its parent to read its exit status
            comm = (proc / "comm").read_text().strip()
            node_cgroup = re.search(rf"{CGROUP_PREFIX}[\w-]+", (proc / "cgroup").read_text())
            names_workdir = (
                workdir is not None
                and comm in node_programs
                and str(workdir).encode() in (proc / "cmdline").read_bytes()
            )
            if node_cgroup or names_workdir:
                where = node_cgroup[0] if node_cgroup else str(workdir)
                processes.append(f"{proc.name} {comm} ({where})")
    sysctls = [f"{n}={Path('/proc/sys', n).read_text().strip()}" for n in KUBELET_SYSCTLS]
    sysctls += [
        f"{n}={Path('/proc/sys', n).read_text().strip()}"
        for n in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables")
        if Path("/proc/sys", n).exists()
    ]
    state = {
        "links": links,
        "netns": netns,
        "mounts": mounts,
        "iptables": _iptables_rules(),
        "processes": processes,
        "cgroups": cgroups,
        "sysctls": sysctls,
    }
    return {k: [i for i in v if keep(i)] for k, v in state.items()}


def live_runs() -> list[str]:
    """Run ids of the nodes whose cgroups exist now (other test runs' among them)."""
    names = {p.name for root in _cgroup_roots() for p in root.glob(f"{CGROUP_PREFIX}*-*")}
    return sorted(n.rpartition("-")[2] for n in names)


def state_diff(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, list[str]]:
    """What `after` has that `before` had not, and what it lost ("-" prefixed), by kind."""
    diff = {}
    for kind in before.keys() | after.keys():
        b, a = set(before.get(kind, ())), set(after.get(kind, ()))
        changed = sorted(a - b) + [f"-{item}" for item in sorted(b - a)]
        if changed:
            diff[kind] = changed
    return diff


# --- python -m harness.node -----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Start a node (the control plane from $KUBEBUILDER_ASSETS, else 1.20.2), print where it
    is as one JSON line, and keep it until SIGINT or SIGTERM."""
    from harness import images

    parser = argparse.ArgumentParser(prog="python -m harness.node", description=main.__doc__)
    parser.add_argument("--workdir", type=Path, help="default: a new folder under /tmp")
    parser.add_argument(
        "--image", type=Path, action="append", default=[], help="another OCI archive to import"
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="configpin-node-"))
    archives = [images.ensure(images.PAUSE), images.ensure(images.SHELL), *args.image]
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with (
        running_node(workdir, images=archives, pause_image=images.PAUSE.ref) as node,
        contextlib.suppress(KeyboardInterrupt),
    ):
        where = {
            "kubeconfig": str(node.plane.kubeconfig),
            "workdir": str(workdir),
            "node_ip": node.addresses.node_ip,
            "link": node.link,
            "seconds": round(node.startup_seconds, 1),
        }
        print(json.dumps(where), flush=True)
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
