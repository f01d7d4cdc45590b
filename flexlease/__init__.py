"""flexlease: right-of-return GPU leasing for Kubernetes (WeFlex, PVLDB 19(3) 2025).

Shared package imported by both deployables (``extender`` and ``nodeagent``):
API models and constants (:mod:`flexlease.api`), the store seam (:mod:`flexlease.store`),
configuration (:mod:`flexlease.config`), errors and logging.
"""

__version__ = "0.1.0"
