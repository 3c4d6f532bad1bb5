"""Column names and file names of the prepared data: the one place they are spelled.

Canonical events: ``user_id``, ``item_id`` (raw ids, integer or string as in the source),
``timestamp`` (int64 seconds since epoch, UTC), optional ``event_type`` (str), ``value`` (float32).
Sequences: ``user_id``, ``item_idx`` list<int32> (1-based; 0 is padding), ``timestamp``
list<int64>, ``length`` int32. Items: ``item_idx`` int32, ``item_id`` (raw), ``count`` int64.
Rankings: ``user_id``, ``rank`` int32 (1 = best), ``item_id``, ``score`` float32.
"""

USER_ID = "user_id"
ITEM_ID = "item_id"
TIMESTAMP = "timestamp"
EVENT_TYPE = "event_type"
VALUE = "value"
ITEM_IDX = "item_idx"
LENGTH = "length"
COUNT = "count"
RANK = "rank"
SCORE = "score"
REJECT_REASON = "reject_reason"
TIME_GAPS = "time_gaps"  # list<int32> gap buckets beside item_idx (recsys_alibi.data.time_gaps)
SOURCE_ROW = "source_row"  # position in the source, keeps ties in source order
SUBSECOND = "_subsecond"  # internal: ns within the second of an event, until prepare has sorted and de-duplicated

PADDING_IDX = 0

# files inside a prepared/ directory
EVENTS_FILE = "events.parquet"
REJECTS_FILE = "rejects.parquet"
ITEMS_FILE = "items.parquet"
SEQUENCES_FILE = "sequences.parquet"
STATS_FILE = "stats.json"
CLEANED_FILE = "cleaned.parquet"  # cleaned events of every input before the k-core, what an append merges into
MANIFEST_FILE = "manifest.json"  # written last by prepare: its id, files, data fingerprint (recsys_alibi.data.prepared)
