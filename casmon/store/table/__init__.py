"""Tables: append-only multimaps from 16-byte keys to small values, shared by many writers.

The object index (digest -> where the object lives) and every kind of record
(calls, cache entries, runs) are tables. A table is a set of immutable files
under one prefix, written without locks:

``{prefix}l0/{name}``
    *Level-0 files.* Each flush of a writer adds one, named
    ``{time_ns:016x}-{writer}-{seq:06x}``: writers never touch each other's
    files, and a writer numbers its files 1, 2, 3, ... without gaps.
``{prefix}gens/{id}`` and ``{prefix}buckets/{id}/{i:04x}``
    *Generations.* When level-0 files accumulate, a writer merges them (and
    small older generations) into a generation: its entries split into
    ``2**k`` buckets by the key's leading bits (about 8,192 entries a bucket),
    then a manifest. The manifest is written last, so a visible manifest means a
    complete generation; what it merged is deleted after it.

A manifest records its *provenance* exactly: ``contains`` maps each writer to
the ranges of level-0 sequence numbers whose entries the generation holds,
through every generation it merged (``covers`` names the files it replaced
directly). Readers work from provenance, never from timing:

* a level-0 file that a listed generation contains is not read again;
* a generation whose provenance lies inside another active generation's is
  redundant (two writers merged the same files at once): it is not read, and
  the next merge deletes it;
* generations whose provenance overlaps only in part are read together, each
  entry once (a table is a set of ``(key, value)`` entries: an entry added
  twice is one entry), and the next merge takes them together, which ends the
  overlap;
* so ``items()`` yields every entry once and ``count()`` is exact.

A reader lists ``l0/`` first and ``gens/`` second: a merge writes its manifest
before it deletes, so a file missing from the first listing was merged into a
generation the second listing shows. If a file vanishes while it is read (merged
meanwhile), the reader lists again.

A damaged or missing file never stops a reader: ``refresh`` and lookups skip
it, remember it in :attr:`Table.damaged`, and warn once per process
(:class:`~casmon.errors.StoreDamageWarning`); merges leave it alone; ``items(strict=True)``
(the default) raises instead of returning an incomplete table, because gc must
never judge reachability from part of the records. ``casmon verify --repair``
(:mod:`casmon.maintenance.salvage`) rebuilds a damaged table from every readable file
(:meth:`Table.survey`, :meth:`Table.rewrite`).

One module a job: ``format`` (table files and generations as bytes, parsed), ``encode`` (a generation's
files as bytes, written: loaded by writers and merges), ``ranges``
(provenance arithmetic), ``plan`` (what a reader reads), ``table``
(:class:`Table`: adding and looking up), ``whole`` (a table read whole: items, count, gaps), ``batches`` (sealed
batches changed: rare), ``merge`` (merges and generation writes, loaded by the first), ``survey``
(:class:`Survey` and the rewrite, for verify and repair), ``fence`` (record files that land
late are not records; ``fence_gc`` publishes, checks and supersedes fences), ``lookaside`` (a manifest's
lookaside copy written: a fresh reader reads a few checked chunks of it, :data:`.format.LOOKASIDE`). A lookup loads
none of ``whole``, ``batches``, ``encode``, ``merge``, ``survey``, ``fence_gc`` or ``lookaside``.
"""

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.store.table.format import BLOCK_ENTRIES, Generation, TableFile, encode_table_file, parse_generation
from casmon.store.table.table import L0_MERGE, LateWrite, Table, writer_id

__all__ = ["BLOCK_ENTRIES", "Columns", "Generation", "L0_MERGE", "LateWrite", "Survey", "Table", "TableFile", "encode_table_file",
           "parse_generation", "split_bucket", "writer_id"]


def __getattr__(name: str) -> object:
    if name in ("Survey", "split_bucket"):  # verify and repair load them; readers and writers never do
        from casmon.store.table import survey

        return getattr(survey, name)
    if name == "Columns":  # writers and merges load it; readers never do
        from casmon.store.table.encode import Columns

        return Columns
    raise AttributeError(f"module 'casmon.store.table' has no attribute {name!r}")


if TYPE_CHECKING:  # what type checkers see: the names loaded on first use, imported for real
    from casmon.store.table.encode import Columns
    from casmon.store.table.survey import Survey, split_bucket
