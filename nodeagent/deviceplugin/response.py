"""What a container gets for its GPUs: the ``ContainerAllocateResponse`` of ``Allocate``. Pure.

* ``NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>`` (what the NVIDIA container runtime/toolkit reads;
  UUIDs, so the order is the pod's assignment order and CUDA device 0 is its first GPU);
* with ``device_specs``: the device nodes ``/dev/nvidia<minor>`` of those GPUs plus the
  control nodes ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` (``rw``);
* with ``cdi_prefix``: CDI device names ``<prefix>=<uuid>`` (``nvidia-ctk cdi generate
  --device-name-strategy=uuid`` names devices by UUID).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from nodeagent.deviceplugin import deviceplugin_pb2 as pb

ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
CONTROL_DEVICES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def container_response(
    uuids: Sequence[str],
    minors: Mapping[str, int | None],
    *,
    device_specs: bool = False,
    cdi_prefix: str = "",
) -> pb.ContainerAllocateResponse:
    """The response for a container given ``uuids`` (in the order the container should see
    them). ``minors``: UUID → ``/dev/nvidia<minor>`` number (a UUID without one gets no device
    node)."""
    response = pb.ContainerAllocateResponse(envs={ENV_VISIBLE_DEVICES: ",".join(uuids)})
    if device_specs:
        for uuid in uuids:
            minor = minors.get(uuid)
            if minor is not None:
                path = f"/dev/nvidia{minor}"
                response.devices.append(pb.DeviceSpec(container_path=path, host_path=path, permissions="rw"))
        for path in CONTROL_DEVICES:
            response.devices.append(pb.DeviceSpec(container_path=path, host_path=path, permissions="rw"))
    if cdi_prefix:
        response.cdi_devices.extend(pb.CDIDevice(name=f"{cdi_prefix}={uuid}") for uuid in uuids)
    return response
