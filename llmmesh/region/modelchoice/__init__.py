"""Which model serves a turn: the name asked for or, for ``auto``, the
cheapest model expected to do the job by the request's difficulty, with
fallbacks; what a tenant may use and what it costs; lookups kept warm."""
