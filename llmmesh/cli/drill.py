"""``llmmesh drill failover``: disrupt one part of a running mesh under steady
streaming traffic, restore it, and report what the clients saw.

The mesh is the one ``$LLMMESH_HOME/mesh.json`` describes (``llmmesh up``),
or a deployed one named by ``--edge-url``, ``--api-key`` and
``--global-address`` (disrupted by ``--disrupt-command``). The drill's gRPC
calls present the admin certificate (``--certs-dir``, else mesh.json's,
else ``$LLMMESH_HOME/certs``), or go plaintext with ``--insecure``.
``--kind cert-rotation`` re-issues every certificate of that directory
``--rotations`` times under the traffic, and checks that the planes serve
the new ones; ``--kind ca-rotation`` rotates the mesh CA under the
traffic (a new CA trusted beside the old, every certificate re-issued from
it, the old CA retired, ``--rotate-every-s`` apart; the CA's key from
``--ca-dir``, else ``ca`` beside the certificates) and checks that the
planes serve the new certificates and refuse the old CA's;
``--kind partition-global`` cuts a region off from the global plane alone
(a mesh of ``llmmesh up --netns``) and checks that it keeps serving its
zone. ``--kind engine-pod`` is the former name of ``--kind pod``.
Progress goes to stderr while it runs; the report goes to stdout, one JSON object on the
last line with ``--json`` (:mod:`llmmesh.drill.report` defines every
field), else one ``name: value`` line each. Exit status 0 when the drill
ran (what it found is reported, not fatal), 1 when it could not (the mesh
did not answer, a disruption failed), 2 for a drill that cannot run as
asked, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from llmmesh.cli.tls_flags import add_tls_arguments
from llmmesh.core.home import mesh_home
from llmmesh.drill.plan import KINDS, MODES, DrillPlan, canonical_kind

DRILLS = ("failover",)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value


def add_drill_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DrillPlan()
    parser.add_argument("drill", choices=DRILLS, help="what to drill")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--kind",
        type=canonical_kind,
        choices=KINDS,
        default=defaults.kind,
        help="what to disrupt: a region, one of its engine pods, the global plane, the mesh's Redis, "
        "every certificate, the mesh CA, or a region's link to the global plane alone (default region)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="kill: SIGKILL, restored by llmmesh up's restart; partition: SIGSTOP, then SIGCONT; "
        "rotate: the only mode of --kind cert-rotation and ca-rotation; link-down: the host's network "
        "link down, then up (kinds region and global-plane of a mesh of llmmesh up --netns); "
        "--kind partition-global goes with partition only: the packets between the region's host and "
        "the global plane's dropped "
        "(default: kill, partition for --kind global-plane so --outage-s holds and for partition-global)",
    )
    parser.add_argument(
        "--region",
        default="",
        help="region to disrupt, or whose pod to (default: the one running most of the traffic's turns then)",
    )
    parser.add_argument(
        "--pod", default="", help="pod to disrupt with --kind pod (default: the region's first)"
    )
    parser.add_argument(
        "--streams", type=_positive, default=defaults.streams, help="concurrent SSE streams (32)"
    )
    parser.add_argument(
        "--max-tokens", type=_positive, default=defaults.max_tokens, help="tokens of every turn (128)"
    )
    seconds = (
        ("--disrupt-after-s", defaults.disrupt_after_s, "steady traffic before the disruption"),
        ("--restore-after-s", defaults.restore_after_s, "how long a partition lasts"),
        ("--outage-s", defaults.outage_s, "how long a global-plane partition lasts"),
        ("--duration-s", defaults.duration_s, "traffic after the restore"),
        ("--turn-timeout-s", defaults.turn_timeout_s, "longest a turn may take before it counts as lost"),
        ("--restore-timeout-s", defaults.restore_timeout_s, "longest wait for a restart, and for the return"),
        ("--usage-wait-s", defaults.usage_wait_s, "longest wait for billing to catch up"),
        (
            "--rotate-every-s",
            defaults.rotate_every_s,
            "time between certificate rotations, or CA rotation steps",
        ),
    )
    for flag, default, text in seconds:
        parser.add_argument(flag, type=_seconds, default=default, help=f"{text} ({default:g})")
    parser.add_argument(
        "--rotations",
        type=_positive,
        default=defaults.rotations,
        help=f"rounds of certificate rotation of --kind cert-rotation ({defaults.rotations})",
    )
    parser.add_argument("--edge-url", default=None, help="edge of a deployed mesh (default: from mesh.json)")
    parser.add_argument("--api-key", default=None, help="key of the traffic's tenant (default: mesh.json's)")
    parser.add_argument(
        "--global-address", default=None, help="global plane host:port (default: from mesh.json)"
    )
    parser.add_argument(
        "--disrupt-command", default="", help="shell command that disrupts a deployed mesh's part"
    )
    parser.add_argument("--restore-command", default="", help="shell command that restores it")
    add_tls_arguments(parser)
    parser.add_argument(
        "--ca-dir", default="", help="the mesh CA's key and certificate (default: ca beside the certificates)"
    )


def plan_from_args(args: argparse.Namespace) -> DrillPlan:
    """The plan the flags ask for; ValueError for an impossible one."""
    defaults = {
        "global-plane": "partition",
        "cert-rotation": "rotate",
        "ca-rotation": "rotate",
        "partition-global": "partition",
    }
    mode = args.mode or defaults.get(args.kind, "kill")
    return DrillPlan(
        kind=args.kind,
        mode=mode,
        region=args.region,
        pod=args.pod,
        streams=args.streams,
        max_tokens=args.max_tokens,
        disrupt_after_s=args.disrupt_after_s,
        restore_after_s=args.restore_after_s,
        outage_s=args.outage_s,
        duration_s=args.duration_s,
        turn_timeout_s=max(args.turn_timeout_s, 1.0),
        restore_timeout_s=max(args.restore_timeout_s, 1.0),
        usage_wait_s=args.usage_wait_s,
        rotations=args.rotations,
        rotate_every_s=args.rotate_every_s,
    )


def _progress(line: str) -> None:
    print(f"llmmesh drill: {line}", file=sys.stderr, flush=True)


def _table(report: dict[str, object]) -> str:
    lines = []
    for name, value in report.items():
        shown = value if isinstance(value, str) else json.dumps(value)
        lines.append(f"{name}: {shown}")
    return "\n".join(lines)


def run_drill_command(args: argparse.Namespace) -> int:
    """Run the drill ``args`` ask for; see the module docstring for the exit status."""
    from llmmesh.drill.ca_rotation import CaSteps
    from llmmesh.drill.disruption import DisruptionError
    from llmmesh.drill.runner import run_drill
    from llmmesh.drill.setup import DrillInputError
    from llmmesh.drill.target import TargetError, read_target
    from llmmesh.topology.mesh_certs import ca_dir, retire_old_cas, rotate_all, trust_new_ca

    # The progress lines say what happens; a reloaded certificate is the drill's own doing.
    for name in ("httpx", "httpcore", "llmmesh.core.mtls"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        plan = plan_from_args(args)
        target = read_target(
            mesh_home() / "mesh.json",
            edge_url=args.edge_url,
            api_key=args.api_key,
            global_address=args.global_address,
            insecure=args.insecure,
            certs_dir=args.certs_dir,
        )
    except (ValueError, TargetError) as err:
        _progress(str(err))
        return 2
    if args.restore_command and not args.disrupt_command:
        _progress("--restore-command needs --disrupt-command")
        return 2
    keys = ca_dir(args.ca_dir, target.tls.directory) if target.tls.directory else None
    steps = (
        CaSteps(
            keys,
            lambda d: trust_new_ca(d, keys),
            lambda d: rotate_all(d, keys),
            lambda d: retire_old_cas(d, keys),
        )
        if keys is not None
        else None
    )
    try:
        report = asyncio.run(
            run_drill(
                plan,
                target,
                _progress,
                disrupt_command=args.disrupt_command,
                restore_command=args.restore_command,
                rotate=(lambda d: rotate_all(d, keys)),
                ca_steps=steps,
            )
        )
    except DrillInputError as err:
        _progress(str(err))
        return 2
    except (TargetError, DisruptionError, OSError) as err:
        _progress(str(err))
        return 1
    print(json.dumps(report, separators=(",", ":")) if args.json else _table(report), flush=True)
    return 0
