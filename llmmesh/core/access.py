"""Per-RPC authorization from the caller's mesh identity.

Each server has an :class:`AccessPolicy`: which roles may call each of its
methods. :mod:`llmmesh.core.grpcserver` checks it before a handler runs and
records the caller for the handler, so a servicer can narrow further by
what the request says (a region may heartbeat only for itself) with
:func:`require_caller`. On a plaintext server (``--insecure``) nobody has
an identity and every call is let through: that is what insecure means.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from llmmesh.core.errors import PermissionDenied, Reason, Unauthenticated
from llmmesh.core.identity import PlaneIdentity, Role


@dataclass(frozen=True)
class Caller:
    """Who is calling: ``secured`` when the server runs mTLS, and then the
    identity the peer's certificate names (None if it names none)."""

    secured: bool
    identity: PlaneIdentity | None


_UNSECURED = Caller(False, None)
_CALLER: ContextVar[Caller] = ContextVar("llmmesh_caller", default=_UNSECURED)


def current_caller() -> Caller:
    """The caller of the RPC this task serves (unsecured outside a secured server)."""
    return _CALLER.get()


def set_caller(caller: Caller) -> None:
    _CALLER.set(caller)


def _refuse(caller: Caller, what: str) -> PermissionDenied | Unauthenticated:
    if caller.identity is None:
        return Unauthenticated(
            Reason.PEER_UNAUTHENTICATED, f"{what} needs a mesh certificate naming an llmmesh identity"
        )
    return PermissionDenied(
        Reason.PEER_NOT_ALLOWED,
        f"{caller.identity} may not {what}",
        metadata={"peer": caller.identity.uri},
    )


def require_caller(
    roles: Collection[Role], what: str, *, zone: str | None = None, region: str | None = None
) -> PlaneIdentity | None:
    """The secured caller's identity if its role is one of ``roles`` (and,
    for zone-bound roles, it is of ``zone`` / ``region`` where given);
    PermissionDenied (or Unauthenticated) otherwise. None on a plaintext server."""
    caller = current_caller()
    if not caller.secured:
        return None
    ident = caller.identity
    if ident is None or ident.role not in roles:
        raise _refuse(caller, what)
    if ident.zone and zone is not None and ident.zone != zone:
        raise _refuse(caller, what)
    if ident.region and region is not None and ident.region != region:
        raise _refuse(caller, what)
    return ident


class AccessPolicy:
    """Which roles may call which method of one server.

    ``rules`` maps a method's short name (``Heartbeat``) to the roles let
    in; a method not named is refused to everyone (a new RPC is closed until
    it is given a rule). ``zone``/``region`` narrow zone-bound callers to
    this server's own zone (or region): an engine pod admits only the
    region that owns it.
    """

    def __init__(
        self,
        rules: Mapping[str, Collection[Role]],
        *,
        zone: str | None = None,
        region: str | None = None,
    ) -> None:
        self._rules = {name: frozenset(roles) for name, roles in rules.items()}
        self._zone = zone
        self._region = region

    def check(self, full_method: str, caller: Caller) -> None:
        """Raise PermissionDenied/Unauthenticated unless ``caller`` may call ``full_method``."""
        if not caller.secured:
            return
        name = full_method.rsplit("/", 1)[-1]
        roles = self._rules.get(name, frozenset())
        ident = caller.identity
        what = f"call {name}"
        if ident is None or ident.role not in roles:
            raise _refuse(caller, what)
        if ident.zone and self._zone is not None and ident.zone != self._zone:
            raise _refuse(caller, what)
        if ident.region and self._region is not None and ident.region != self._region:
            raise _refuse(caller, what)
