"""The round intake: what a validator process does with pushed submissions, active or standby.

    intake = RoundIntake(setup, events, folder / "inbox")        # one per validator process
    peer = network.join(identity, folder, role="validator", intake=intake)   # `rpc_submit` ends here
    intake.open(terms_of(setup, identity, book, state_hash, weights))          # round r takes headers
    intake.close()                                                # bodies still arriving are refused
    submissions = list(intake.received.values())                  # what the round scores

The transfer service calls three methods, on the event loop:

- `accept(header)`, before any body byte: the round is the open one; the header's codec, base state
  (W_r), announced size and data digest hold (`validator.intake.check_header`, the same checks the
  Gauntlet repeats after the body); then `validator.admission` seats it or refuses it (established
  keys first, newcomers by ticket, every seat's bytes reserved against the round's byte budget). A
  newcomer it unseats leaves the round (`Dropped`, its payload removed);
- `favoured(header)`: established keys may use the reserved upload slots;
- `on_submission(verified, path)`, once the body is stored in the inbox: kept for the round
  (`Received`, its arrival time noted for the adaptive deadline), or refused with the reason. A body
  that is no payload of the run's codec (`Codec.framing_problem`: read to its end, nothing decoded)
  is refused here and its seat freed at once (`Admission.reject`), so junk from fresh keys holds no
  seat for the round; a payload that frames but fails once decoded is the Gauntlet's to judge.

The active validator and a standby hold the same object and apply the same rules: a standby opens
it on the state its auditor verified, with the standing its replica's book records (`terms_of`), and
hands it, with what it collected, to the service it starts when it takes a round over. Payloads stay
in the inbox, one file per distinct body, until the round closes or they are refused.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.events import Events, mb
from node.events.models import Dropped, Received
from node.net.blobstore import BlobStore
from node.run.manifest import codec_for
from node.run.setup import RunSetup
from protocol.codec import default_max_bytes
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import Verified
from protocol.state import State
from validator.admission import Admission, AdmissionRules
from validator.core import earning_in, established_in, round_context
from validator.intake import RoundContext, Submission, check_header, reason_text
from validator.scoring import RoundSecret
from validator.state import Book

log = logging.getLogger(__name__)
Clock = Callable[[], float]
"""Wall-clock seconds (`time.time`); a test passes a skewed one."""


@dataclass(frozen=True)
class RoundTerms:
    """What one round's headers are checked against, before any body is read."""

    context: RoundContext  # run, round, W_r's hash, the earlier states, codec, payload cap
    established: frozenset[str]  # seated first, and favoured on the upload slots
    secret: bytes  # this validator's secret for the round: the newcomers' tickets
    layout: State  # W_r: the names and shapes a payload must be made for
    earning: frozenset[str] = frozenset()  # newcomers that earned standing once: the lowest tickets
    waited: frozenset[str] = frozenset()  # newcomers left unexamined last round: tickets before fresh keys'


def terms_of(setup: RunSetup, identity: Identity, book: Book, state_hash: str, weights: State) -> RoundTerms:
    """The terms of the round after `book`, whose state W_r (`weights`, hash `state_hash`) this
    validator holds: its own committed one (active) or its auditor's verified replica (standby)."""
    cfg = setup.manifest.gauntlet()
    cap = cfg.max_payload_bytes or default_max_bytes(weights)
    secret = RoundSecret.derive(identity, setup.run_id, book.round).key("admission")
    context = round_context(cfg, setup.run_id, book, state_hash, cap)
    earning, waited = earning_in(cfg, book), frozenset(book.waited)
    return RoundTerms(context, established_in(cfg, book), secret, weights, earning, waited)


def admission_rules(setup: RunSetup, max_payload: int) -> AdmissionRules:
    """The manifest's seats and byte budget (eight payloads at the cap unless the run names one)."""
    cfg = setup.manifest.gauntlet()
    return AdmissionRules(
        capacity=cfg.max_submissions,
        newcomer_seats=min(cfg.newcomer_seats, cfg.max_submissions),
        byte_budget=cfg.round_payload_bytes or 8 * max_payload,
    )


