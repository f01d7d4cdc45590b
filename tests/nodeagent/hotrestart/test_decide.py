from __future__ import annotations

from flexlease.api import keys
from flexlease.cri import api_pb2
from nodeagent.cri.client import (
    ANN_CONTAINER_HASH,
    ContainerInfo,
    ContainerState,
    ImageInfo,
    SandboxInfo,
    SandboxState,
)
from nodeagent.hotrestart.decide import (
    ANN_RESTART_COUNT,
    Adopt,
    Fail,
    PodFacts,
    Restart,
    RollBack,
    RuntimeView,
    Skip,
    decide,
    replacement_config,
)
from nodeagent.hotrestart.model import HotRestartRequest, HotRestartStatus, Phase, RollbackStatus, Strategy

REQ = HotRestartRequest(id="r1", container="trainer", image="t:v2")
# Run by flexlease itself (demo, tests): the direct strategy's case.
SANDBOX = SandboxInfo(
    "sb", "p", "ns", "uid", 0, SandboxState.READY, 1, ip="10.0.0.2", labels={keys.LABEL_NO_KUBELET: "true"}
)
# Run by kubelet: no flexlease mark; its containers carry kubelet's hash annotation.
KSANDBOX = SandboxInfo("sb", "p", "ns", "uid", 0, SandboxState.READY, 1, ip="10.0.0.2")
V1_ID, V2_ID = "sha256:" + "1" * 64, "sha256:" + "2" * 64
V1 = ImageInfo(V1_ID, ("reg:5000/t:v1",), ("reg:5000/t@sha256:" + "a" * 64,), 10)
V2 = ImageInfo(V2_ID, ("reg:5000/t:v2",), ("reg:5000/t@sha256:" + "b" * 64,), 10)


def c(cid: str, attempt: int, state: ContainerState, image: str = "t:v1", **kw: object) -> ContainerInfo:
    return ContainerInfo(cid, "sb", "trainer", attempt, image, "ref", state, **kw)  # type: ignore[arg-type]


def status(phase: Phase, *, request_id: str = "r1", previous_attempt: int | None = 0) -> HotRestartStatus:
    return HotRestartStatus(
        id=request_id,
        phase=phase,
        strategy=Strategy.DIRECT,
        container="trainer",
        image="t:v2",
        previous_container_id="c0",
        previous_attempt=previous_attempt,
    )


def run(view: RuntimeView, st: HotRestartStatus | None = None, req: HotRestartRequest = REQ) -> object:
    return decide(req, st, view, default_strategy=Strategy.DIRECT)


def test_fresh_request_restarts_the_running_container() -> None:
    old = c("c0", 0, ContainerState.RUNNING)
    d = run(RuntimeView(SANDBOX, (old,)))
    assert d == Restart("sb", old, 1, "t:v2", Strategy.DIRECT)


def test_next_attempt_follows_the_highest_one() -> None:
    dead = c("c0", 0, ContainerState.EXITED)
    live = c("c3", 3, ContainerState.RUNNING)
    d = run(RuntimeView(SANDBOX, (live, dead)))
    assert isinstance(d, Restart) and d.old == live and d.attempt == 4


def test_exited_container_is_restarted_too() -> None:
    dead = c("c0", 2, ContainerState.EXITED)
    d = run(RuntimeView(SANDBOX, (dead,)))
    assert isinstance(d, Restart) and d.old == dead and d.attempt == 3


def test_same_id_with_final_status_is_a_no_op() -> None:
    view = RuntimeView(SANDBOX, (c("c0", 0, ContainerState.RUNNING),))
    assert isinstance(run(view, status(Phase.SUCCEEDED)), Skip)
    assert isinstance(run(view, status(Phase.FAILED)), Skip)
    # A final status of another request does not block a new one.
    assert isinstance(run(view, status(Phase.SUCCEEDED, request_id="r0")), Restart)


def test_request_strategy_wins() -> None:
    req = HotRestartRequest(id="r1", container="trainer", image="t:v2", strategy=Strategy.KUBELET)
    d = decide(
        req,
        None,
        RuntimeView(KSANDBOX, (kc("c0", 0, ContainerState.RUNNING),)),
        default_strategy=Strategy.DIRECT,
        pod=PodFacts(spec_image="t:v1"),
    )
    assert isinstance(d, Restart) and d.strategy is Strategy.KUBELET


