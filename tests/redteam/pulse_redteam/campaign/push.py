"""Pushing a submission the way `node.net.transfer.call_submit` does, and the ways it must not be done.

`push` speaks the submit conversation (signed header, the receiver's verdict, the body, its final
verdict) but sends whatever body it is given: longer or shorter than announced, cut off half way,
or trickled a few bytes at a time. It returns what the receiver answered; it never raises on
the receiver's behaviour.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID

from node.net.streams import DEFAULT_LIMITS, STREAM_ERRORS, Status, open_stream, read_reply, send_request
from node.net.transfer import SUBMIT
from protocol.errors import ProtocolError, TransferError


@dataclass(frozen=True)
class Trickle:
    """Send `step` bytes every `pause` seconds."""

    step: int
    pause: float


@dataclass(frozen=True)
class Answer:
    """What the receiver said: 'OK' means stored and handed to its round."""

    status: str  # a `Status` name, or 'BROKEN' when the stream ended without a final reply
    reason: str = ""
    body_sent: bool = False

    @property
    def stored(self) -> bool:
        return self.status == "OK"


async def push(
    p2p: P2P,
    peer: PeerID,
    envelope: bytes,
    body: bytes,
    *,
    cut_at: int | None = None,
    trickle: Trickle | None = None,
    on_body: asyncio.Event | None = None,
) -> Answer:
    """Send `envelope`, then (if admitted) `body[:cut_at]` and hang up; the receiver's final answer."""
    limits = DEFAULT_LIMITS
    try:
        async with open_stream(p2p, peer, SUBMIT, limits) as (reader, writer):
            await send_request(writer, envelope, limits)
            status, _, reason = await read_reply(reader, limits.open_timeout)
            if status is not Status.OK:
                return Answer(status.name, reason)
            if on_body is not None:
                on_body.set()
            data = body if cut_at is None else body[:cut_at]
            await _send(writer, data, trickle)
            if cut_at is not None:
                writer.close()  # the truncated stream: hang up without the rest
                return Answer("BROKEN", f"hung up after {cut_at} of {len(body)} bytes", body_sent=True)
            status, _, reason = await read_reply(reader, 120.0)
            return Answer(status.name, reason, body_sent=True)
    except (TransferError, ProtocolError, TimeoutError, *STREAM_ERRORS) as exc:
        return Answer("BROKEN", f"{type(exc).__name__}: {exc}"[:200])


async def _send(writer: asyncio.StreamWriter, data: bytes, trickle: Trickle | None) -> None:
    if trickle is None:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), 30.0)
        return
    for at in range(0, len(data), trickle.step):
        writer.write(data[at : at + trickle.step])
        await asyncio.wait_for(writer.drain(), 30.0)
        await asyncio.sleep(trickle.pause)
