"""A real containerd for the node-agent tests (DESIGN §5), on top of hack/containerd-testbed.sh.

``containerd_testbed`` (session): starts containerd as root with its own root/state/socket and
CNI bridge, loads pause and trainer v1/v2 images built from busybox-static, runs a local
registry on 127.0.0.1 holding a larger image; tears it all down at the end. It never skips:
when the testbed cannot start, every test using it fails with the script's reason.

``cri`` (function): a connected :class:`GrpcCri` on that socket. ``pods`` (function): creates
sandboxes and containers the way flexlease runs them where no kubelet exists (marked
``flexlease.io/no-kubelet``) and removes whatever a test left behind. ``standin_kubelet``
(function): a factory of :class:`standins.kubelet_pods.StandInKubelet` on the testbed for a
store and node; their sandboxes are removed at teardown.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flexlease import errors
from flexlease.cri import api_pb2
from flexlease.store.base import Store
from nodeagent.cri import podspec
from nodeagent.cri.client import GrpcCri
from standins.kubelet_pods import StandInKubelet
from tests.natsserver import nats_server  # a real nats-server per test

__all__ = ["nats_server"]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "containerd-testbed.sh"


@dataclass(frozen=True)
class ContainerdTestbed:
    """A running testbed: the CRI endpoint, the images and the registry address."""

    dir: Path
    endpoint: str
    registry: str
    pause_image: str
    trainer_v1: str
    trainer_v2: str
    trainer_broken: str
    """Its entrypoint does not exist: every start fails (StartError, exit code 128)."""
    trainer_nocmd: str
    """No entrypoint and no command: CreateContainer fails ("no command specified")."""
    large_image: str
    registry_trainer: str
    cni_subnet: str
    cgroup_parent: str

    @property
    def log_root(self) -> Path:
        return self.dir / "pod-logs"

    def restart_containerd(self) -> None:
        """SIGKILL containerd and start it again on the same state (containers keep running)."""
        _script("restart-containerd", self.dir)

    def stop_containerd(self) -> None:
        """SIGKILL containerd (its shims and containers keep running)."""
        _script("stop-containerd", self.dir)

    def start_containerd(self) -> None:
        """Start containerd again on the same state after :meth:`stop_containerd`."""
        _script("start-containerd", self.dir)


def _script(cmd: str, directory: Path, *, timeout: float = 300) -> str:
    proc = subprocess.run(
        [str(SCRIPT), cmd, str(directory)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise RuntimeError(f"{SCRIPT.name} {cmd} {directory} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _sweep_stale() -> None:
    """Stop testbeds left by test sessions that died without tearing down."""
    for owner in Path("/tmp").glob("flexlease-testbed-*/owner.pid"):
        try:
            pid = int(owner.read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            _script("stop", owner.parent)
        except (ValueError, OSError):
            continue


@pytest.fixture(scope="session")
def containerd_testbed() -> Iterator[ContainerdTestbed]:
    if os.geteuid() != 0:
        pytest.fail("the containerd testbed needs root (containerd, CNI, mounts)", pytrace=False)
    _sweep_stale()
    directory = Path(tempfile.mkdtemp(prefix="flexlease-testbed-", dir="/tmp"))
    try:
        out = _script("start", directory)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        try:
            _script("stop", directory)
        finally:
            pytest.fail(f"containerd testbed did not start: {exc}", pytrace=False)
    (directory / "owner.pid").write_text(str(os.getpid()))
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    try:
        yield ContainerdTestbed(
            dir=directory,
            endpoint=env["FLEXLEASE_CRI_ENDPOINT"],
            registry=env["FLEXLEASE_TESTBED_REGISTRY"],
            pause_image=env["FLEXLEASE_TESTBED_PAUSE_IMAGE"],
            trainer_v1=env["FLEXLEASE_TESTBED_TRAINER_V1"],
            trainer_v2=env["FLEXLEASE_TESTBED_TRAINER_V2"],
            trainer_broken=env["FLEXLEASE_TESTBED_TRAINER_BROKEN"],
            trainer_nocmd=env["FLEXLEASE_TESTBED_TRAINER_NOCMD"],
            large_image=env["FLEXLEASE_TESTBED_LARGE_IMAGE"],
            registry_trainer=env["FLEXLEASE_TESTBED_REGISTRY_TRAINER"],
            cni_subnet=env["FLEXLEASE_TESTBED_CNI_SUBNET"],
            cgroup_parent=env["FLEXLEASE_TESTBED_CGROUP_PARENT"],
        )
    finally:
        _script("stop", directory)


@pytest.fixture
async def cri(containerd_testbed: ContainerdTestbed) -> AsyncIterator[GrpcCri]:
    async with GrpcCri(containerd_testbed.endpoint, timeout_seconds=10, pull_timeout_seconds=120) as client:
        yield client


@dataclass
class Pod:
    """A kubelet-like pod on the testbed: its identity, sandbox id/config and containers."""

    ref: podspec.PodRef
    sandbox_id: str
    sandbox_config: api_pb2.PodSandboxConfig
    containers: dict[str, str]


class Pods:
    """Creates pods on the testbed the way kubelet would; removes them at teardown."""

    def __init__(self, cri: GrpcCri, testbed: ContainerdTestbed) -> None:
        self.cri = cri
        self.testbed = testbed
        self.created: list[str] = []

    async def run(
        self,
        name: str,
        containers: dict[str, str],
        *,
        mounts: tuple[podspec.HostMount, ...] = (),
        namespace: str = "default",
        uid: str | None = None,
    ) -> Pod:
        """Run a sandbox and start one container per ``{name: image}``."""
        ref = podspec.PodRef(namespace=namespace, name=name, uid=uid or str(uuid.uuid4()))
        config = podspec.sandbox_config(ref, self.testbed.log_root, cgroup_parent=self.testbed.cgroup_parent)
        sandbox_id = await self.cri.run_pod_sandbox(config)
        self.created.append(sandbox_id)
        ids: dict[str, str] = {}
        for cname, image in containers.items():
            spec = podspec.ContainerSpec(name=cname, image=image, mounts=mounts, env={"POD_NAME": name})
            cid = await self.cri.create_container(sandbox_id, podspec.container_config(ref, spec), config)
            await self.cri.start_container(cid)
            ids[cname] = cid
        return Pod(ref=ref, sandbox_id=sandbox_id, sandbox_config=config, containers=ids)

    async def remove_all(self) -> None:
        for sandbox_id in self.created:
            try:
                await self.cri.stop_pod_sandbox(sandbox_id)
                await self.cri.remove_pod_sandbox(sandbox_id)
            except errors.CriNotFound:
                continue


@pytest.fixture
async def pods(cri: GrpcCri, containerd_testbed: ContainerdTestbed) -> AsyncIterator[Pods]:
    factory = Pods(cri, containerd_testbed)
    try:
        yield factory
    finally:
        await factory.remove_all()


KubeletFactory = Callable[..., StandInKubelet]


@pytest.fixture
async def standin_kubelet(
    cri: GrpcCri, containerd_testbed: ContainerdTestbed
) -> AsyncIterator[KubeletFactory]:
    made: list[StandInKubelet] = []

    def make(store: Store, node: str, **kw: object) -> StandInKubelet:
        kubelet = StandInKubelet(
            cri,
            store,
            node=node,
            log_root=containerd_testbed.log_root,
            cgroup_parent=containerd_testbed.cgroup_parent,
            **kw,  # type: ignore[arg-type]
        )
        made.append(kubelet)
        return kubelet

    try:
        yield make
    finally:
        for kubelet in made:
            await kubelet.remove_all()