def kc(cid: str, attempt: int, state: ContainerState, image_id: str = V1_ID) -> ContainerInfo:
    """A container as kubelet creates it: image = image ID, hash annotation."""
    return ContainerInfo(
        cid, "sb", "trainer", attempt, image_id, image_id, state, annotations={ANN_CONTAINER_HASH: "abc"}
    )


def krun(
    view: RuntimeView,
    st: HotRestartStatus | None = None,
    *,
    image: str = "reg:5000/t:v2",
    policy: str = "Always",
    spec: str | None = "reg:5000/t:v1",
) -> object:
    req = HotRestartRequest(id="r1", container="trainer", image=image)
    return decide(req, st, view, default_strategy=None, pod=PodFacts(policy, spec))


def test_auto_strategy_follows_the_sandbox_owner() -> None:
    d = decide(REQ, None, RuntimeView(SANDBOX, (c("c0", 0, ContainerState.RUNNING),)), default_strategy=None)
    assert isinstance(d, Restart) and d.strategy is Strategy.DIRECT
    d = krun(RuntimeView(KSANDBOX, (kc("c0", 0, ContainerState.RUNNING),), V2))
    assert isinstance(d, Restart) and d.strategy is Strategy.KUBELET


def test_direct_is_refused_on_a_kubelet_sandbox() -> None:
    d = run(RuntimeView(KSANDBOX, (c("c0", 0, ContainerState.RUNNING),)))
    assert isinstance(d, Fail) and d.refused and "managed by kubelet" in d.message
    # The flexlease mark on the sandbox (a pod label kubelet copied) does not hide kubelet's containers.
    d = run(RuntimeView(SANDBOX, (kc("c0", 0, ContainerState.RUNNING),)))
    assert isinstance(d, Fail) and d.refused


def test_kubelet_is_refused_where_no_kubelet_runs() -> None:
    d = decide(
        HotRestartRequest(id="r1", container="trainer", image="t:v2", strategy=Strategy.KUBELET),
        None,
        RuntimeView(SANDBOX, (c("c0", 0, ContainerState.RUNNING),)),
        default_strategy=None,
    )
    assert isinstance(d, Fail) and d.refused and "no kubelet" in d.message


def test_kubelet_plan_writes_the_new_image() -> None:
    old = kc("c0", 0, ContainerState.RUNNING)
    d = krun(RuntimeView(KSANDBOX, (old,), V2))
    assert d == Restart("sb", old, 1, "reg:5000/t:v2", Strategy.KUBELET, None, "reg:5000/t:v2", False)
    # Not on the node yet: a new image too (it will be pulled first).
    d = krun(RuntimeView(KSANDBOX, (old,), None))
    assert isinstance(d, Restart) and d.spec_image == "reg:5000/t:v2"


def test_kubelet_same_image_switches_tag_and_digest() -> None:
    old = kc("c0", 0, ContainerState.RUNNING)
    d = krun(RuntimeView(KSANDBOX, (old,), V1), image="reg:5000/t:v1")
    assert isinstance(d, Restart) and d.same_image
    assert d.spec_image == "reg:5000/t@sha256:" + "a" * 64
    # ... and back again from the digest form.
    d = krun(RuntimeView(KSANDBOX, (old,), V1), image="reg:5000/t:v1", spec="reg:5000/t@sha256:" + "a" * 64)
    assert isinstance(d, Restart) and d.spec_image == "reg:5000/t:v1"
    # A loaded image has no repo digest: refused rather than left to crash-loop back-off.
    loaded = ImageInfo(V1_ID, ("reg:5000/t:v1",), (), 10)
    d = krun(RuntimeView(KSANDBOX, (old,), loaded), image="reg:5000/t:v1")
    assert isinstance(d, Fail) and d.refused and "back-off" in d.message


