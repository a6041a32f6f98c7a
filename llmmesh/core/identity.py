"""Who a plane is: its role, and for zone-bound planes its zone and region.

An identity is carried in a plane's certificate as a SPIFFE-style URI SAN,
``spiffe://llmmesh/ROLE/ZONE/REGION/NAME`` (``-`` where a part does not
apply), and as DNS SANs that a dialling peer can expect by name:
``ROLE.llmmesh``, and for zone-bound roles ``ZONE.ROLE.llmmesh`` and
``REGION.ZONE.ROLE.llmmesh``. Checking the DNS name a server presents is
how a client knows it reached, say, an engine pod of its own region and not
any holder of a mesh certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmmesh.core.ids import is_valid_name

TRUST_DOMAIN = "llmmesh"
_SCHEME = "spiffe://"
_ABSENT = "-"


class Role(StrEnum):
    """What a certificate's holder may act as."""

    GLOBAL = "global"
    REGION = "region"
    ENGINE = "engine"
    EDGE = "edge"
    ADMIN = "admin"
    CLIENT = "client"


# Roles whose identity names a zone and a region.
ZONE_BOUND = frozenset({Role.REGION, Role.ENGINE})


class IdentityError(ValueError):
    """A malformed identity or identity URI."""


@dataclass(frozen=True)
class PlaneIdentity:
    """One certificate holder: ``role``, a ``name`` unique within the role,
    and ``zone``/``region`` for region and engine identities."""

    role: Role
    name: str
    zone: str = ""
    region: str = ""

    def __post_init__(self) -> None:
        for part, value in (("name", self.name), ("zone", self.zone), ("region", self.region)):
            if value and not is_valid_name(value):
                raise IdentityError(f"invalid {part} {value!r} in an identity")
        if not self.name:
            raise IdentityError("an identity needs a name")
        if (self.role in ZONE_BOUND) != bool(self.zone and self.region):
            raise IdentityError(f"a {self.role} identity names a zone and a region; other roles name neither")

    @property
    def uri(self) -> str:
        parts = (self.role.value, self.zone or _ABSENT, self.region or _ABSENT, self.name)
        return f"{_SCHEME}{TRUST_DOMAIN}/" + "/".join(parts)

    @property
    def dns_names(self) -> list[str]:
        """The names a server with this identity answers to (see the module docstring)."""
        names = [role_name(self.role)]
        if self.role in ZONE_BOUND:
            names += [role_name(self.role, self.zone), role_name(self.role, self.zone, self.region)]
        return names

    @classmethod
    def parse(cls, uri: str) -> PlaneIdentity:
        """The identity a URI SAN names; IdentityError for anything else."""
        prefix = f"{_SCHEME}{TRUST_DOMAIN}/"
        if not uri.startswith(prefix):
            raise IdentityError(f"not an identity of this mesh: {uri!r}")
        parts = uri[len(prefix) :].split("/")
        if len(parts) != 4:
            raise IdentityError(f"an identity URI has four parts: {uri!r}")
        role_text, zone, region, name = parts
        try:
            role = Role(role_text)
        except ValueError as exc:
            raise IdentityError(f"unknown role {role_text!r} in {uri!r}") from exc
        return cls(role, name, "" if zone == _ABSENT else zone, "" if region == _ABSENT else region)

    def __str__(self) -> str:
        where = f" {self.region} ({self.zone})" if self.zone else ""
        return f"{self.role}{where} {self.name}"


def role_name(role: Role, zone: str = "", region: str = "") -> str:
    """The DNS name a client expects of a server of ``role`` (narrowed to a
    zone, or a zone's region, where given)."""
    labels = [label for label in (region, zone) if label]
    return ".".join([*labels, role.value, TRUST_DOMAIN])
