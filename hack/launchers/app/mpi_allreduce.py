"""The MPI job's ranks (mpi4py): an allreduce across every rank; exits non-zero when the sum is
wrong. Each rank prints its rank, the world size and its pod."""

import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
expected = comm.size * (comm.size + 1) // 2
print(f"rank {comm.rank}/{comm.size} pod={os.environ.get('POD_NAME', '?')} allreduce={total}", flush=True)
sys.exit(0 if total == expected else 1)
