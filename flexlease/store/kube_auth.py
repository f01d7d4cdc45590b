"""Where :class:`~flexlease.store.kube.KubeStore` finds its API server and credentials.

Order (``StoreSettings.kubeconfig`` docstring; the same order as client-go's
``clientcmd.BuildConfigFromFlags`` with an explicit path, else in-cluster, else
``$KUBECONFIG`` / ``~/.kube/config``):

1. ``kubeconfig`` given: that file (``$KUBECONFIG``-style ``:``-separated list allowed),
   its current context or ``context``.
2. In a pod (``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT`` set): the service
   account token and CA bundle under ``/var/run/secrets/kubernetes.io/serviceaccount``; the
   token file is re-read every minute, so projected (rotating) tokens keep working.
3. Otherwise ``$KUBECONFIG`` or ``~/.kube/config``.

The parsing itself is kubernetes_asyncio's (``config.load_kube_config`` /
``config.load_incluster_config``): bearer tokens, client certificates, exec plugins and
OIDC work as in kubectl. Anything unusable raises :class:`~flexlease.errors.StoreError`
naming the source, with the library's error chained.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import yaml
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration

from flexlease.errors import StoreError

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where kubelet mounts a pod's service account token and the cluster CA bundle."""

CONNECTION_POOL_SIZE: Final = 64
"""Concurrent connections to the API server: each running watch holds one for its lifetime."""

_LOAD_ERRORS = (kube_config.ConfigException, OSError, yaml.YAMLError, KeyError, TypeError, ValueError)


async def load_configuration(
    kubeconfig: Path | None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Configuration:
    """A kubernetes_asyncio ``Configuration`` (host, TLS, credentials) by the order above.

    ``environ`` defaults to ``os.environ``; ``service_account_dir`` holds ``token`` and
    ``ca.crt`` (tests point both elsewhere). Raises ``StoreError`` when no source applies or
    the chosen one is unreadable or malformed.
    """
    env = os.environ if environ is None else environ
    configuration = Configuration()
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        try:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration,
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
                environ=env,
            )
        except _LOAD_ERRORS as exc:
            raise StoreError(f"in-cluster Kubernetes config ({service_account_dir}): {exc}") from exc
        return configuration

    source = str(kubeconfig) if kubeconfig is not None else env.get("KUBECONFIG") or "~/.kube/config"
    paths = await asyncio.to_thread(_existing_files, source)
    if not paths:
        where = "StoreSettings.kubeconfig" if kubeconfig is not None else "$KUBECONFIG or ~/.kube/config"
        raise StoreError(
            f"no Kubernetes config: not in a pod (KUBERNETES_SERVICE_HOST unset) and {where} "
            f"({source}) names no readable file"
        )
    try:
        await kube_config.load_kube_config(
            config_file=os.pathsep.join(paths),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (*_LOAD_ERRORS, AssertionError) as exc:  # the loader asserts a context and cluster exist
        raise StoreError(f"kubeconfig {source}: {exc!r}") from exc
    return configuration


def _existing_files(source: str) -> list[str]:
    """The readable files among ``source``'s ``:``-separated paths (``~`` expanded)."""
    return [
        str(p) for p in (Path(part).expanduser() for part in source.split(os.pathsep) if part) if p.is_file()
    ]
