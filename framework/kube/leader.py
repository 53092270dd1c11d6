"""Leader election on a coordination.k8s.io Lease, as client-go does it: one operator acts, the
others wait, and a leader that cannot renew in time stops before anyone else may start.

A Lease has expired when its record (holder and renew time) has not changed for its duration
as *this* process measures it (its monotonic clock from the moment it saw the record change),
so the nodes' wall clocks need not agree. Every write carries the resourceVersion it read: of
two candidates that both saw an expired Lease, one write fails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

import aiohttp.web
import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from prometheus_client import Gauge

log = logging.getLogger("statefleet")

# What a request to the API server may end in besides an answer we can act on.
UNANSWERED = (ApiError, OSError, httpx2.HTTPError)

LEADING = Gauge("statefleet_leader", "1 while this operator process holds the leader Lease, 0 while it waits")


@dataclass(frozen=True)
class Timing:
    """How long a Lease lasts unrenewed, how long the leader tries to renew before it gives up
    (shorter: it stops before another may take over), and how often everyone asks."""

    duration: float = 8.0
    renew_deadline: float = 5.0
    retry: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(
                f"lease timing: retry ({self.retry}) < renew deadline ({self.renew_deadline}) "
                f"< duration ({self.duration}) is required"
            )


@dataclass(frozen=True)
class Record:
    """What a Lease says: who holds it, since which renewal, for how long."""

    holder: str
    renewed: str  # renewTime as written (its value matters only as a change)
    duration: float


class Verdict(Enum):
    TAKE = "take"  # free, released or expired: write ourselves in
    RENEW = "renew"  # ours
    WAIT = "wait"  # someone else's, and alive


def verdict(record: Record | None, me: str, unchanged_for: float) -> Verdict:
    """What a candidate does with the Lease it read, unchanged for `unchanged_for` seconds of
    its own clock."""
    if record is None or not record.holder:
        return Verdict.TAKE
    if record.holder == me:
        return Verdict.RENEW
    if unchanged_for > record.duration:
        return Verdict.TAKE
    return Verdict.WAIT


def record_of(lease: Lease | None) -> Record | None:
    if lease is None or lease.spec is None:
        return None
    spec = lease.spec
    renewed = spec.renewTime or spec.acquireTime
    return Record(
        holder=spec.holderIdentity or "",
        renewed=renewed.isoformat() if isinstance(renewed, datetime) else str(renewed or ""),
        duration=float(spec.leaseDurationSeconds or 0),
    )


class LeadershipLost(Exception):
    """The Lease could not be renewed within the deadline, or another holder took it."""


class LeaderElector:
    def __init__(
        self, client: AsyncClient, namespace: str, name: str, identity: str, timing: Timing | None = None
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or Timing()
        self._seen: Record | None = None
        self._seen_at = 0.0  # monotonic: when the record last changed, as seen here
        self._renewed_at = 0.0  # monotonic: our last successful write
        self.leading = False
        LEADING.set(0)

    async def _read(self) -> Lease | None:
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code == 404:
                lease = None
            else:
                raise
        record = record_of(lease)
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        return lease

    def _spec(self, lease: Lease | None, taking: bool) -> LeaseSpec:
        now = datetime.now(UTC)
        old = lease.spec if lease is not None and lease.spec is not None else LeaseSpec()
        transitions = old.leaseTransitions or 0
        return LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.timing.duration)),
            acquireTime=now if taking else old.acquireTime,
            renewTime=now,
            leaseTransitions=transitions + (taking and old.holderIdentity != self.identity),
        )

    async def _try(self, renewing: bool = False) -> bool:
        """One look at the Lease; True while it is ours. `renewing`: a leader's look, which
        never takes a Lease someone else wrote meanwhile (it was deposed)."""
        lease = await self._read()
        action = verdict(self._seen, self.identity, time.monotonic() - self._seen_at)
        if action is Verdict.WAIT or (renewing and action is not Verdict.RENEW):
            return False
        taking = action is Verdict.TAKE
        try:
            if lease is None:
                meta = ObjectMeta(name=self.name, namespace=self.namespace)
                await self.client.create(Lease(metadata=meta, spec=self._spec(None, True)))
            else:
                # The resourceVersion read above goes with it: a concurrent write makes this fail.
                await self.client.replace(Lease(metadata=lease.metadata, spec=self._spec(lease, taking)))
        except ApiError as error:
            if error.status.code in (409, 422):  # someone else wrote first
                return False
            raise
        self._renewed_at = time.monotonic()
        if taking:
            log.info("leader Lease %s/%s taken by %s", self.namespace, self.name, self.identity)
        return True

    async def acquire(self) -> None:
        """Returns once this process holds the Lease."""
        log.info("waiting for the leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            try:
                if await self._try():
                    break
            except UNANSWERED as error:  # the API server busy or away: ask again
                log.warning("leader Lease %s/%s: %s", self.namespace, self.name, error)
            await asyncio.sleep(self.timing.retry)
        self.leading = True
        LEADING.set(1)

    async def keep(self) -> None:
        """Renews the Lease; raises LeadershipLost when no renewal succeeded within the renew
        deadline (the caller must stop acting at once)."""
        while True:
            await asyncio.sleep(self.timing.retry)
            while not await self._renew_once():
                if time.monotonic() - self._renewed_at >= self.timing.renew_deadline:
                    self._lost()
                    raise LeadershipLost(
                        f"the leader Lease {self.namespace}/{self.name} was not renewed within "
                        f"{self.timing.renew_deadline:.0f} s"
                    )
                await asyncio.sleep(self.timing.retry / 4)

    def _lost(self) -> None:
        self.leading = False
        LEADING.set(0)

    async def _renew_once(self) -> bool:
        """One renewal, within what is left of the deadline; False when it did not succeed."""
        left = self._renewed_at + self.timing.renew_deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(0.05, left)):
                renewed = await self._try(renewing=True)
        except (*UNANSWERED, TimeoutError) as error:
            log.warning("renewing the leader Lease %s/%s: %r", self.namespace, self.name, error)
            return False
        holder = self._seen.holder if self._seen is not None else ""
        if not renewed and holder != self.identity:
            self._lost()
            raise LeadershipLost(
                f"the leader Lease {self.namespace}/{self.name} is held by {holder or 'nobody'}"
            )
        return renewed

    async def release(self) -> None:
        """On a clean stop: the Lease says nobody holds it, so a standby takes it at its next look."""
        if not self.leading:
            return
        self._lost()
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity = None
            lease.spec.leaseDurationSeconds = 1
            await self.client.replace(lease)
            log.info("leader Lease %s/%s released", self.namespace, self.name)
        except UNANSWERED as error:
            log.warning("releasing the Lease %s/%s: %s (it expires)", self.namespace, self.name, error)


@contextlib.asynccontextmanager
async def standby_health(endpoint: str | None) -> AsyncIterator[None]:
    """While a process waits for the Lease, its liveness endpoint says it is alive (it is: a
    standby that is restarted for waiting would never be ready to take over). The controllers
    serve the endpoint themselves once it leads."""
    if not endpoint:
        yield
        return
    parts = urllib.parse.urlsplit(endpoint)

    async def alive(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"leader": False})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get(parts.path or "/", alive)])
    runner = aiohttp.web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80, reuse_address=True)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()
