"""The pure half of the ``kubelet`` hot-restart strategy: whose sandbox is it, which image does
a container really run, and what to write into the pod spec so that kubelet restarts the
container at once. No I/O.

**Whose sandbox.** kubelet puts ``io.kubernetes.pod.{name,namespace,uid}`` on every sandbox and
container, and on every container it creates the annotations ``io.kubernetes.container.hash``
(the container spec's hash) and ``io.kubernetes.container.restartCount``
(``pkg/kubelet/kuberuntime/labels.go``). flexlease runs sandboxes itself only where no kubelet
exists (the local demo, the tests, the benches) and marks those with
``flexlease.io/no-kubelet=true`` (:func:`nodeagent.cri.podspec.sandbox_config`). A sandbox is
kubelet's unless it carries that mark *and* none of its containers carries kubelet's hash
annotation: a label copied from a pod's own labels cannot make a kubelet pod look
flexlease's, because kubelet's containers still carry the hash.

**Which image.** kubelet creates containers with the image ID (``sha256:…``) it resolved, not
the tag in the spec, and containerd reports ``image_ref`` as the image ID (ListContainers) or
a repo digest (ContainerStatus). A container runs the requested image when its ``image`` or
``image_ref`` is that image's ID or one of its repo digests (from CRI ``ImageStatus``); tags
are never compared.

**Did it fail.** kubelet reports why it does not run a container in the pod's
``status.containerStatuses[].state.waiting.reason`` (:data:`FAILURE_REASONS`:
``pkg/kubelet/container/sync_result.go``, ``pkg/kubelet/images/types.go``). After the spec
patch such a reason is this restart's failure once the old container has stopped and the
status differs from the one seen at the patch (:func:`waiting_failure`); a replacement that
exited (containerd's ``StartError``, exit code 128, or a crash) is seen in CRI directly.

**What to write.** kubelet restarts a container whose spec hash changed at once, with the pod's
grace period and whatever the ``restartPolicy`` ("Container … definition changed, will be
restarted"); restarting an unchanged spec falls into crash-loop back-off (10 s doubling to
5 min, keyed by the spec hash). A new image changes the hash by itself. The same image is
written in its other form — ``repo:tag`` ↔ ``repo@sha256:…`` — which changes the hash but
not the image (:func:`alternate_reference`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from flexlease.api import keys
from nodeagent.cri.client import ANN_CONTAINER_HASH, ContainerInfo, ImageInfo, SandboxInfo

FAILURE_REASONS: Final = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreStartHookError",
        "PostStartHookError",
    }
)
"""Waiting reasons with which kubelet says a container cannot run (as opposed to
``ContainerCreating`` / ``PodInitializing``, which are on the way)."""

RESTART_ALWAYS = "Always"
RESTART_ON_FAILURE = "OnFailure"
RESTART_NEVER = "Never"


def kubelet_managed(sandbox: SandboxInfo, containers: Iterable[ContainerInfo]) -> bool:
    """Whether a kubelet owns ``sandbox`` (see the module docstring): True unless the sandbox
    carries ``flexlease.io/no-kubelet=true`` and no container carries kubelet's
    ``io.kubernetes.container.hash`` annotation."""
    if any(ANN_CONTAINER_HASH in c.annotations for c in containers):
        return True
    return sandbox.labels.get(keys.LABEL_NO_KUBELET) != "true"


def image_identities(image: ImageInfo) -> frozenset[str]:
    """The names that pin ``image`` exactly: its ID and its repo digests."""
    return frozenset({image.id, *image.repo_digests}) - {""}


def runs_image(container: ContainerInfo, image: ImageInfo) -> bool:
    """Whether ``container`` runs ``image``, judged by image ID and repo digests only."""
    ids = image_identities(image)
    return container.image in ids or container.image_ref in ids


@dataclass(frozen=True, slots=True)
class Reference:
    """An image reference split as the distribution grammar does: ``repository``
    (as written), optional ``tag`` and ``digest`` (``sha256:…``)."""

    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"


def parse_reference(ref: str) -> Reference:
    """Split ``[host[:port]/]path[:tag][@digest]``."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return Reference(name[:colon], name[colon + 1 :] or None, digest or None)
    return Reference(name, None, digest or None)


def normalized_repository(repository: str) -> str:
    """The repository with Docker's defaults applied (``trainer`` →
    ``docker.io/library/trainer``), for comparing two spellings of one repository."""
    first, sep, _ = repository.partition("/")
    if not sep:
        return f"docker.io/library/{repository}"
    if "." in first or ":" in first or first == "localhost":
        return repository
    return f"docker.io/{repository}"


def alternate_reference(spec_image: str, image: ImageInfo) -> str | None:
    """The other spelling of ``spec_image`` naming the same ``image`` (its ``ImageStatus``):
    ``repo:tag`` → ``repo@sha256:…`` (a repo digest of the same repository) and
    ``repo@sha256:…`` or ``repo:tag@sha256:…`` → ``repo:tag`` (the tag written, else a repo
    tag of the same repository). None when the node knows no such form (an image loaded
    rather than pulled has no repo digest)."""
    ref = parse_reference(spec_image)
    repo = normalized_repository(ref.repository)
    if ref.digest is None:
        for digest_ref in image.repo_digests:
            other = parse_reference(digest_ref)
            if other.digest and normalized_repository(other.repository) == repo:
                return str(Reference(ref.repository, None, other.digest))
        return None
    if ref.tag:
        return str(Reference(ref.repository, ref.tag))
    for tag_ref in image.repo_tags:
        other = parse_reference(tag_ref)
        if other.tag and normalized_repository(other.repository) == repo:
            return str(Reference(ref.repository, other.tag))
    return None


def restart_policy(pod: dict[str, Any]) -> str:
    """``spec.restartPolicy`` (default ``Always``, as the API server defaults it)."""
    return str((pod.get("spec") or {}).get("restartPolicy") or RESTART_ALWAYS)


def spec_image(pod: dict[str, Any], container: str) -> str | None:
    """The image the pod spec names for ``container`` (None when no such container)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(c, dict) and c.get("name") == container:
            image = c.get("image")
            return image if isinstance(image, str) else None
    return None


def image_patch(pod: dict[str, Any], container: str, image: str) -> dict[str, Any]:
    """A JSON merge patch setting ``container``'s image to ``image``: the whole
    ``spec.containers`` list (merge patches replace lists) with only that image changed.
    Apply it with the pod's ``resourceVersion`` as precondition. Raises ``KeyError`` when the
    spec has no such container."""
    containers = copy.deepcopy((pod.get("spec") or {}).get("containers") or [])
    for c in containers:
        if isinstance(c, dict) and c.get("name") == container:
            c["image"] = image
            return {"spec": {"containers": containers}}
    raise KeyError(container)


def container_status(pod: Mapping[str, Any] | None, container: str) -> Mapping[str, Any] | None:
    """The pod's ``status.containerStatuses`` entry of ``container`` (None when absent)."""
    for entry in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if isinstance(entry, Mapping) and entry.get("name") == container:
            return entry
    return None


def waiting_failure(status: Mapping[str, Any] | None, *, baseline: Mapping[str, Any] | None) -> str | None:
    """``"<reason>: <message>"`` when ``status`` (a ``containerStatuses`` entry) is Waiting with
    one of :data:`FAILURE_REASONS` and differs from ``baseline`` (the entry when the spec was
    patched: a failure shown then is not this restart's); None otherwise."""
    if status is None or status == baseline:
        return None
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason not in FAILURE_REASONS:
        return None
    message = str(waiting.get("message") or "")
    return f"{reason}: {message}" if message else reason
