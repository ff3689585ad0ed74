"""Script calls that a Redis Cluster replica must have before the caller acts on them.

Replication is asynchronous: a master killed right after a paced start leaves
its replica, once promoted, without the domain's last start, and the gate would
let the next request go too early. A paced start therefore waits for one
replica (when the slot has any) before the worker makes the request: the
domain's delay holds across a failover. A master that dies meanwhile fails the
start, and the message is tried again on the promoted replica, which never
heard of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

logger = logging.getLogger(__name__)

#: Longest a paced start waits for a replica to have it (ms).
REPLICA_WAIT_MS = 1000


def call_replicated(client: Any, script: Script, keys: Sequence[str],
                    args: Sequence[Any]) -> Any:
    """Run ``script`` on the master of ``keys``' slot, then ``WAIT 1`` on the same
    connection (WAIT counts that connection's writes only): one round trip. The
    script's raw reply; a slot without a replica runs it alone."""
    if len(client.nodes_manager.slots_cache.get(client.keyslot(keys[0]), ())) < 2:
        return script(keys=list(keys), args=list(args))
    node = client.get_node_from_key(keys[0])
    # EVALSHA; a node that does not know the script yet (fresh, or a promoted
    # replica) answers NOSCRIPT without running it: then EVAL, which loads it.
    for command, body in (("EVALSHA", script.sha), ("EVAL", script.script)):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, body, len(keys), *keys, *args, target_nodes=node)
        pipe.execute_command("WAIT", 1, REPLICA_WAIT_MS, target_nodes=node)
        reply, acked = pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError):
            continue
        for answer in (reply, acked):
            if isinstance(answer, Exception):
                raise answer
        if not acked:
            logger.warning("zsched: no replica confirmed a paced start within %d ms",
                           REPLICA_WAIT_MS)
        return reply
    raise NoScriptError("EVAL answered NOSCRIPT")
