"""What pulse installs inside hivemind's DHT process: bounded storage and a pipe reader that waits.

    dht = MortalDHT(start=False, ...)  # hivemind's DHT process, tied to the node (and p2pd to it)
    await install(dht, node, rules)    # run once in the DHT process, by `PulseDHT.start`

- `MortalDHT` is hivemind's DHT whose process ends when the node that started it ends, however it
  ends, and whose libp2p daemon ends with it (`lifetime.py`).

- `BoundedStorage` replaces the node's storage and cache: before a new (key, owner) record is kept,
  the peer's `StoreBudget` (`records.py`) decides; what it evicts is dropped from the storage.
  hivemind itself caps neither the subkeys of a key nor the records a peer keeps in all.
- `WaitingPipe` wraps the pipe the main process sends requests on. hivemind reads it from its
  event loop on a non-blocking descriptor, and `multiprocessing` writes a request over 16 KiB in
  two parts (header, then body): when the body is not there yet the read fails half way, the pipe
  is out of step, and the next read kills the DHT process. Reading a request whole, in blocking
  mode once `poll()` said it has started, removes that for requests of any size.
- `LockedPipe` wraps the main process's end of that pipe (`PulseDHT.start` installs it): hivemind
  sends from whichever thread calls the DHT, and two large requests sent at once interleave.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import hivemind
import msgpack
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils.timed_storage import DHTExpiration

from node.net.lifetime import children_die_with_me, watch_parent
from node.net.records import RecordRules, StoreBudget
from protocol.signing import MAX_ENVELOPE_BYTES

logger = logging.getLogger(__name__)


class MortalDHT(hivemind.DHT):
    """hivemind's DHT process, which kill -9 of its node no longer orphans (nor its p2pd)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._creator = os.getpid()  # read in the child, after the fork

    def run(self) -> None:
        watch_parent(self._creator)
        with children_die_with_me():
            super().run()


class BoundedStorage(DHTLocalStorage):
    """A DHT peer's storage (or cache) whose open records stay within a `StoreBudget`."""

    def __init__(self, budget: StoreBudget, maxsize: int | None = None) -> None:
        super().__init__(maxsize=maxsize)
        self.budget = budget

    def store_subkey(self, key: DHTID, subkey: Any, value: bytes, expiration_time: DHTExpiration) -> bool:
        owner = subkey if isinstance(subkey, bytes) else b""
        current = self.get(key)
        if current is not None and isinstance(current.value, DictionaryDHTValue) and subkey in current.value:
            return super().store_subkey(key, subkey, value, expiration_time)  # the newer one of one owner wins
        admission = self.budget.admit(key.to_bytes(), owner, _envelope(value), expiration_time)
        if not admission.stored:
            logger.debug("not storing a record: %s", admission.reason)
            return False
        for evicted_key, evicted_owner in admission.evict:
            self._drop(DHTID.from_bytes(evicted_key), evicted_owner)
        if not super().store_subkey(key, subkey, value, expiration_time):
            self.budget.forget(key.to_bytes(), owner)
            return False
        return True

    def _drop(self, key: DHTID, owner: bytes) -> None:
        item = self.get(key)
        if item is not None and isinstance(item.value, DictionaryDHTValue):
            del item.value[owner]


def _envelope(value: bytes) -> bytes:
    try:
        inner = msgpack.unpackb(value, raw=True, max_bin_len=MAX_ENVELOPE_BYTES, max_str_len=0)
    except (ValueError, msgpack.UnpackException):
        return b""
    return inner if isinstance(inner, bytes) else b""


class WaitingPipe:
    """A `multiprocessing` connection whose `recv` reads one whole message in blocking mode."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def fileno(self) -> int:
        return int(self.connection.fileno())

    def poll(self, timeout: float = 0.0) -> bool:
        return bool(self.connection.poll(timeout))

    def close(self) -> None:
        self.connection.close()

    def recv(self) -> Any:
        fd = self.fileno()
        was_blocking = os.get_blocking(fd)
        os.set_blocking(fd, True)  # the rest of a message already begun follows at once
        try:
            return self.connection.recv()
        finally:
            os.set_blocking(fd, was_blocking)


class LockedPipe:
    """The node's end of the DHT process's pipe, one `send` at a time. hivemind sends on it from
    whichever thread calls the DHT (a node runs its calls in a thread pool); two large messages
    written at once interleave in the pipe, and the DHT process, reading garbage, dies."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            self.connection.send(message)

    def close(self) -> None:
        self.connection.close()


async def learn_head(dht: Any, node: Any, round_: int) -> bool:
    """Runs in the DHT process: the node read a validator record of `round_` (`PulseDHT.get`)."""
    for storage in (node.protocol.storage, node.protocol.cache):
        if isinstance(storage, BoundedStorage):
            storage.budget.learn_head(round_)
    return True


async def install(dht: Any, node: Any, rules: RecordRules) -> bool:
    """Runs in the DHT process (`hivemind.DHT.run_coroutine`): the waiting pipe and bounded storage."""
    if not isinstance(dht._inner_pipe, WaitingPipe):
        dht._inner_pipe = WaitingPipe(dht._inner_pipe)
    protocol = node.protocol
    for name in ("storage", "cache"):
        old = getattr(protocol, name)
        if isinstance(old, BoundedStorage):
            continue
        maxsize = None if old.maxsize == float("inf") else int(old.maxsize)
        new = BoundedStorage(StoreBudget(rules), maxsize)
        for key, item in list(old.items()):  # records stored while the node started: admitted again
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, entry in list(item.value.items()):
                    new.store_subkey(key, subkey, entry.value, entry.expiration_time)
        setattr(protocol, name, new)
    return True
