"""GPU health: the NVML backend seam (real and simulated), the health policy and the health watch."""
