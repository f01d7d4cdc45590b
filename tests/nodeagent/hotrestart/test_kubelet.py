from __future__ import annotations

import pytest

from flexlease.api import keys
from nodeagent.cri.client import (
    ANN_CONTAINER_HASH,
    ContainerInfo,
    ContainerState,
    ImageInfo,
    SandboxInfo,
    SandboxState,
)
from nodeagent.hotrestart.kubelet import (
    FAILURE_REASONS,
    Reference,
    alternate_reference,
    container_status,
    image_patch,
    kubelet_managed,
    normalized_repository,
    parse_reference,
    restart_policy,
    runs_image,
    spec_image,
    waiting_failure,
)

ID = "sha256:" + "1" * 64
DIGEST = "sha256:" + "a" * 64


def test_parse_reference() -> None:
    assert parse_reference("127.0.0.1:5000/t/x:v1") == Reference("127.0.0.1:5000/t/x", "v1")
    assert parse_reference("127.0.0.1:5000/t/x") == Reference("127.0.0.1:5000/t/x")
    assert parse_reference(f"x@{DIGEST}") == Reference("x", None, DIGEST)
    assert parse_reference(f"r:1/x:v1@{DIGEST}") == Reference("r:1/x", "v1", DIGEST)
    for ref in ("127.0.0.1:5000/t/x:v1", f"x@{DIGEST}", f"r:1/x:v1@{DIGEST}", "x"):
        assert str(parse_reference(ref)) == ref


def test_normalized_repository() -> None:
    assert normalized_repository("trainer") == "docker.io/library/trainer"
    assert normalized_repository("me/trainer") == "docker.io/me/trainer"
    assert normalized_repository("localhost/me/trainer") == "localhost/me/trainer"
    assert normalized_repository("reg:5000/trainer") == "reg:5000/trainer"


def test_alternate_reference() -> None:
    image = ImageInfo(ID, ("docker.io/library/trainer:v1",), (f"docker.io/library/trainer@{DIGEST}",), 1)
    assert alternate_reference("trainer:v1", image) == f"trainer@{DIGEST}"
    assert alternate_reference(f"trainer@{DIGEST}", image) == "trainer:v1"
    assert alternate_reference(f"trainer:v1@{DIGEST}", image) == "trainer:v1"
    assert alternate_reference("other:v1", image) is None
    assert alternate_reference("trainer:v1", ImageInfo(ID, ("trainer:v1",), (), 1)) is None


def test_runs_image_by_id_or_digest_never_by_tag() -> None:
    image = ImageInfo(ID, ("r/t:v1",), (f"r/t@{DIGEST}",), 1)

    def c(image_name: str, ref: str) -> ContainerInfo:
        return ContainerInfo("c", "s", "t", 0, image_name, ref, ContainerState.RUNNING)

    assert runs_image(c(ID, ID), image)  # kubelet's container, ListContainers
    assert runs_image(c("r/t:v1", f"r/t@{DIGEST}"), image)  # ContainerStatus
    assert not runs_image(c("r/t:v1", "sha256:" + "9" * 64), image)  # same tag, other image


def test_kubelet_managed() -> None:
    ours = SandboxInfo("s", "p", "ns", "u", 0, SandboxState.READY, 1, labels={keys.LABEL_NO_KUBELET: "true"})
    theirs = SandboxInfo("s", "p", "ns", "u", 0, SandboxState.READY, 1)
    plain = ContainerInfo("c", "s", "t", 0, "i", "i", ContainerState.RUNNING)
    hashed = ContainerInfo(
        "c", "s", "t", 0, "i", "i", ContainerState.RUNNING, annotations={ANN_CONTAINER_HASH: "1"}
    )
    assert not kubelet_managed(ours, [plain])
    assert kubelet_managed(ours, [plain, hashed])
    assert kubelet_managed(theirs, [plain])


def test_pod_spec_helpers() -> None:
    pod = {
        "metadata": {"resourceVersion": "7"},
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [{"name": "side", "image": "s:1"}, {"name": "trainer", "image": "t:1", "env": []}],
        },
    }
    assert restart_policy(pod) == "OnFailure" and restart_policy({"spec": {}}) == "Always"
    assert spec_image(pod, "trainer") == "t:1" and spec_image(pod, "nope") is None
    patch = image_patch(pod, "trainer", "t:2")
    assert patch == {
        "spec": {
            "containers": [{"name": "side", "image": "s:1"}, {"name": "trainer", "image": "t:2", "env": []}]
        }
    }
    assert pod["spec"]["containers"][1]["image"] == "t:1"  # untouched
    with pytest.raises(KeyError):
        image_patch(pod, "nope", "x")


def test_waiting_failure_is_a_new_failure_reason_only() -> None:
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "sidecar", "state": {"running": {}}},
                {
                    "name": "trainer",
                    "state": {"waiting": {"reason": "CreateContainerError", "message": "no cmd"}},
                },
            ]
        }
    }
    entry = container_status(pod, "trainer")
    assert (
        entry is not None and container_status(pod, "absent") is None and container_status(None, "x") is None
    )
    assert waiting_failure(entry, baseline=None) == "CreateContainerError: no cmd"
    assert waiting_failure(entry, baseline=entry) is None  # shown before the patch: not this restart's
    creating = {"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert waiting_failure(creating, baseline=None) is None  # on the way, not failed
    assert waiting_failure({"name": "trainer", "state": {"running": {}}}, baseline=None) is None
    assert waiting_failure(None, baseline=None) is None
    assert {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerConfigError",
    } <= FAILURE_REASONS
