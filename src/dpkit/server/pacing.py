"""Paid answers released at a fixed time, and the bounded pool that computes them.

How long a query takes depends on the data: a filter that keeps one row answers faster than one
that keeps 150,000, and one hostile person with many rows slows contribution bounding. An analyst
who times answers learns that without paying for it. The defence is Fuzz's *predictable
transactions* (Haeberlen, Pierce and Narayan, "Differential Privacy Under Fire", USENIX Security
2011, §5): every paid request gets a time budget computed from public facts only, and its answer
leaves when the budget ends — never earlier. Work still running then is cancelled and answered
with the fixed ``query_failed`` (the spend stands). Here:

* **The budget** (:class:`AnswerTimes`) is a function of the service's configuration
  (``answer_seconds``, ``synth_seconds``), the dataset's declared size class and engine, and the
  request's shape (aggregates, group-by, private key selection, quantiles; for a synthetic table,
  its rounds). Nothing about the data enters it. The request's cost preview
  (``/query/cost``) reports it.
* **The clock starts** when the debit commits — the moment the data may first be touched — and
  the answer is held (an ``asyncio.sleep`` on the event loop) until the budget ends. What comes
  before — waiting for a thread, opening the dataset, parsing, pricing, waiting for the ledger —
  depends on the request, the metadata and the server's load, not on the rows. Refusals
  decided before the debit (bad input, a budget that cannot pay, a limit) are answered at once.
* **The work** runs in a pool of ``heavy_threads`` threads of its own, so that authentication,
  ``/v1/me`` and the audit log (the default thread pool) never wait behind queries or synthesis.
  A thread hands its answer to the event loop as soon as it has one, then stays taken until the
  deadline, so a thread is taken for a time set by the request and its budget: waiting for a
  free thread tells nothing about anyone's data (with
  ``hold`` off, as in the test suite's functional tests, it would).
* **Per principal**, refused before anything is paid: at most ``max_concurrent`` paid requests in
  flight, and at most ``cpu_seconds_per_hour`` seconds of answer time an hour (a bucket charged
  with each request's *budget*, which is public — not with the time its work took, which is not).
  Both are per server process, like the request rate.
* **Cancellation**: a DuckDB query is interrupted; a synthetic table's fit stops at its next
  round (:func:`dpkit._cancel.checkpoint`); the answer is the fixed ``query_failed`` naming the
  spend, which stands.

What still leaks: whether the work finished within its budget (an answer of ``query_failed``
after an overrun depends on the data) — budgets are generous for that reason, and an overrun is
logged for the curator to raise the budget; and the time between the deadline and the bytes on
the wire, which depends on the server's load, not on the data. See the service guide for how the
budgets are chosen and tuned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dpkit import _validate as v
from dpkit._cancel import Cancelled, cancellable
from dpkit.errors import LimitExceededError
from dpkit.server.allowance import HourlyAllowance
from dpkit.server.errors import PaidQueryFailedError
from dpkit.server.problems import Problem
from dpkit.server.size_class import DEFAULT_SIZE_CLASS, SIZE_CLASSES

__all__ = ["AnswerTimes", "SynthLimits", "Ticket", "Pacer"]

_curator_log = logging.getLogger("dpkit.curator")

T = TypeVar("T")

#: How long past its deadline a paid answer may take to leave its thread before the work counts
#: as overrun (plus 5 % of the budget): the thread's wake-up, not the work.
_GRACE = 0.05

#: A Spark dataset's answers: each query is a cluster job, with its own start-up latency.
_SPARK_FACTOR, _SPARK_SECONDS = 4.0, 2.0


@dataclass(frozen=True)
class AnswerTimes:
    """The time budget of a paid request, from public facts only.

    ``answer_seconds`` is the budget of one simple aggregate (a COUNT) on a ``medium`` dataset
    (at most 1,000,000 rows) read by DuckDB; ``synth_seconds`` that of a synthetic table with
    MST (or AIM with up to 10 rounds) on one. A query's budget is ``answer_seconds`` × the size
    class's factor (small 0.5, medium 1, large 4, huge 16) × its shape: 1, plus 0.5 per further
    aggregate, 1 for a group-by, 1 more when its keys are selected privately, 2 per quantile
    (each is a search over the column). A query that joins tables (a dataset of several tables,
    whose size class bounds the rows of each) is budgeted ``tables + matches - 1`` times that:
    one more scan of at most the class's rows per further table read, and one more row to join
    and bound per further joined row one row of the table read can become (``matches``, the
    product of the joined tables' declared ``max_matches`` and ``join_rows``). A Spark dataset's
    budget is 4 times that plus 2 s."""

    answer_seconds: float = 0.5
    synth_seconds: float = 60.0

    def __post_init__(self) -> None:
        v.positive(self.answer_seconds, "answer_seconds")
        v.positive(self.synth_seconds, "synth_seconds")

    def query(
        self,
        size_class: str,
        engine: str,
        groups: int,
        private_keys: bool,
        kinds: Sequence[str],
        *,
        tables: int = 1,
        matches: int = 1,
    ) -> float:
        """The budget of a query with ``groups`` group-by columns, whose keys are selected
        privately or not, and aggregates of these ``kinds`` (``"bounding"``: the estimate of what
        bounding left out, a second bounding pass over the table), reading ``tables`` tables
        joined into at most ``matches`` rows per row of the table it reads."""
        shape = 1.0 + 0.5 * max(0, len(kinds) - 1) + (1.0 if groups else 0.0) + (1.0 if private_keys else 0.0)
        shape += 2.0 * sum(1 for k in kinds if k in ("quantile", "median"))
        shape += 1.0 * sum(1 for k in kinds if k == "bounding")
        shape *= max(1, tables) + max(1, matches) - 1
        return self._scaled(self.answer_seconds * shape, size_class, engine)

    def synthesis(self, size_class: str, engine: str, rounds: int) -> float:
        """The budget of a synthetic table fitted in ``rounds`` measurement rounds (0 for MST)."""
        return self._scaled(self.synth_seconds * max(1.0, rounds / 10), size_class, engine)

    def _scaled(self, seconds: float, size_class: str, engine: str) -> float:
        seconds *= SIZE_CLASSES.get(size_class, SIZE_CLASSES[DEFAULT_SIZE_CLASS])[1]
        return seconds * _SPARK_FACTOR + _SPARK_SECONDS if engine == "spark" else seconds


@dataclass(frozen=True)
class SynthLimits:
    """What one synthetic-table request may ask of the service, checked before paying:
    ``max_rounds`` measurement rounds, and ``max_cells`` cells over all one- and two-way
    marginals of its domain (what its fit counts and holds)."""

    max_rounds: int = 100
    max_cells: int = 1_000_000

    def __post_init__(self) -> None:
        v.positive_int(self.max_rounds, "max_synth_rounds")
        v.positive_int(self.max_cells, "max_synth_cells")

    def check_synthesis(self, rounds: int, domain: Any) -> None:
        """LimitExceededError naming the setting when the request asks for more."""
        if rounds > self.max_rounds:
            raise LimitExceededError("rounds", rounds, self.max_rounds, "max_synth_rounds")
        sizes = [int(n) for n in domain.shape]
        total = sum(sizes) + (sum(sizes) ** 2 - sum(n * n for n in sizes)) // 2
        if total > self.max_cells:
            raise LimitExceededError("columns", f"{total:,} marginal cells", self.max_cells, "max_synth_cells")


class Ticket:
    """One paid request's clock and cancellation, shared by the route (on the event loop) and its
    work (in the heavy pool).

    The work calls :meth:`arm` (with :meth:`AnswerTimes.query`'s budget) or :meth:`arm_synthesis`
    once it has priced the request (before paying): that fixes the answer's time and charges the
    principal's allowance. It debits inside :meth:`paying`, registers what interrupts its engine
    with :meth:`interrupt_with`, and long loops check :meth:`check` (through
    :func:`dpkit._cancel.checkpoint`)."""

    def __init__(self, pacer: Pacer, principal: str) -> None:
        self.principal = principal
        self.deadline: float | None = None
        self.budget = 0.0
        self.paid = False
        self.finished = False  # the work returned or raised (set by its thread)
        self.spend_id: int | None = None
        self._pacer = pacer
        self._cond = threading.Condition()
        self._paying = False
        self._cancelled = False
        self._interrupt: Callable[[], None] | None = None
        self._on_paid: Callable[[], None] | None = None
        #: Run by the debit in its own transaction with the spend's id (the request's
        #: idempotency claim: dpkit.server.idempotency); raising rolls the debit back.
        self.on_debit: Callable[[Any, int], None] | None = None

    @property
    def times(self) -> AnswerTimes:
        return self._pacer.times

    @property
    def limits(self) -> SynthLimits:
        return self._pacer.synth_limits

    # -- the work's side ---------------------------------------------------------------------------

    def arm(self, seconds: float) -> None:
        """Set the answer's time budget: it leaves ``seconds`` after its debit commits. Charged
        to the principal's hourly allowance (429 or limit_exceeded before anything is paid)."""
        if seconds > self._pacer.allowance.per_hour:  # never payable: a limit, not a wait
            raise LimitExceededError(
                "answer_seconds", round(seconds, 3), self._pacer.allowance.per_hour, "cpu_seconds_per_hour"
            )
        self._pacer.allowance.charge(self.principal, seconds)
        with self._cond:
            if self._cancelled:
                raise Cancelled()
            self.budget = seconds

    def arm_synthesis(self, size_class: str, engine: str, rounds: int) -> None:
        self.arm(self.times.synthesis(size_class, engine, rounds))

    @contextlib.contextmanager
    def paying(self) -> Iterator[Callable[[int | None], None]]:
        """Debit inside this block; it yields the function that records the spend's id. Raises
        Cancelled (nothing spent) if the request's time already ran out."""
        with self._cond:
            if self._cancelled:
                raise Cancelled()
            self._paying = True

        def paid(spend_id: int | None) -> None:
            with self._cond:
                self.paid, self.spend_id = True, spend_id
                if self.budget > 0:  # armed: the clock starts now
                    self.deadline = time.monotonic() + self.budget
                notify = self._on_paid
            if notify is not None:
                notify()

        try:
            yield paid
        finally:
            with self._cond:
                self._paying = False
                self._cond.notify_all()

    def interrupt_with(self, interrupt: Callable[[], None] | None) -> None:
        """What stops the work's engine when the time runs out (None: nothing any more)."""
        with self._cond:
            self._interrupt = interrupt
            cancelled = self._cancelled
        if cancelled and interrupt is not None:
            interrupt()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def check(self) -> None:
        """Raise Cancelled once the request's time ran out."""
        if self._cancelled:
            raise Cancelled()

    # -- the route's side --------------------------------------------------------------------------

    def cancel(self) -> bool:
        """Stop the work (blocking while a debit is in progress: call it off the event loop);
        whether the request paid."""
        with self._cond:
            self._cancelled = True
            while self._paying:
                self._cond.wait()
            interrupt = self._interrupt
        if interrupt is not None:
            try:
                interrupt()
            except Exception:  # an engine already closed: nothing left to stop
                _curator_log.debug("interrupting a cancelled request's engine failed", exc_info=True)
        return self.paid


class Pacer:
    """The heavy pool, the principals' limits and the answers' clock of one server process."""

    def __init__(
        self,
        times: AnswerTimes | None = None,
        *,
        threads: int = 64,
        max_concurrent: int = 8,
        cpu_seconds_per_hour: float = 3600.0,
        synth_limits: SynthLimits | None = None,
        hold: bool = True,
    ) -> None:
        # hold=False releases answers as soon as they are ready (the time still bounds the work):
        # for the test suite's functional tests only; it is not a setting of the service.
        self.hold = hold
        self.times = times or AnswerTimes()
        self.synth_limits = synth_limits or SynthLimits()
        self.max_concurrent = v.positive_int(max_concurrent, "max_concurrent")
        self.allowance = HourlyAllowance(cpu_seconds_per_hour, "cpu_seconds_per_hour", "s of answer time")
        self._pool = ThreadPoolExecutor(v.positive_int(threads, "heavy_threads"), thread_name_prefix="dpkit-heavy")
        self._inflight: dict[str, int] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _admit(self, principal: str) -> None:
        with self._lock:
            n = self._inflight.get(principal, 0)
            if n >= self.max_concurrent:
                raise Problem(
                    429,
                    "rate_limited",
                    f"{principal!r} already has {n} paid requests in progress (the limit); retry when one is answered",
                    headers={"Retry-After": "1"},
                    setting="max_concurrent",
                )
            self._inflight[principal] = n + 1

    def _release(self, principal: str) -> None:
        with self._lock:
            n = self._inflight.get(principal, 1) - 1
            if n > 0:
                self._inflight[principal] = n
            else:
                self._inflight.pop(principal, None)

    def inflight(self, principal: str) -> int:
        with self._lock:
            return self._inflight.get(principal, 0)

    async def run(self, principal: str, work: Callable[[Ticket], T]) -> T:
        """Run ``work`` in the heavy pool and return its answer at the ticket's deadline.

        Before the work pays, anything it raises (a refusal) is raised at once. Once it paid, the
        answer — or a failure after the debit — leaves at the deadline (its budget after the
        debit), not before; if the work is still running then, it is cancelled and this raises
        PaidQueryFailedError.

        The work hands its outcome to the event loop as soon as it has one, and the loop's timer
        releases it: whether the work finished in time is what decides, not when its thread,
        asleep until the deadline, next gets the interpreter lock (under load that took longer
        than the grace, and finished answers were failed as overruns)."""
        self._admit(principal)
        ticket = Ticket(self, principal)
        loop = asyncio.get_running_loop()
        paid: asyncio.Future[None] = loop.create_future()
        outcome: asyncio.Future[T] = loop.create_future()
        outcome.add_done_callback(_consume)

        def on_paid() -> None:
            loop.call_soon_threadsafe(_resolve, paid)

        ticket._on_paid = on_paid
        slot = _Slot(self, principal)
        try:
            done = self._pool.submit(_run, ticket, work, self.hold, loop, outcome)
        except BaseException:
            slot.free()
            raise
        done.add_done_callback(slot.free)  # overrun or abandoned: when its thread is done
        try:
            waiting: set[asyncio.Future[Any]] = {outcome, paid}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            deadline = ticket.deadline
            if deadline is None:  # refused (or answered) before it paid: nothing holds its thread
                await asyncio.wait({outcome})
                slot.free()
                return outcome.result()
            if not ticket.finished:
                grace = _GRACE + 0.05 * ticket.budget
                await asyncio.wait({outcome}, timeout=max(0.0, deadline + grace - time.monotonic()))
            if ticket.finished:  # in time: its outcome is set or on its way to the loop
                await asyncio.wait({outcome})
                if self.hold:
                    await _until(deadline)
                slot.free()
                return outcome.result()
            await loop.run_in_executor(None, ticket.cancel)
            _curator_log.warning(
                "a request by %r ran past its answer time of %.3f s and was cancelled (spend %s): raise "
                "answer_seconds/synth_seconds or the dataset's size class if this recurs",
                principal,
                ticket.budget,
                ticket.spend_id,
            )
            raise PaidQueryFailedError(ticket.spend_id, None)  # type: ignore[arg-type]
        finally:
            if not paid.done():
                paid.cancel()


class _Slot:
    """An admitted request's place among its principal's ``max_concurrent``, freed once: when
    its answer or refusal leaves, or (overrun, abandoned) when its thread is done — work still
    running counts against its principal."""

    def __init__(self, pacer: Pacer, principal: str) -> None:
        self._pacer, self._principal = pacer, principal
        self._lock = threading.Lock()
        self._held = True

    def free(self, *_: object) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._pacer._release(self._principal)


def _run(
    ticket: Ticket, work: Callable[[Ticket], T], hold: bool, loop: asyncio.AbstractEventLoop, outcome: asyncio.Future[T]
) -> None:
    """The work, its outcome handed to the event loop at once, then — once it paid — the wait
    until its deadline, in the same thread: a thread of the pool is taken for a time that
    depends on the request and its budget, never on how long the work took, so waiting for a
    thread tells no one anything about the data."""
    value: Any = None
    error: BaseException | None = None
    try:
        with cancellable(ticket.check):
            value = work(ticket)
    except BaseException as exc:  # raised by the request, at its time
        error = exc
    ticket.finished = True
    with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
        loop.call_soon_threadsafe(_settle, outcome, value, error)
    deadline = ticket.deadline
    if hold and deadline is not None and not ticket.cancelled:
        time.sleep(max(0.0, deadline - time.monotonic()))


async def _until(deadline: float) -> None:
    """Sleep on the event loop until ``time.monotonic()`` reaches ``deadline`` (a loop's timer may
    fire a little early: uvloop's count milliseconds)."""
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(left)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a cancelled request's late failure is not "never retrieved"
