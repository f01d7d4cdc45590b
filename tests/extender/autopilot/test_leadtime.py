"""The lead time of a Reclaim: W of formulas 1–3 from what the agents publish, plus the grace
period and the resync period; the slowest node of those holding the job's lent GPUs counts."""

from __future__ import annotations

import pytest

from extender.autopilot.leadtime import JobArtifacts, auto, fixed
from flexlease.api.resources import GPUNode
from flexlease.prelaunch import PrelaunchInputs, prelaunch_window

GB = 1e9
IMAGE = "registry.local/ranker:v7"


def gpunode(
    name: str,
    *,
    registry_bps: float = 1 * GB,
    storage_bps: float = 2 * GB,
    images: dict[str, int] | None = None,
    checkpoints: dict[str, int] | None = None,
) -> GPUNode:
    return GPUNode.model_validate(
        {
            "metadata": {"name": name},
            "status": {
                "prelaunch": {
                    "netBytesPerSecond": 1.25 * GB,
                    "registryBytesPerSecond": registry_bps,
                    "storageBytesPerSecond": storage_bps,
                    "gpuBytesPerSecond": 25 * GB,
                    "gpuAdjustSeconds": 5,
                    "measured": ["registry"],
                    "imageBytes": images or {},
                },
                "cache": {
                    "checkpoints": [
                        {"id": c, "sizeBytes": s, "sha256": "0" * 64} for c, s in (checkpoints or {}).items()
                    ]
                },
            },
        }
    )


JOB = JobArtifacts(image=IMAGE, checkpoint="ranker/step-900")


def test_w_of_the_slowest_lent_node_plus_grace_and_resync() -> None:
    nodes = {
        "gpu-0": gpunode("gpu-0", images={IMAGE: int(8 * GB)}, checkpoints={"ranker/step-900": int(20 * GB)}),
        "gpu-1": gpunode("gpu-1", registry_bps=0.5 * GB),  # slow registry, nothing cached
        "gpu-2": gpunode(
            "gpu-2", registry_bps=0.1 * GB
        ),  # slower still, but nothing of the job is lent there
    }
    lead = auto(nodes, JOB, lent_on=["gpu-0", "gpu-1"], grace_seconds=45, resync_seconds=30)
    expected_w = prelaunch_window(
        PrelaunchInputs(
            image_bytes=8 * GB,  # S_img from gpu-0, which has the image
            checkpoint_bytes=20 * GB,  # S_ckpt from gpu-0's checkpoint cache
            net_bps=1.25 * GB,
            registry_bps=0.5 * GB,
            storage_bps=2 * GB,
            gpu_bps=25 * GB,
            gpu_adjust_seconds=5,
        )
    ).window_seconds
    assert lead.node == "gpu-1"
    assert lead.window_seconds == pytest.approx(expected_w)
    assert expected_w == pytest.approx(
        5 + max(8 / 0.5, 20 / 1.25 + 20 / 25)
    )  # 21.8 s: the checkpoint (16.8 s) outlasts the pull (16 s)
    assert lead.seconds == pytest.approx(expected_w + 45 + 30)
    assert "W=21.8s on gpu-1" in lead.source


def test_a_node_with_the_image_and_checkpoint_has_only_the_gpu_terms() -> None:
    nodes = {
        "gpu-0": gpunode("gpu-0", images={IMAGE: int(8 * GB)}, checkpoints={"ranker/step-900": int(20 * GB)})
    }
    lead = auto(nodes, JOB, lent_on=["gpu-0"], grace_seconds=45, resync_seconds=0)
    assert lead.window_seconds == pytest.approx(5 + 20 / 25)  # T_gpu_adj + S_ckpt / B_gpu


def test_without_lent_gpus_every_publishing_node_counts_and_unknown_sizes_are_said() -> None:
    nodes = {"gpu-0": gpunode("gpu-0"), "gpu-1": gpunode("gpu-1", registry_bps=0.1 * GB)}
    lead = auto(nodes, JOB, lent_on=[], grace_seconds=30, resync_seconds=10)
    assert lead.window_seconds == 5  # sizes unknown: counted 0
    assert "image size unknown" in lead.source and "checkpoint size unknown" in lead.source
    assert lead.seconds == 45


def test_no_publishing_node_counts_w_zero_and_says_so() -> None:
    bare = GPUNode.model_validate({"metadata": {"name": "gpu-0"}})
    lead = auto({"gpu-0": bare}, JOB, lent_on=["gpu-0"], grace_seconds=45, resync_seconds=15)
    assert lead.seconds == 60 and lead.node is None and "W counted 0" in lead.source


def test_fixed_is_the_operator_s_number() -> None:
    assert fixed(900).seconds == 900
