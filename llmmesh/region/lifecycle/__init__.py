"""A region's housekeeping: turn records retried (and spooled) while the
zone store is down, summaries of long conversations, the model calls both
summaries and memory make, and the purge of deleted conversations."""
