"""The one thread that calls a backend on behalf of many (``envace serve``): continuous batching of concurrent jobs.

torch is not thread-safe and a backend holds state (kept KV caches, a packed decoder), so every call into the
backend is made by one thread, the worker's. Callers :meth:`GenerationWorker.submit` a :class:`Job` (prompts,
sampling settings, a callback) from any thread; the callback gets :class:`Update` s on the worker thread (it must
not block: ``envace serve`` hands each one to its event loop).

How jobs share the backend:

- The worker runs the queued jobs as one :meth:`Backend.generate_stream`. Its ``poll`` pulls every job queued
  since the last step and hands its prompts to the stream: requests arriving concurrently join the running batch
  at its next decode step (``HFBackend``), whatever the running ones are, instead of waiting for them to end. A
  backend without continuous batching (``streams`` False) runs the base class's rounds of ``generate``, one call
  per sampling setting, polled between rounds.
- Cancelling: a job's ``cancelled`` flag (set when its client goes away) ends its sequences at the next decode
  step (``HFBackend``; finish_reason "abort", counted in ``stats["aborted"]``), or before their next round or
  piece; a queued job that is cancelled never starts.
- The first job of an idle worker waits ``wait_s`` for others to start with it (one prefill, one batch).
- A seeded job runs alone, in a stream of its own seeded with its seed: its result does not depend on what else is
  running (inside a shared stream the generator's draws and the batch would). It waits for the running stream to
  drain; the jobs queued behind it wait too, so a steady flow of unseeded jobs cannot starve it.
- Segments: a job with ``segment > 0`` (a streaming client) is generated in pieces of that many tokens, each the
  continuation of the previous one through a backend session (``HFBackend`` keeps the context's keys/values: only
  the last sampled token is encoded again). Each piece's end sends an :class:`Update` with everything so far and is
  a point where queued jobs join. Stop strings are checked across piece ends the way ``HFBackend`` checks them (in
  the decoded last :data:`STOP_WINDOW` tokens), so a segmented generation ends where a whole one would; its tokens
  are the whole one's up to kernel rounding (each piece's first token comes out of a prefill instead of a decode
  step). A piece costs a one-token prefill. Backends without ``streams`` ignore ``segment`` (no sessions to
  continue): their jobs are one piece.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.types import Generation
from .base import Backend, Request, SamplingParams

STOP_WINDOW = 16
"""Tokens decoded to look for a stop string after each sampled token (as ``HFBackend._finish_reason`` does)."""


@dataclass
class Update:
    """What a job's callback gets: sequence ``index`` of the job so far (``generation`` holds every token yet;
    its ``finish_reason`` is "" until ``done``), or ``error`` (``index`` -1: the backend failed, the job is over)."""

    index: int
    generation: Generation | None
    done: bool
    error: str | None = None


@dataclass
class Job:
    """Prompts (token ids) generated with one sampling setting; ``emit`` gets every :class:`Update`. Set
    ``cancelled`` (any thread) to stop it at the backend's next step (its sequences then end as they are, "abort")."""

    prompts: list[list[int]]
    params: SamplingParams
    emit: Callable[[Update], None]
    segment: int = 0
    """Tokens per piece (0: the whole generation is one piece)."""
    cancelled: bool = False


@dataclass
class _Seq:
    """One sequence of a job while it is generated."""

    job: Job
    index: int
    prompt: list[int]
    segment: int
    session: str | None
    toks: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    text: str = ""
    finish: str = ""
    cached: int = 0

    def request(self) -> Request:
        """The next piece: the prompt and what was generated so far, at most ``segment`` more tokens."""
        left = self.job.params.max_new_tokens - len(self.toks)
        n = min(left, self.segment) if self.segment else left
        return Request(
            prompt=self.prompt + self.toks,
            params=self.job.params.with_(max_new_tokens=n),
            session=self.session,
            tag=self,
            cancelled=self.cancelled,
        )

    def cancelled(self) -> bool:
        return self.job.cancelled

    def generation(self) -> Generation:
        return Generation(
            token_ids=list(self.toks),
            logprobs=list(self.lps),
            text=self.text,
            finish_reason=self.finish,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
        )


def first_stop(
    decode: Callable[[list[int]], str], toks: list[int], stop: Sequence[str], start: int, end: int
) -> int | None:
    """The first index ``i`` in [start, end) whose window ``toks[i + 1 - STOP_WINDOW : i + 1]``, decoded, holds a stop
    string, among the windows that reach back before ``start`` (the ones a piece starting at ``start`` did not see
    whole); None if there is none."""
    for i in range(start, min(end, start + STOP_WINDOW - 1)):
        window = decode(toks[max(0, i + 1 - STOP_WINDOW) : i + 1])
        if any(s in window for s in stop):
            return i
    return None


