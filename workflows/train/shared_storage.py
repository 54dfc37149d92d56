"""The start-up check that every trainer rank sees the same run storage (``out_dir``).

Every rank publishes its checkpoint files under the run's storage and rank 0 renames them into place
(workflows/tracking/checkpoint_files.py): on node-local disks rank 0 would find the other ranks' files missing,
checkpoint after checkpoint. So before anything is trained every rank writes a file holding a fresh nonce under
``<storage>/.probe/``, the ranks exchange their nonces and node addresses, and rank 0 reads every rank's file back:
a file it cannot find, or that holds another nonce (a stale file of an earlier attempt on a different disk), ends
the run at start in one line naming the rank and node whose storage rank 0 does not see.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.models.hf import SetupError

PROBE = ".probe"


def node_address() -> str:
    """This Ray worker's node address (the probe runs only with several ranks, which only Ray Train starts)."""
    import ray  # here, not at the top: the in-process mode never loads Ray

    return str(ray.util.get_node_ip_address())


def check_shared(
    storage: Path,
    rank: int,
    world: int,
    all_gather: Callable[[Any], list[Any]],
    barrier: Callable[[], None],
    node: str | None = None,
) -> None:
    """Write this rank's nonce under ``storage``, then read every rank's back (see the module docstring).

    ``all_gather`` returns every rank's object on every rank (``torch.distributed.all_gather_object``), ``barrier``
    waits for every rank. Every rank checks every file: either all ranks see one filesystem and all pass, or every
    rank misses some file and all raise (none is left waiting in a collective for one that failed). One rank has
    nothing to compare: no-op.

    Raises:
        SetupError: a rank whose nonce file this rank cannot read; the message names both nodes.
    """
    if world == 1:
        return
    node = node or node_address()
    nonce = secrets.token_hex(8)
    folder = storage / PROBE
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps({"nonce": nonce, "node": node}))
    everyone = all_gather((nonce, node))  # after every rank has written its file
    for r, (their_nonce, their_node) in enumerate(everyone):
        path = folder / f"rank{r}.json"
        try:
            seen = json.loads(path.read_text()).get("nonce")
        except (OSError, ValueError):
            seen = None
        if seen != their_nonce:
            raise SetupError(
                f"rank {r} on node {their_node} wrote {path}, and rank {rank} on node {node} cannot see it: "
                f"the run storage {storage} (under out_dir) is not one filesystem for every node; set out_dir= "
                f"a path every node mounts (a shared volume: infra/README.md)"
            )
    barrier()  # every rank has read them all: the folder can go
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
