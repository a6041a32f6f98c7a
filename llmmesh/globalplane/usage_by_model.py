"""A tenant's usage in one month split by the model that served it and
what for (turns, or each kind of background work).

Summed from the usage records (the monthly totals are per tenant only),
exactly, as billing priced each record at its own model's price when it
was ingested: the split adds up to the tenant's totals.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from llmmesh.globalplane import schema
from llmmesh.globalplane.usage_ledger import UsageTotals, counts_request


def model_totals(
    conn: Connection, tenant_id: str, period: str, end_user: str = ""
) -> dict[tuple[str, str], UsageTotals]:
    """The tenant's totals of ``period`` by (model name, purpose), in that
    order (those of ``end_user`` only, when given)."""
    r = schema.usage_records
    query = r.select().with_only_columns(
        r.c.model, r.c.input_tokens, r.c.output_tokens, r.c.cost_usd, r.c.continues_request_id, r.c.purpose
    )
    query = query.where(r.c.tenant_id == tenant_id, r.c.period == period)
    if end_user:
        query = query.where(r.c.end_user == end_user)
    totals: dict[tuple[str, str], UsageTotals] = {}
    for row in conn.execute(query):
        # A continued turn's record adds tokens, not a request; so does background work.
        requests = 1 if counts_request(row.continues_request_id, row.purpose) else 0
        turn = UsageTotals(period, row.input_tokens, row.output_tokens, row.cost_usd, requests)
        key = (row.model, row.purpose)
        totals[key] = totals.get(key, UsageTotals(period)).plus(turn)
    return dict(sorted(totals.items()))
