"""``llmmesh admin region``: take a region out of the global plane's region
directory for good (``GeoRoutingService.RemoveRegion``).

An operator's call (the admin certificate), audited like every admin
change. A region still running comes back with its next heartbeat: stop
it first. ``llmmesh admin regions`` lists the directory.
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc.aio

from llmmesh.cli.admin_output import CALL_TIMEOUT_S, _as_dict
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import geo_routing_service_pb2_grpc


async def _remove(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
    removed = await stub.RemoveRegion(gpb.RemoveRegionRequest(region=args.region), timeout=CALL_TIMEOUT_S)
    report = removed.region.report
    if not args.json:
        print(f"removed region {report.region} (zone {report.zone}, {report.chat_address})")
    return _as_dict(removed.region)


def add_region_arguments(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add ``admin region ACTION`` to the admin ``groups`` (subparsers), each with ``common``'s flags."""
    actions = groups.add_parser("region", help="remove a region from the region directory").add_subparsers(
        dest="region_action", required=True, metavar="ACTION"
    )
    remove = actions.add_parser(
        "remove",
        parents=[common],
        help="forget a region for good (audited); a region still running reports itself back",
    )
    remove.add_argument("region", help="the region, like eu-west")
    remove.set_defaults(admin_command=_remove)
