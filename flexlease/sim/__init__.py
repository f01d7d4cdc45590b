"""Trace-driven cluster simulator (WeFlex §4): plays kube-scheduler against the real extender."""
