"""A writer process for tests/store/test_sqlite.py: ``python -m tests.store.sqlite_writer
<path> <prefix> <count>`` creates pods ``<prefix>-<i>`` in SqliteStore ``<path>``, labels
each one (a patch), and deletes every third; prints the last resourceVersion it wrote."""

from __future__ import annotations

import asyncio
import sys

from flexlease.store.base import Kind
from flexlease.store.sqlite import SqliteStore
from tests.store.contract import NS, make_pod


async def write(path: str, prefix: str, count: int) -> str:
    store = SqliteStore(path)
    last = ""
    try:
        for i in range(count):
            name = f"{prefix}-{i}"
            await store.create(Kind.POD, make_pod(name))
            patched = await store.patch(Kind.POD, name, {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
            last = patched["metadata"]["resourceVersion"]
            if i % 3 == 0:
                await store.delete(Kind.POD, name, namespace=NS)
    finally:
        await store.close()
    return last


if __name__ == "__main__":
    print(asyncio.run(write(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
