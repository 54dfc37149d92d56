"""A local BM25 index over passages with tantivy, and the FlashRAG / Search-R1 corpus reader.

Passages have a title and a text. Both are indexed (English stemming tokenizer); a query matches
either, with the title boosted so an entity's own page ranks above pages that merely mention it.
Queries go through tantivy's *lenient* parser, which turns what it cannot parse (unbalanced quotes
or brackets, dangling operators, unknown fields) into best-effort sub-queries instead of raising;
whatever still fails comes back as an error observation, never an exception (model-written queries
are arbitrary text).

Corpus format (FlashRAG / Search-R1 JSONL): one object a line, ``{"id": ..., "contents": "Title\\ntext"}``
(the first line of ``contents`` is the title), or ``{"id": ..., "title": ..., "text": ...}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_QUERY_CHARS = 512
"""Longer queries are cut here (a runaway query is still a query)."""
TITLE_BOOST = 2.0


@dataclass(frozen=True)
class Passage:
    """One retrievable passage."""

    doc_id: str
    title: str
    text: str

    def render(self) -> str:
        """How a search result shows the passage to the agent."""
        if not self.title or self.text.startswith(
            self.title
        ):  # no need to repeat a title the text begins with
            return self.text
        return f"{self.title}: {self.text}"


CORPUS_FORMAT = 'one {"id": ..., "contents": "Title\\ntext"} a line'


def read_corpus(path: str | Path, limit: int | None = None) -> list[Passage]:
    """Passages of a FlashRAG / Search-R1 JSONL corpus (``contents`` = "Title\\ntext", or title/text fields);
    the first ``limit`` only when given (a quick check of a large corpus).

    Raises:
        FileNotFoundError: the corpus file does not exist.
        DataFileError: the file is empty or not JSON Lines, or a record has neither a text ``contents`` nor a text
            ``text`` (the message names the file and the line).
    """
    from tracerl.envs.files import DataFileError, describe_fields, read_records

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"search corpus not found: {path}; set env.search.corpus to a FlashRAG/Search-R1 JSONL file ({CORPUS_FORMAT})"
        )
    out = []
    for i, (where, row) in enumerate(read_records(path, "jsonl", "search corpus", CORPUS_FORMAT, limit)):
        field = "contents" if row.get("contents") is not None else "text"
        if not isinstance(row.get(field), str):
            got = "no 'contents' or 'text' field" if row.get(field) is None else f"'{field}' is not text"
            raise DataFileError(
                f"{path} {where}: {got} (have: {describe_fields(row)}); "
                f"a corpus passage needs a 'contents' (\"Title\\ntext\") or a 'text' field"
            )
        if field == "contents":
            title, _, text = row["contents"].partition("\n")
            title, text = title.strip().strip('"'), text.strip()
        else:
            title, text = str(row.get("title") or "").strip(), row["text"].strip()
        out.append(Passage(str(row.get("id", i)), title, text))
    return out


_SPACES = re.compile(r"\s+")


class BM25Retriever:
    """BM25 over an in-memory tantivy index; ``search`` never raises on query text."""

    def __init__(self, passages: Iterable[Passage], heap_bytes: int = 64_000_000) -> None:
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("title", stored=False, tokenizer_name="en_stem")
        sb.add_text_field("body", stored=False, tokenizer_name="en_stem")
        sb.add_unsigned_field("row", stored=True, indexed=False)
        self._index = tantivy.Index(sb.build())
        self.passages: list[Passage] = []
        writer = self._index.writer(heap_size=heap_bytes, num_threads=1)
        for p in passages:
            writer.add_document(tantivy.Document(title=p.title, body=p.text, row=len(self.passages)))
            self.passages.append(p)
        writer.commit()
        writer.wait_merging_threads()
        self._index.reload()
        self._searcher = self._index.searcher()

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int) -> list[Passage]:
        """The top ``k`` passages for ``query`` (best first; empty for a query with no usable terms).

        Raises:
            ValueError: only if tantivy rejects the query even leniently (callers turn it into an observation).
        """
        query = _SPACES.sub(" ", query[:MAX_QUERY_CHARS]).strip()
        if not query:
            return []
        parsed, _errors = self._index.parse_query_lenient(
            query, ["title", "body"], field_boosts={"title": TITLE_BOOST}
        )
        hits = self._searcher.search(parsed, k).hits
        return [self.passages[int(self._searcher.doc(addr)["row"][0])] for _score, addr in hits]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """``search`` for each query (one round trip when served by a shared actor)."""
        return [self.search(q, k) for q in queries]
