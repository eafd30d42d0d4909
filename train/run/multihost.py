"""Several processes: joining them (jax.distributed) and waiting for each other, each failure one
line that says why.

A process waits for the others at a barrier of the distributed runtime's coordination service,
not a collective over devices: a collective's CPU context is made at its first use under a
fixed 30 s deadline, which processes whose shares of the work end minutes apart miss. The
barrier waits as long as the others' heartbeats say they live (`heartbeat_timeout_s`); a
process that stopped fails it for everyone within that time.
"""

from __future__ import annotations

import socket
import sys

from train.errors import RunError

JOIN_TIMEOUT_S = 300  # what jax.distributed.initialize waits for the coordinator and the others
# A barrier's own limit: none to speak of (24 days, the most its milliseconds hold); a process
# that stops fails it through its missing heartbeats long before.
BARRIER_TIMEOUT_MS = 2**31 - 1


def join(address: str | None, processes: int | None, process_id: int | None,
         heartbeat_timeout_s: int, flag: str = "--coordinator_address") -> None:
  """jax.distributed.initialize as process `process_id` of `processes`, the coordinator at
  `address` (host:port, process 0's; None: as the cluster says, SLURM's, say); RunError in one
  line (exit 2) where process 0 cannot listen there or the processes do not all join within
  JOIN_TIMEOUT_S, which it says first."""
  import jax
  if process_id == 0 and address is not None:
    _check_free(address, flag)
  print(f"process {process_id if process_id is not None else '?'}: joining the others at "
        f"{address or 'the address the cluster gives'} (waiting up to {JOIN_TIMEOUT_S} s for "
        f"all {processes or 'of them'})", file=sys.stderr, flush=True)
  try:
    jax.distributed.initialize(coordinator_address=address, num_processes=processes,
                               process_id=process_id, initialization_timeout=JOIN_TIMEOUT_S,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except Exception as e:  # noqa: BLE001 - jax's runtime errors: the others never came
    raise RunError(f"{flag} {address}: the {processes} processes did not all join within "
                   f"{JOIN_TIMEOUT_S} s ({_first_line(e)}); process 0 listens there, and "
                   f"every process must be started with the same address", 2) from None


def _check_free(address: str, flag: str) -> None:
  """RunError where process 0 cannot listen at `address`'s port (the coordinator listens on
  every interface): it is taken."""
  host, _, port = address.rpartition(":")
  if not port.isdigit() or not host:
    raise RunError(f"{flag} {address!r}: expected host:port", 2)
  try:
    with socket.socket(socket.AF_INET) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(("", int(port)))
  except OSError as e:
    raise RunError(f"{flag} {address}: process 0 cannot listen there ({e.strerror or e}); "
                   f"pick a free port (or stop what holds it)", 2) from None


def barrier(name: str) -> None:
  """Waits until every process has called barrier(`name`) (a name each calls once); a process
  that stopped (its heartbeats missing) fails it for the others, as jax.distributed's error."""
  from orbax.checkpoint import multihost
  multihost.get_barrier_sync_fn()(key=name, timeout_ms=BARRIER_TIMEOUT_MS)


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
