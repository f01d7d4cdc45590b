"""Frozen API models and constants: CRDs, annotation keys, tiers, pod reading, extender wire types.

Pure: no I/O. Import the modules (``from flexlease.api import wire, keys``) and call through
them (``wire.ExtenderFilterResult``).
"""
