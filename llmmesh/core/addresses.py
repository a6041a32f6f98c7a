"""Bind and advertised addresses of a plane.

A plane binds ``host:port`` and tells others where to dial it: the
advertised address. By default that is the bound address, but a wildcard
bind (``0.0.0.0``, ``::``) names no host another machine can dial, so a
plane bound to one refuses to start unless it is given an advertised
address (``--advertise-address HOST:PORT``, or ``HOST`` alone to
advertise the port it bound, which suits a port picked at start).
"""

from __future__ import annotations

import ipaddress

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
"""Hosts that bind every interface and are no address to dial."""


class AddressError(ValueError):
    """An address that is not ``host:port``, or a wildcard that would be advertised."""


def split_host_port(text: str, what: str = "address") -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as its parts; AddressError otherwise.

    ``what`` names the setting in the error message.
    """
    raw = text.strip()
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{what} must be host:port, got {text!r}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise AddressError(f"{what} must be host:port or [ipv6]:port, got {text!r}")
        _check_ipv6(host[1:-1], what, text)
        host = host[1:-1]
    elif ":" in host:
        raise AddressError(f"{what}: write an IPv6 host in brackets, [{host}]:{port_text}, got {text!r}")
    elif not _valid_host_name(host):
        raise AddressError(f"{what} has an invalid host {host!r}, in {text!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"{what} must end in a port from 1 to 65535, got {text!r}")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (and so names none to dial)."""
    return host.strip() in WILDCARD_HOSTS


def _advertised_parts(text: str, plane: str) -> tuple[str, int | None]:
    """``HOST:PORT`` or ``HOST`` (port None) of an advertised address; never a wildcard host."""
    what = f"{plane}'s advertise_address"
    raw = text.strip()
    port: int | None = None
    if raw.startswith("[") and raw.endswith("]"):
        host = raw[1:-1]
        _check_ipv6(host, what, text)
    elif ":" not in raw:
        host = raw
        if not _valid_host_name(host):
            raise AddressError(f"{what} must be host:port or host, got {text!r}")
    else:
        host, port = split_host_port(raw, what)
    if is_wildcard(host):
        raise AddressError(f"{what} must name a host others can dial, not {host or 'nothing'!r}")
    return host, port


def check_advertisable(host: str, advertise_address: str, plane: str) -> None:
    """Refuse, before binding, what :func:`advertised_address` would refuse after."""
    if advertise_address:
        _advertised_parts(advertise_address, plane)
    elif is_wildcard(host):
        raise AddressError(
            f"{plane} binds {host or 'every interface'!r}, which no other host can dial: "
            "give the address others reach it at with --advertise-address HOST:PORT "
            "(env LLMMESH_ADVERTISE_ADDRESS)"
        )


def advertised_address(bound: str, advertise_address: str, plane: str) -> str:
    """What ``plane`` tells others to dial: ``advertise_address`` when set (with
    the bound port when it names a host only), else ``bound``.

    AddressError for a malformed address, and for a wildcard bound host
    without an advertised address.
    """
    bound_host, _, bound_port = bound.strip().rpartition(":")
    if advertise_address:
        host, port = _advertised_parts(advertise_address, plane)
        return join_host_port(host, port if port is not None else int(bound_port))
    check_advertisable(bound_host.strip("[]"), "", plane)
    host, port = split_host_port(bound, f"{plane}'s bound address")
    return join_host_port(host, port)


def advertised_url(bound_url: str, advertised: str) -> str:
    """The URL others reach an HTTP endpoint (``/metrics``) at that binds beside
    a server advertising ``advertised``: that host, the endpoint's own port."""
    scheme, _, rest = bound_url.partition("://")
    where, slash, path = rest.partition("/")
    port = int(where.rpartition(":")[2])
    host, _ = split_host_port(advertised)
    return f"{scheme}://{join_host_port(host, port)}{slash}{path}"


def _check_ipv6(host: str, what: str, text: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise AddressError(f"{what} has an invalid IPv6 host {host!r}, in {text!r}") from None


def _valid_host_name(host: str) -> bool:
    if host in WILDCARD_HOSTS:
        return True
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isalnum() or c == "-" for c in label)
        for label in labels
    )