class RoundIntake:
    """The submissions of the open round, one per seated miner, payloads on disk (see the module docstring)."""

    def __init__(self, setup: RunSetup, events: Events, inbox: Path, *, clock: Clock = time.time) -> None:
        """`inbox`: the folder pushed payloads land in, owned by this intake and emptied here (a round
        cut off by a restart starts over: its payloads are void)."""
        self.setup, self.events, self.clock = setup, events, clock
        self.codec = codec_for(setup.manifest)
        self.inbox = BlobStore(inbox)
        self.inbox.clear_partials()
        self.received: dict[str, Submission] = {}  # by sender, this round; payloads are files in the inbox
        self.arrivals: dict[str, float] = {}  # by sender, this round: seconds after the open
        self.empty()
        self.terms: RoundTerms | None = None  # None until a round opens
        self.rules: AdmissionRules | None = None  # from the first terms, unless set before (tests)
        self.admission = Admission(AdmissionRules(0, 0, 0), frozenset(), b"")
        self.closed = True
        self.opened_at = 0.0

    @property
    def round(self) -> int:
        """The round this intake holds (-1 before the first opens)."""
        return self.terms.context.round if self.terms is not None else -1

    def open(self, terms: RoundTerms, *, opened_at: float | None = None) -> None:
        """Take headers for `terms`' round from now on; nothing of an earlier round stays."""
        rules = self.rules or admission_rules(self.setup, terms.context.max_payload_bytes)
        self.terms, self.rules = terms, rules
        self.admission = Admission(rules, terms.established, terms.secret, earning=terms.earning, waited=terms.waited)
        self.arrivals = {}
        self.empty()  # a body may have landed after the last round closed
        self.opened_at = self.clock() if opened_at is None else opened_at
        self.closed = False

    def close(self) -> None:
        """Headers and bodies still on their way are refused from now on; `received` is the round's."""
        self.closed = True

    def empty(self) -> None:
        """Every payload of the inbox goes (the round's are decided, or void), and with them `received`."""
        self.received = {}
        for sha in list(self.inbox):
            self.inbox.remove(sha)

    # -- what the transfer service calls -------------------------------------------------------------

    def accept(self, header: SubmissionHeader) -> str | None:
        """A verified header, before its body: None seats it, else the reason it is refused."""
        if self.closed or self.terms is None or header.round != self.round:
            if header.round == self.round:
                return f"round {header.round} has closed: the validator is scoring it"
            return f"round {header.round} is not open (the open round is {self.round})"
        problem = check_header(header, self.terms.context)
        if problem is not None:
            return problem
        verdict = self.admission.offer(header.sender, header.payload_size)
        for sender, reason in verdict.unseated:
            self._drop(sender, reason)
        return verdict.refusal

    def favoured(self, header: SubmissionHeader) -> bool:
        """Established miners (admission's first seats) may also use the reserved upload slots."""
        return header.sender in self.admission.established

    def void(self, header: SubmissionHeader) -> str | None:
        """While its body arrives: the reason it is no longer wanted (its round has closed), or None."""
        if self.closed or header.round != self.round:
            return f"round {header.round} closed while its body arrived"
        return None

    def on_submission(self, verified: Verified[SubmissionHeader], path: Path) -> str | None:
        """Its body arrived (verified, at `path` in the inbox): None keeps it for the round."""
        header = verified.message
        refusal = self.void(header) or self.admission.arrive(header.sender)
        if refusal is None and (problem := self._framing_problem(path)) is not None:
            refusal = problem  # the transfer service logs it and answers it on the stream
            self.admission.reject(header.sender, problem)
        if refusal is not None:
            self._discard(header.payload_sha256)
            return refusal
        self.received[header.sender] = Submission(verified.signed.to_bytes(), path)
        self.arrivals[header.sender] = self.clock() - self.opened_at
        self.events.emit(
            Received(round=header.round, sender=header.sender, bytes=header.payload_size),
            f"round {header.round}: received {mb(header.payload_size)} from miner {header.sender[:12]}",
        )
        return None

    # -- payloads --------------------------------------------------------------------------------------

    def _framing_problem(self, path: Path) -> str | None:
        """Why the payload at `path` is no payload of the run's codec for W_r, or None (mapped, not read
        whole: only its framing is touched)."""
        if self.terms is None:
            return None
        layout, cap = self.terms.layout, self.terms.context.max_payload_bytes
        if path.stat().st_size == 0:  # mmap cannot map an empty file
            exc = self.codec.framing_problem(b"", layout, max_bytes=cap)
        else:
            with (
                path.open("rb") as f,
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as view,
            ):
                exc = self.codec.framing_problem(view, layout, max_bytes=cap)
        return None if exc is None else reason_text(f"undecodable: {type(exc).__name__}: {exc}")

    def _drop(self, sender: str, reason: str) -> None:
        """`sender` lost its seat: a received payload leaves the round (one in flight is refused on arrival)."""
        sub = self.received.pop(sender, None)
        self.arrivals.pop(sender, None)  # a dropped submission's arrival teaches the deadline nothing
        if sub is None:
            log.info("round %d: %s... %s (its body had not arrived)", self.round, sender[:12], reason)
            return
        assert isinstance(sub.payload, Path)
        self._discard(sub.payload.name)
        text = f"round {self.round}: dropped {sender[:12]}'s submission: {reason}"
        self.events.emit(Dropped(round=self.round, sender=sender, reason=reason), text)

    def _discard(self, sha256: str) -> None:
        """Remove a payload from the inbox unless a submission still in the round has the same bytes."""
        if all(not isinstance(s.payload, Path) or s.payload.name != sha256 for s in self.received.values()):
            self.inbox.remove(sha256)