def test_jobs_get_only_image_changes() -> None:
    old = kc("c0", 0, ContainerState.RUNNING)
    for policy in ("OnFailure", "Never"):
        d = krun(RuntimeView(KSANDBOX, (old,), V1), image="reg:5000/t:v1", policy=policy)
        assert isinstance(d, Fail) and d.refused and f"restartPolicy {policy}" in d.message
        d = krun(RuntimeView(KSANDBOX, (old,), V2), policy=policy)
        assert isinstance(d, Restart) and d.spec_image == "reg:5000/t:v2"


def test_kubelet_container_missing_from_the_spec_is_refused() -> None:
    d = krun(RuntimeView(KSANDBOX, (kc("c0", 0, ContainerState.RUNNING),), V2), spec=None)
    assert isinstance(d, Fail) and d.refused


def kstatus(spec_image: str | None = "reg:5000/t:v2") -> HotRestartStatus:
    return HotRestartStatus(
        id="r1",
        phase=Phase.IN_PROGRESS,
        strategy=Strategy.KUBELET,
        container="trainer",
        image="reg:5000/t:v2",
        previous_container_id="c0",
        previous_attempt=0,
        spec_image=spec_image,
    )


def test_kubelet_resume_confirms_by_image_id() -> None:
    old = kc("c0", 0, ContainerState.EXITED)
    new = kc("c1", 1, ContainerState.RUNNING, image_id=V2_ID)
    st = kstatus()
    assert krun(RuntimeView(KSANDBOX, (old, new), V2), st) == Adopt(new, st)
    # kubelet stored the image ID, never the tag: a tag comparison would fail here.
    assert new.image != "reg:5000/t:v2"
    other = kc("c1", 1, ContainerState.RUNNING, image_id=V1_ID)
    d = krun(RuntimeView(KSANDBOX, (old, other), V2), st)
    assert isinstance(d, Fail) and "c1" in d.message and V1_ID in d.message and V2_ID in d.message


def test_kubelet_resume_with_a_failed_replacement_puts_the_previous_spec_image_back() -> None:
    old = kc("c0", 0, ContainerState.EXITED)
    dead = ContainerInfo(
        "c1", "sb", "trainer", 1, V2_ID, V2_ID, ContainerState.EXITED, exit_code=128, reason="StartError"
    )
    st = kstatus().model_copy(update={"previous_spec_image": "reg:5000/t:v1"})
    d = krun(RuntimeView(KSANDBOX, (old, dead), V2), st, spec="reg:5000/t:v2")
    assert isinstance(d, RollBack) and d.strategy is Strategy.KUBELET and d.image == "reg:5000/t:v1"
    assert d.reason == "replacement container c1 (attempt 1) exited (StartError, exit code 128)"
    # A status written by an agent that did not record the previous spec image: reported only.
    assert isinstance(krun(RuntimeView(KSANDBOX, (old, dead), V2), kstatus(), spec="reg:5000/t:v2"), Fail)


def test_kubelet_resume_reuses_the_recorded_spec_image() -> None:
    old = kc("c0", 0, ContainerState.RUNNING)
    digest = "reg:5000/t@sha256:" + "a" * 64
    d = krun(RuntimeView(KSANDBOX, (old,), V1), kstatus(digest), image="reg:5000/t:v1", spec=digest)
    assert isinstance(d, Restart) and d.spec_image == digest  # not switched back to the tag


def test_failures() -> None:
    assert run(RuntimeView(None, ())) == Fail("the pod has no ready sandbox on this node")
    notready = SandboxInfo("sb", "p", "ns", "uid", 0, SandboxState.NOTREADY, 1)
    assert isinstance(run(RuntimeView(notready, (c("c0", 0, ContainerState.RUNNING),))), Fail)
    assert run(RuntimeView(SANDBOX, ())) == Fail("container 'trainer' not found in sandbox sb")


def test_in_progress_with_running_replacement_is_adopted() -> None:
    new = c("c1", 1, ContainerState.RUNNING, image="t:v2")
    st = status(Phase.IN_PROGRESS)
    d = run(RuntimeView(SANDBOX, (c("c0", 0, ContainerState.EXITED), new)), st)
    assert d == Adopt(new, st)


