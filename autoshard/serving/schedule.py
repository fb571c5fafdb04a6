"""The calls each server of a deployment receives from a request stream, for measuring servers
one at a time (trace-driven: each server is replayed its own calls, then the requests are
composed, :mod:`autoshard.serving.replay`).

A :class:`RequestStream` is what a request sample looks up: per request, the parts it touches
(:func:`autoshard.serving.simulate.touched_parts`) and the row ids of each, one bag per item
of a per-item part. A :class:`Routing` is where a deployment serves each of them: the request
goes to a main-tier replica, and the parts a shard holds travel in one call to a replica of
that shard, both dealt by :func:`autoshard.serving.simulate.deal`, as the simulator deals
them. A :class:`CallSchedule` is then one server's share: the requests a main replica takes,
or the calls a shard replica answers. Nothing here depends on the rate: a request arrives
``cumsum(gaps)[i] / qps`` seconds into the stream at any rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.model import ServingModel
from autoshard.serving.parts import PartSet
from autoshard.serving.simulate import RequestSample, deal, touched_parts
from autoshard.serving.task import ServingTask


@dataclass(frozen=True)
class RequestStream:
    """The lookups of a request sample (one *entry* per part a request touches).

    Args:
        gaps: (requests,) exponential(1) gaps; at ``qps`` request ``i`` arrives
            ``cumsum(gaps)[i] / qps`` seconds after the stream starts.
        entry_start: (requests + 1,) request ``i`` makes entries
            ``entry_start[i]:entry_start[i + 1]``.
        part: (entries,) the part each entry looks up.
        bags: (entries,) pooled results each entry returns (the request's items for a per-item
            part, else 1), of equal numbers of ids.
        id_start: (entries + 1,) entry ``e`` looks up ``ids[id_start[e]:id_start[e + 1]]``.
        ids: Row ids, each below its part's rows held.
    """

    gaps: np.ndarray
    entry_start: np.ndarray
    part: np.ndarray
    bags: np.ndarray
    id_start: np.ndarray
    ids: np.ndarray

    @property
    def requests(self) -> int:
        return int(self.gaps.size)

    @property
    def entry_request(self) -> np.ndarray:
        """(entries,) the request of each entry."""
        return np.repeat(np.arange(self.requests), np.diff(self.entry_start))

    def arrivals_us(self, qps: float) -> np.ndarray:
        """(requests,) arrival of each request at ``qps``, microseconds into the stream."""
        return np.cumsum(self.gaps) * (1e6 / qps)

    def save(self, path: Path) -> None:
        np.savez(path, gaps=self.gaps, entry_start=self.entry_start, part=self.part,
                 bags=self.bags, id_start=self.id_start, ids=self.ids)

    @classmethod
    def load(cls, path: Path) -> RequestStream:
        with np.load(path) as f:
            return cls(f["gaps"], f["entry_start"], f["part"], f["bags"], f["id_start"],
                       f["ids"])

    def call_arrays(self, entries: np.ndarray
                    ) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
        """What a call carrying ``entries`` looks up: (parts, ids of each, bag offsets of
        each), as ``torch.nn.EmbeddingBag`` takes them."""
        parts, ids, offsets = [], [], []
        for e in entries:
            own = self.ids[self.id_start[e]:self.id_start[e + 1]]
            parts.append(int(self.part[e]))
            ids.append(own)
            offsets.append(np.arange(0, own.size, own.size // int(self.bags[e])))
        return parts, ids, offsets


def held_rows(model: ServingModel, parts: PartSet, max_rows: int) -> np.ndarray:
    """Rows each part holds when served here: its share of its table's rows, at most
    ``max_rows`` (at least 1)."""
    rows = np.array([model.tables[t].rows for t in parts.table], float)
    share = np.array(parts.hi) - np.array(parts.lo)
    return np.clip((rows * share).astype(np.int64), 1, max_rows)


def request_stream(task: ServingTask, parts: PartSet, sample: RequestSample, max_rows: int,
                   seed: int = 0) -> RequestStream:
    """The lookups of ``sample`` on ``parts``: the parts each request touches, as many ids as
    the model looks up in each (one bag per item of a per-item part, the sample's items per
    request), drawn uniformly from the rows held (seeded by ``seed``)."""
    model = task.model
    costs = task.costs_for(parts)
    touched = touched_parts(sample, costs)
    req, part = np.nonzero(touched)
    _, lookups = parts.touch(model)
    mean_bags = np.where(costs.per_item, model.items, 1)
    per_bag = np.maximum(np.round(lookups / mean_bags), 1).astype(np.int64)
    items = np.maximum(np.round(model.items * sample.items), 1).astype(np.int64)
    bags = np.where(costs.per_item[part], items[req], 1)
    counts = bags * per_bag[part]
    id_start = np.r_[0, np.cumsum(counts)]
    rows = held_rows(model, parts, max_rows)
    rng = np.random.default_rng([seed, 7])
    ids = (rng.random(int(id_start[-1])) * np.repeat(rows[part], counts)).astype(np.int64)
    entry_start = np.r_[0, np.cumsum(np.bincount(req, minlength=sample.requests))]
    return RequestStream(sample.gaps.copy(), entry_start, part, bags, id_start, ids)


@dataclass(frozen=True)
class Server:
    """One server of a deployment: a main-tier replica (``shard`` is ``MAIN``) or a replica
    of a shard."""

    shard: int
    replica: int

    @property
    def name(self) -> str:
        if self.shard == MAIN:
            return f"main server {self.replica}"
        return f"shard {self.shard} replica {self.replica}"


@dataclass(frozen=True)
class Routing:
    """Where a deployment serves a stream.

    Args:
        main: (requests,) the main replica of each request.
        target: (entries,) who serves each entry: 0 its request's main server, in-line;
            ``1 + g`` the ``g``-th shard replica (shards in order, each one's replicas in
            order: :func:`shard_servers`).
        call_request: (calls,) the request making each remote call (one per request and
            shard replica it needs), by request, then target.
        call_target: (calls,) the shard replica (``1 + g``) each call goes to.
    """

    main: np.ndarray
    target: np.ndarray
    call_request: np.ndarray
    call_target: np.ndarray

    def save(self, path: Path) -> None:
        np.savez(path, main=self.main, target=self.target, call_request=self.call_request,
                 call_target=self.call_target)

    @classmethod
    def load(cls, path: Path) -> Routing:
        with np.load(path) as f:
            return cls(f["main"], f["target"], f["call_request"], f["call_target"])


def shard_servers(mapping: Mapping) -> list[Server]:
    """The shard replicas of ``mapping``, in target order (target ``1 + g`` is the ``g``-th)."""
    return [Server(s, r) for s, count in enumerate(mapping.replica_counts)
            for r in range(int(count))]


def route(stream: RequestStream, sample: RequestSample, mapping: Mapping) -> Routing:
    """The routing of ``stream`` (drawn from ``sample``) under ``mapping``, dealt as the
    simulator deals it."""
    main_rep, call_rep = deal(sample, mapping)
    req = stream.entry_request
    shard = mapping.array[stream.part]
    first = np.r_[0, np.cumsum(mapping.replica_counts)]  # first replica index of each shard
    remote = shard != MAIN
    target = np.zeros(req.size, dtype=np.int64)
    target[remote] = 1 + first[shard[remote]] + call_rep[req[remote], shard[remote]]
    pairs = np.unique(np.c_[req[remote], target[remote]], axis=0).reshape(-1, 2)
    return Routing(main_rep.astype(np.int64), target, pairs[:, 0], pairs[:, 1])


@dataclass(frozen=True)
class CallSchedule:
    """What one server receives: calls in order of the requests making them.

    Args:
        server: The server.
        request: (calls,) the request of each call (for a main replica: each request it
            takes).
        call: (calls,) each call's index among the routing's remote calls (-1 for a main
            replica, whose "calls" are requests).
        entry_start: (calls + 1,) call ``c`` carries ``entries[entry_start[c]:entry_start[c+1]]``.
        entries: Entries of the stream (their parts and ids); for a main replica, every entry
            of its requests, in-line and remote.
    """

    server: Server
    request: np.ndarray
    call: np.ndarray
    entry_start: np.ndarray
    entries: np.ndarray

    @property
    def calls(self) -> int:
        return int(self.request.size)

    def entries_of(self, c: int) -> np.ndarray:
        return self.entries[self.entry_start[c]:self.entry_start[c + 1]]


def shard_schedules(stream: RequestStream, routing: Routing,
                    mapping: Mapping) -> list[CallSchedule]:
    """Each shard replica's calls (in target order)."""
    req = stream.entry_request
    out = []
    for g, server in enumerate(shard_servers(mapping)):
        entries = np.flatnonzero(routing.target == 1 + g)  # by request: entries are
        calls = np.flatnonzero(routing.call_target == 1 + g)
        starts = np.searchsorted(req[entries], routing.call_request[calls])
        out.append(CallSchedule(server, routing.call_request[calls], calls,
                                np.r_[starts, entries.size], entries))
    return out


def main_schedules(stream: RequestStream, routing: Routing,
                   mapping: Mapping) -> list[CallSchedule]:
    """Each main replica's requests, with every entry they make."""
    out = []
    for r in range(mapping.main_replicas):
        requests = np.flatnonzero(routing.main == r)
        lo, hi = stream.entry_start[requests], stream.entry_start[requests + 1]
        entries = (np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)])
                   if requests.size else np.zeros(0, dtype=np.int64))
        out.append(CallSchedule(Server(MAIN, r), requests, np.full(requests.size, -1),
                                np.r_[0, np.cumsum(hi - lo)], entries))
    return out
