"""Node agent (DaemonSet): NVML health and availability, device plugin, CRI, caches, hot restart."""
