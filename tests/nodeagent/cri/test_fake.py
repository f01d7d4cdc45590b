"""FakeCri against containerd's behaviour: reference normalisation, lookups by id and digest,
image fields in ListContainers vs ContainerStatus, exit codes and the stop timeout. The last
test runs one scenario on the real containerd of the testbed and on the fake and compares."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from flexlease import errors
from nodeagent.cri import podspec
from nodeagent.cri.client import ContainerState, GrpcCri
from nodeagent.cri.fake import EXIT_SIGKILL, EXIT_SIGTERM, FakeCri, normalize_reference
from tests.nodeagent.conftest import ContainerdTestbed, Pods


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("library/busybox", "docker.io/library/busybox:latest"),
        ("docker.io/busybox", "docker.io/library/busybox:latest"),
        ("org/trainer:v1", "docker.io/org/trainer:v1"),
        ("localhost/flexlease/trainer:v1", "localhost/flexlease/trainer:v1"),
        ("127.0.0.1:5000/flexlease/big", "127.0.0.1:5000/flexlease/big:latest"),
        ("reg.example/x:v2", "reg.example/x:v2"),
        (f"busybox:1@sha256:{'a' * 64}", f"docker.io/library/busybox@sha256:{'a' * 64}"),
    ],
)
def test_references_are_normalised_as_containerd_does(ref: str, normalized: str) -> None:
    assert normalize_reference(ref) == normalized


@pytest.mark.parametrize("ref", ["", "Busybox", " busybox"])
def test_invalid_references_are_refused(ref: str) -> None:
    with pytest.raises(errors.CriError, match="invalid reference"):
        normalize_reference(ref)


async def test_an_image_is_found_by_any_name_id_and_digest() -> None:
    cri = FakeCri(registry={"busybox:1.36": 4_000})
    image_id = await cri.pull_image("docker.io/library/busybox:1.36")
    info = await cri.image_status("busybox:1.36")
    assert info is not None and info.id == image_id
    assert info.repo_tags == ("docker.io/library/busybox:1.36",)
    (digest,) = info.repo_digests
    assert digest.startswith("docker.io/library/busybox@sha256:") and digest != image_id
    for ref in (image_id, image_id.removeprefix("sha256:"), digest, "library/busybox:1.36"):
        found = await cri.image_status(ref)
        assert found is not None and found.id == image_id, ref
    assert await cri.image_status("busybox:latest") is None
    await cri.remove_image(digest)
    assert await cri.image_status("busybox:1.36") is None


async def test_list_and_status_report_the_image_differently() -> None:
    cri = FakeCri()
    image = cri.add_image("trainer:v1", 10)
    sandbox = await cri.run_pod_sandbox(podspec.sandbox_config(_ref(), Path("/tmp/logs")))
    spec = podspec.ContainerSpec(name="t", image=image.id)  # kubelet passes the resolved id
    cid = await cri.create_container(
        sandbox, podspec.container_config(_ref(), spec), cri.sandbox_configs[sandbox]
    )
    (listed,) = await cri.list_containers(sandbox_id=sandbox)
    assert (listed.image, listed.image_ref) == (image.id, image.id)
    status = await cri.container_status(cid)
    assert (status.image, status.image_ref) == ("docker.io/library/trainer:v1", image.repo_digests[0])
    missing = podspec.ContainerSpec(name="u", image="trainer:v2")
    with pytest.raises(errors.CriNotFound, match="not found"):
        await cri.create_container(
            sandbox, podspec.container_config(_ref(), missing), cri.sandbox_configs[sandbox]
        )


async def test_stop_exit_codes_and_the_timeout() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    cri = FakeCri(sleep=sleep)
    cri.add_image("trainer:v1", 10)
    sandbox = await cri.run_pod_sandbox(podspec.sandbox_config(_ref(), Path("/tmp/logs")))
    ids = {}
    for name in ("dies", "traps", "ignores", "killed"):
        spec = podspec.ContainerSpec(name=name, image="trainer:v1")
        ids[name] = await cri.create_container(
            sandbox, podspec.container_config(_ref(), spec), cri.sandbox_configs[sandbox]
        )
        await cri.start_container(ids[name])
    cri.sigterm_exit["traps"] = 0
    cri.ignores_sigterm.add("ignores")
    for name in ("dies", "traps", "ignores"):
        await cri.stop_container(ids[name], timeout_seconds=30)
    await cri.stop_container(ids["killed"], timeout_seconds=0)
    codes = {n: ((s := await cri.container_status(c)).exit_code, s.reason) for n, c in ids.items()}
    assert codes == {
        "dies": (EXIT_SIGTERM, "Error"),
        "traps": (0, "Completed"),
        "ignores": (EXIT_SIGKILL, "Error"),
        "killed": (EXIT_SIGKILL, "Error"),
    }
    assert slept == [30]  # only the container that ignored SIGTERM waited out its timeout
    assert [c.exit_code for c in await cri.list_containers()] == [0, 0, 0, 0]  # list carries none
    await cri.stop_container(ids["dies"], timeout_seconds=30)  # idempotent
    assert (await cri.container_status(ids["dies"])).exit_code == EXIT_SIGTERM


def _ref() -> podspec.PodRef:
    return podspec.PodRef(namespace="default", name="p", uid=str(uuid.uuid4()))


@pytest.mark.containerd
async def test_the_fake_answers_as_the_real_containerd(
    cri: GrpcCri, pods: Pods, containerd_testbed: ContainerdTestbed
) -> None:
    """One scenario on both: pull, look up by id and digest, run, compare list and status
    image fields, kill with timeout 0."""
    fake = FakeCri(registry={containerd_testbed.large_image: 1})
    fake.add_image(containerd_testbed.trainer_v1, 1)
    fake_pods = Pods(fake, containerd_testbed)  # type: ignore[arg-type]
    seen = []
    for runtime, factory in ((cri, pods), (fake, fake_pods)):
        image_id = await runtime.pull_image(containerd_testbed.large_image)
        info = await runtime.image_status(containerd_testbed.large_image)
        assert info is not None and info.id == image_id and info.repo_digests
        by_digest = await runtime.image_status(info.repo_digests[0])
        by_id = await runtime.image_status(image_id)
        assert by_digest is not None and by_id is not None and by_digest.id == by_id.id == image_id
        trainer = await runtime.image_status(containerd_testbed.trainer_v1)
        assert trainer is not None
        pod = await factory.run("parity", {"trainer": trainer.id})
        cid = pod.containers["trainer"]
        (listed,) = await runtime.list_containers(sandbox_id=pod.sandbox_id)
        status = await runtime.container_status(cid)
        await runtime.stop_container(cid, timeout_seconds=0)
        stopped = await runtime.container_status(cid)
        seen.append(
            (
                listed.image == trainer.id,
                listed.image_ref == trainer.id,
                status.image in trainer.repo_tags,
                status.image_ref in (*trainer.repo_digests, trainer.id),
                stopped.state is ContainerState.EXITED,
                stopped.exit_code,
            )
        )
    assert seen[0] == seen[1] == (True, True, True, True, True, EXIT_SIGKILL)
