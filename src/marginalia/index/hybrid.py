"""Ranked queries on the entries table: dense, BM25, and LanceDB's hybrid query fused by reciprocal rank."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .schema import FTS_COLUMN, HIT_COLUMNS

#: reciprocal rank fusion's smoothing constant (60 in Cormack et al., 2009, and in LanceDB's RRFReranker)
RRF_K = 60
#: IVF-PQ search (once a vector index exists): partitions probed, and how many times the
#: candidates are re-ranked by exact distance (ignored by an exact scan)
NPROBES = 20
REFINE_FACTOR = 10


def _match(query: str) -> Any:
    from lancedb import query as lance_query

    # a match query: the text is tokenised like the index (no query syntax to trip on), terms OR-ed
    return lance_query.MatchQuery(query, FTS_COLUMN)  # type: ignore[call-arg]


def ranked(table: Any, how: str, query: str, qvec: np.ndarray | None, where: str, limit: int) -> Any:
    """Up to ``limit`` rows that pass the ``where`` prefilter, best first, as an Arrow table.

    Args:
        table: The LanceDB entries table.
        how: ``dense`` (cosine; column ``_distance``), ``bm25`` (LanceDB's full-text index;
            column ``_score``) or ``hybrid`` (both, each ``limit`` deep, fused by LanceDB's
            ``RRFReranker``; column ``_relevance_score``, the sum of ``1 / (RRF_K + rank)``
            over the two rankings, ranks from 1).
        query: The query text (BM25 and hybrid).
        qvec: The query's unit vector (dense and hybrid; None for BM25 without an embedder).
        where: A SQL filter applied before ranking, so rows it refuses take no rank.
        limit: How many rows.

    Rows come with their ``vector`` column whenever ``qvec`` is given (see :func:`similarities`).
    In hybrid, rows of equal fused score keep the order of the dense ranking, then of the BM25 one.
    """
    if how == "dense":
        q = table.search(qvec, vector_column_name="vector", query_type="vector")
        q = q.distance_type("cosine").nprobes(NPROBES).refine_factor(REFINE_FACTOR).select([*HIT_COLUMNS, "_distance"])
    elif how == "bm25":
        columns = HIT_COLUMNS if qvec is not None else [c for c in HIT_COLUMNS if c != "vector"]
        q = table.search(_match(query), query_type="fts").select([*columns, "_score"])
    else:
        from lancedb.rerankers import RRFReranker

        q = table.search(query_type="hybrid", vector_column_name="vector", fts_columns=FTS_COLUMN)
        q = q.vector(qvec).text(_match(query)).distance_type("cosine").nprobes(NPROBES).refine_factor(REFINE_FACTOR)
        # no select(): LanceDB warns on every hybrid query whose columns leave out _distance and _score,
        # and refuses them in the list (each leg lacks the other's)
        q = q.rerank(RRFReranker(K=RRF_K))
    return q.where(where, prefilter=True).limit(limit).to_arrow()


def similarities(rows: Any, qvec: np.ndarray | None) -> list[float]:
    """The cosine of ``qvec`` and each row's (unit) vector; NaN for every row without ``qvec``."""
    if qvec is None or rows.num_rows == 0:
        return [math.nan] * rows.num_rows
    column = rows["vector"].combine_chunks()
    vectors = column.flatten().to_numpy(zero_copy_only=False).reshape(rows.num_rows, column.type.list_size)
    return [float(s) for s in vectors @ np.asarray(qvec, dtype=np.float32)]