class GenerationWorker:
    """Owns ``backend``: every generation runs on this object's thread (see the module docstring)."""

    def __init__(self, backend: Backend, wait_s: float = 0.005, name: str = "envace-generate"):
        self.backend, self.wait_s = backend, wait_s
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self.stats = {"streams": 0, "jobs": 0, "pieces": 0, "failures": 0, "aborted": 0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        """Queue ``job`` (any thread); its updates come through ``job.emit``."""
        if not job.prompts:
            raise ValueError("a job needs at least one prompt")
        with self._cv:
            if self._closed:
                raise RuntimeError("the generation worker is closed")
            self._queue.append(job)
            self._cv.notify()

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop taking jobs; the running stream finishes, queued jobs get an error update."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    # -- the worker thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            if jobs:
                self._stream(jobs)

    def _pull(self) -> list[Job]:
        """Unseeded jobs from the head of the queue, up to the first seeded one (the lock is held)."""
        out = []
        while self._queue and self._queue[0].params.seed is None:
            job = self._queue.popleft()
            if not job.cancelled:
                out.append(job)
        return out

    def _take(self) -> list[Job] | None:
        """The jobs that start the next stream (a seeded job alone), or None once closed."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if self._closed:
                left, self._queue = list(self._queue), deque()
                for job in left:
                    _emit(job, Update(-1, None, True, error="the server is shutting down"))
                return None
            if self._queue[0].params.seed is not None:
                job = self._queue.popleft()
                return [] if job.cancelled else [job]
            jobs = self._pull()
            deadline = time.monotonic() + self.wait_s
            while not self._closed and not (self._queue and self._queue[0].params.seed is not None):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
                jobs += self._pull()
            return jobs

    def _stream(self, jobs: list[Job]) -> None:
        seed = jobs[0].params.seed  # not None only for a seeded job, which comes alone
        segmented = bool(getattr(self.backend, "streams", False))
        running: dict[int, tuple[Job, list[_Seq]]] = {}

        def start(job: Job) -> list[Request]:
            self.stats["jobs"] += 1
            seg = job.segment if segmented and job.segment > 0 else 0
            seqs = [
                _Seq(job, i, list(p), seg, f"serve-{uuid.uuid4().hex}" if seg else None)
                for i, p in enumerate(job.prompts)
            ]
            running[id(job)] = (job, seqs)
            return [s.request() for s in seqs]

        def on_done(req: Request, g: Generation) -> list[Request]:
            s: _Seq = req.tag
            self.stats["pieces"] += 1
            out = [s.request()] if self._advance(s, g) else []
            if not out:
                self._finish(s, running)
            else:
                _emit(s.job, Update(s.index, s.generation(), False))
            return out

        def poll() -> list[Request]:
            """The jobs queued since the last step join (not a seeded stream's: it runs alone)."""
            if seed is not None or not self._queue:  # the lock is taken only when something is queued
                return []
            with self._cv:
                new = self._pull()
            return [r for job in new for r in start(job)]

        requests = [r for job in jobs for r in start(job)]
        self.stats["streams"] += 1
        try:
            self.backend.generate_stream(requests, on_done, seed, poll)
        except Exception as e:  # noqa: BLE001 - handed to every waiting job (the server answers 500)
            # the worker lives on
            self.stats["failures"] += 1
            for job, seqs in running.values():
                _emit(job, Update(-1, None, True, error=f"{type(e).__name__}: {e}"))
                self._release([s.session for s in seqs if s.session])

    def _advance(self, s: _Seq, g: Generation) -> bool:
        """Take a finished piece into ``s``; True if the sequence goes on with another piece."""
        start = len(s.toks)
        s.toks += g.token_ids
        s.lps += g.logprobs
        if not start:
            s.cached = g.cached_tokens
        if not s.segment:
            s.text, s.finish = g.text, g.finish_reason
            return False
        finish, stop = g.finish_reason, [x for x in s.job.params.stop if x]
        if start and stop:
            decode = lambda ids: self.backend.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
            cut = first_stop(decode, s.toks, stop, start, len(s.toks) - (finish == "eos"))
            if cut is not None:
                del s.toks[cut + 1 :], s.lps[cut + 1 :]
                finish = "stop"
        s.text = self.backend.tokenizer.decode(s.toks, skip_special_tokens=True)
        more = finish == "length" and len(s.toks) < s.job.params.max_new_tokens
        if more and s.job.cancelled:
            more, finish = False, "abort"
        s.finish = "" if more else finish
        return more

    def _finish(self, s: _Seq, running: dict[int, tuple[Job, list[_Seq]]]) -> None:
        self.stats["aborted"] += int(s.finish == "abort")
        if s.session:
            self._release([s.session])
        _emit(s.job, Update(s.index, s.generation(), True))
        job, seqs = running[id(s.job)]
        if all(x.finish for x in seqs):
            del running[id(job)]

    def _release(self, sessions: list[Any]) -> None:
        if sessions:
            self.backend.release(sessions)


def _emit(job: Job, update: Update) -> None:
    """Hand ``update`` to the job's callback; a callback that fails (its client is gone) cancels the job."""
    try:
        job.emit(update)
    except Exception:  # noqa: BLE001 - a consumer's failure must not stop the stream the other jobs share
        job.cancelled = True
