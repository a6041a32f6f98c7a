"""Admitting a chat turn: the key's RPM/TPM limits (in process or in
Redis), the tenant's monthly quota, and a slot from the weighted fair queue."""
