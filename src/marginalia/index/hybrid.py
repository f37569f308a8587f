"""Ranked queries on the entries table (dense, BM25) and their reciprocal-rank fusion."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .schema import FTS_COLUMN, HIT_COLUMNS

RRF_K = 60
#: IVF-PQ search (once a vector index exists): partitions probed, and how many times the
#: candidates are re-ranked by exact distance (ignored by an exact scan)
NPROBES = 20
REFINE_FACTOR = 10


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Fuse rankings of ids by reciprocal rank (Cormack et al., 2009).

    Each id scores ``sum(1 / (k + rank))`` over the rankings it appears in, ranks
    counted from 1; only ranks matter, so scores on different scales (BM25, cosine)
    need no calibration, and a larger ``k`` weighs the top ranks less.

    Args:
        rankings: Lists of ids, best first; an id appears at most once per list.
        k: The smoothing constant (60 in the paper and in most engines).

    Returns:
        ``(id, score)`` pairs, best first; ties go to the id with the better single
        rank, then to the earlier ranking, so the order is deterministic.
    """
    if k < 0:
        raise ValueError("k must be >= 0")
    scores: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}
    for which, ranking in enumerate(rankings):
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
            if key not in best or (rank, which) < best[key]:
                best[key] = (rank, which)
    return sorted(scores.items(), key=lambda item: (-item[1], best[item[0]]))


def ranked(table: Any, how: str, query: str, qvec: np.ndarray | None, where: str, depth: int,
           keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Up to ``depth`` rows that ``keep`` accepts, best first, by ``how`` (``dense`` or ``bm25``).

    Rows ``keep`` refuses (orphans of a killed run) take places in LanceDB's top list, so
    when some were dropped from a full list the query runs again with a deeper limit. Each
    row gets ``_similarity``: the cosine of ``qvec`` and its vector (NaN without ``qvec``);
    the vector itself is dropped.
    """
    limit = depth
    while True:
        if how == "dense":
            q = table.search(qvec, vector_column_name="vector", query_type="vector")
            q = q.distance_type("cosine").nprobes(NPROBES).refine_factor(REFINE_FACTOR)
            q = q.select([*HIT_COLUMNS, "_distance"])
        else:
            from lancedb import query as lance_query

            # a match query: the text is tokenised like the index (no query syntax to trip on), terms OR-ed
            match = lance_query.MatchQuery(query, FTS_COLUMN)  # type: ignore[call-arg]
            q = table.search(match, query_type="fts").select([*HIT_COLUMNS, "_score"])
        raw = q.where(where, prefilter=True).limit(limit).to_arrow().to_pylist()
        rows = [r for r in raw if keep(r)]
        if len(rows) >= depth or len(raw) < limit:
            break
        limit *= 4
    for r in rows:
        vector = np.asarray(r.pop("vector"), dtype=np.float32)
        r["_similarity"] = float(vector @ qvec) if qvec is not None else math.nan
    return rows[:depth]