def test_in_progress_with_created_replacement_resumes_it() -> None:
    old = c("c0", 0, ContainerState.EXITED)
    new = c("c1", 1, ContainerState.CREATED, image="t:v2")
    d = run(RuntimeView(SANDBOX, (old, new)), status(Phase.IN_PROGRESS))
    assert d == Restart("sb", old, 1, "t:v2", Strategy.DIRECT, replacement=new)


def test_in_progress_before_the_replacement_existed_starts_over() -> None:
    old = c("c0", 0, ContainerState.RUNNING)
    d = run(RuntimeView(SANDBOX, (old,)), status(Phase.IN_PROGRESS))
    assert d == Restart("sb", old, 1, "t:v2", Strategy.DIRECT)


def test_in_progress_with_dead_replacement_is_rolled_back_or_failed() -> None:
    """Found on resuming: the replacement died. Rolled back (the old container's config as the
    next attempt) by default; only reported when rollback is off or the old container is gone."""
    old = c("c0", 0, ContainerState.EXITED)
    dead = c("c1", 1, ContainerState.EXITED, image="t:v2", reason="StartError", exit_code=128, message="boom")
    reason = "replacement container c1 (attempt 1) exited (StartError, exit code 128): boom"
    view = RuntimeView(SANDBOX, (old, dead))
    assert run(view, status(Phase.IN_PROGRESS)) == RollBack("sb", Strategy.DIRECT, 0, "t:v1", reason, 2, old)
    off = decide(REQ, status(Phase.IN_PROGRESS), view, default_strategy=Strategy.DIRECT, rollback=False)
    assert off == Fail(reason)
    assert run(RuntimeView(SANDBOX, (dead,)), status(Phase.IN_PROGRESS)) == Fail(reason)  # c0 removed


def test_a_rollback_under_way_is_resumed_and_an_ended_one_skipped() -> None:
    old = c("c0", 0, ContainerState.EXITED)
    dead = c("c1", 1, ContainerState.EXITED, image="t:v2", reason="StartError", exit_code=128)
    under_way = status(Phase.FAILED).model_copy(
        update={"rollback": RollbackStatus(phase=Phase.IN_PROGRESS, image="t:v1")}
    )
    assert under_way.rolling_back
    view = RuntimeView(SANDBOX, (old, dead))
    assert run(view, under_way) == RollBack("sb", Strategy.DIRECT, 0, "t:v1", "", 2, old)
    ended = under_way.model_copy(update={"rollback": RollbackStatus(phase=Phase.SUCCEEDED, image="t:v1")})
    assert isinstance(run(view, ended), Skip)


def test_in_progress_with_wrong_replacement_fails() -> None:
    wrong = c("c1", 1, ContainerState.RUNNING, image="t:v9")
    d = run(RuntimeView(SANDBOX, (wrong,)), status(Phase.IN_PROGRESS))
    assert isinstance(d, Fail) and "t:v9" in d.message


def test_replacement_config_keeps_everything_but_image_and_attempt() -> None:
    old = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="trainer", attempt=0),
        image=api_pb2.ImageSpec(image="t:v1", user_specified_image="t:v1"),
        command=["python", "train.py"],
        envs=[api_pb2.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value="GPU-1,GPU-2")],
        mounts=[api_pb2.Mount(container_path="/data", host_path="/mnt/data")],
        devices=[api_pb2.Device(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")],
        labels={"io.kubernetes.container.name": "trainer"},
        annotations={ANN_RESTART_COUNT: "0"},
        log_path="trainer/0.log",
    )
    new = replacement_config(old, image="t:v2", attempt=1)
    assert new.image.image == "t:v2" and new.image.user_specified_image == ""
    assert new.metadata.attempt == 1 and new.log_path == "trainer/1.log"
    assert new.annotations[ANN_RESTART_COUNT] == "1"
    assert list(new.command) == ["python", "train.py"]
    assert new.envs == old.envs and new.mounts == old.mounts and new.devices == old.devices
    assert old.image.image == "t:v1" and old.metadata.attempt == 0  # the old config is untouched
    odd = replacement_config(api_pb2.ContainerConfig(log_path="custom.log"), image="x", attempt=2)
    assert odd.log_path == "custom.log.2"
