"""A Faust worker that stops on SIGINT/SIGTERM and says which signal stopped it.

Faust's own worker turns either signal into a clean stop and then `SystemExit(0)`: a service
manager cannot tell a stop it asked for from a worker that ended by itself. `SignalledWorker`
stops the same way (the agents settle, the consumer leaves its group) and keeps the signal in
`stopped_by`, so the command exits 128 + its number like every other `stacx` command.
`give_up` stops it the same way for a reason of its own, and `run()` then raises `WorkerGaveUp`.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import faust

__all__ = ["SignalledWorker", "WorkerGaveUp"]

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WorkerGaveUp(RuntimeError):
    """The worker stopped itself (`SignalledWorker.give_up`): the reason is the message."""


class SignalledWorker(faust.Worker):
    """`run()` blocks until the app stops; `stopped_by` is the signal that stopped it, if any."""

    stopped_by: signal.Signals | None = None
    gave_up: str | None = None
    _starting: asyncio.Future[None] | None = None

    def install_signal_handlers(self) -> None:
        for signum in STOP_SIGNALS:
            self.loop.add_signal_handler(signum, self.stop_on, signum)

    def stop_on(self, signum: int) -> None:
        """Stop the worker because of `signum` (a second signal while stopping is ignored)."""
        if self.stopped_by is not None:
            return
        self.stopped_by = signal.Signals(signum)
        log.info("%s received: stopping", self.stopped_by.name)
        asyncio.ensure_future(self._stop_starting(), loop=self.loop)

    def give_up(self, reason: str) -> None:
        """Stop because the worker cannot go on (`reason`, logged once as an error); `run()`
        then raises `WorkerGaveUp`. Ignored while a stop is under way."""
        if self.stopped_by is not None or self.gave_up is not None:
            return
        self.gave_up = reason
        log.error("%s: stopping", reason)
        asyncio.ensure_future(self._stop_starting(), loop=self.loop)

    async def _stop_starting(self) -> None:
        await self.stop()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()  # still starting (a child service waits on Kafka)

    def run(self) -> None:
        """Start the app and block until it stops (by a signal; a crash is re-raised, a
        `give_up` raises `WorkerGaveUp`)."""
        self._starting = asyncio.ensure_future(self.start(), loop=self.loop)
        try:
            self.loop.run_until_complete(self._starting)
        except asyncio.CancelledError:
            pass
        finally:
            self.on_worker_shutdown()
            self.stop_and_shutdown()
        if self.gave_up is not None:
            raise WorkerGaveUp(self.gave_up)
