"""``llmmesh``: run the embedded mesh or one plane."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from llmmesh.core import config
from llmmesh.core.errors import MeshError
from llmmesh.core.json_logs import LOG_LEVELS, LogSettings, configure_logging
from llmmesh.core.lifecycle import run_event_loop
from llmmesh.core.tracing import TracingSettings, configure_tracing

# The log level a process takes when no --log-level is given (how up passes its own on).
_LOG_LEVEL_VARIABLE = config.ENV_PREFIX + "LOG_LEVEL"


def _log_level(value: str) -> str:
    """A --log-level / LLMMESH_LOG_LEVEL value, lower-cased; refused when unknown."""
    if value.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown log level {value!r}; one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def _setup_logging(name: str, args: argparse.Namespace) -> None:
    """Logs (text or JSON lines) and traces (when a collector is configured) of this process."""
    configure_logging(name, args.log_level, config.load(LogSettings, args).log_format)
    configure_tracing(f"llmmesh-{name}", config.load(TracingSettings, args))


def _run_plane(name: str, coro: Callable[[], Coroutine[Any, Any, None]]) -> int:
    try:
        run_event_loop(coro())
    except MeshError as err:
        print(f"llmmesh {name}: {err.message}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"llmmesh {name}: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_global(args: argparse.Namespace) -> int:
    from llmmesh.globalplane.server import serve
    from llmmesh.globalplane.settings import GlobalSettings

    return _run_plane("global", lambda: serve(config.load(GlobalSettings, args)))


def _cmd_engine(args: argparse.Namespace) -> int:
    from llmmesh.engine.server import serve
    from llmmesh.engine.settings import EngineSettings

    return _run_plane("engine", lambda: serve(config.load(EngineSettings, args)))


def _cmd_region(args: argparse.Namespace) -> int:
    from llmmesh.region.server import serve
    from llmmesh.region.settings import RegionSettings

    return _run_plane("region", lambda: serve(config.load(RegionSettings, args)))


def _cmd_edge(args: argparse.Namespace) -> int:
    from llmmesh.edge.server import serve
    from llmmesh.edge.settings import EdgeSettings

    return _run_plane("edge", lambda: serve(config.load(EdgeSettings, args)))


def _cmd_up(args: argparse.Namespace) -> int:
    from llmmesh.cli.up import run_up

    _pass_log_and_trace_flags_on(args)
    return run_up(args)


def _pass_log_and_trace_flags_on(args: argparse.Namespace) -> None:
    """``llmmesh --log-level debug --log-format json --otlp-endpoint URL up``: the planes ``up``
    starts inherit its environment, not its flags, so the flags go there
    (otherwise every plane would log text and trace nothing, unannounced)."""
    for settings in (LogSettings, TracingSettings):
        for field in dataclasses.fields(settings):
            value = getattr(args, field.name, None)
            if value is not None:
                os.environ[config.ENV_PREFIX + field.name.upper()] = str(value)
    # Not a settings field: the planes' --log-level defaults to this variable.
    if args.log_level != os.environ.get(_LOG_LEVEL_VARIABLE, "info"):
        os.environ[_LOG_LEVEL_VARIABLE] = args.log_level


def _cmd_admin(args: argparse.Namespace) -> int:
    from llmmesh.cli.admin import run_admin

    return run_admin(args)


def _cmd_model(args: argparse.Namespace) -> int:
    from llmmesh.cli.model import run_model

    return run_model(args)


def _cmd_chat(args: argparse.Namespace) -> int:
    from llmmesh.cli.chat import run_chat

    return run_chat(args)


def _cmd_certs(args: argparse.Namespace) -> int:
    from llmmesh.cli.certs import run_certs

    return run_certs(args)


def _cmd_db(args: argparse.Namespace) -> int:
    from llmmesh.cli.db import run_db

    return run_db(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from llmmesh.cli.bench import run_bench

    return run_bench(args)


def _cmd_drill(args: argparse.Namespace) -> int:
    from llmmesh.cli.drill import run_drill_command

    return run_drill_command(args)


def build_parser() -> argparse.ArgumentParser:
    from llmmesh.cli.admin import add_admin_arguments
    from llmmesh.cli.bench import add_bench_arguments
    from llmmesh.cli.certs import add_certs_arguments
    from llmmesh.cli.chat import add_chat_arguments
    from llmmesh.cli.db import add_db_arguments
    from llmmesh.cli.drill import add_drill_arguments
    from llmmesh.cli.model import add_model_arguments
    from llmmesh.cli.up import add_up_arguments
    from llmmesh.edge.settings import EdgeSettings
    from llmmesh.engine.settings import EngineSettings
    from llmmesh.globalplane.settings import GlobalSettings
    from llmmesh.region.settings import RegionSettings

    parser = argparse.ArgumentParser(
        prog="llmmesh", description="A gRPC-native, multi-region LLM serving mesh."
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get(_LOG_LEVEL_VARIABLE) or "info",
        # type also checks the default (from the environment); choices only a typed value.
        type=_log_level,
        choices=LOG_LEVELS,
        help=f"debug, info, warning or error (environment: {_LOG_LEVEL_VARIABLE}; default info)",
    )
    config.add_arguments(parser, LogSettings)
    config.add_arguments(parser, TracingSettings)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up", help="run the embedded mesh: global plane, regions in zones, their engine pods and the edge"
    )
    add_up_arguments(up)
    up.set_defaults(func=_cmd_up)

    admin = sub.add_parser("admin", help="administer tenants, API keys, usage and regions over gRPC")
    add_admin_arguments(admin)
    admin.set_defaults(func=_cmd_admin)

    chat = sub.add_parser(
        "chat", help="chat in the terminal, replies streamed token by token over gRPC or HTTP"
    )
    add_chat_arguments(chat)
    chat.set_defaults(func=_cmd_chat)

    model = sub.add_parser("model", help="build the models the mesh serves")
    add_model_arguments(model)
    model.set_defaults(func=_cmd_model)

    certs = sub.add_parser("certs", help="create the mesh CA, issue and rotate the planes' certificates")
    add_certs_arguments(certs)
    certs.set_defaults(func=_cmd_certs)

    db = sub.add_parser("db", help="migrate the stores to this release's schema, check them, print the SQL")
    add_db_arguments(db)
    db.set_defaults(func=_cmd_db)

    bench = sub.add_parser(
        "bench", help="run a benchmark against a peer in the same run; the last line is one JSON object"
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    drill = sub.add_parser(
        "drill",
        help="disrupt a region, pod, the global plane or Redis under streaming traffic and report what "
        "clients saw; the last line is one JSON object",
    )
    add_drill_arguments(drill)
    drill.set_defaults(func=_cmd_drill)

    planes: list[tuple[str, str, type[Any], Callable[[argparse.Namespace], int]]] = [
        ("global", "run the global control plane", GlobalSettings, _cmd_global),
        ("region", "run one region plane", RegionSettings, _cmd_region),
        ("engine", "run one engine pod", EngineSettings, _cmd_engine),
        ("edge", "run the OpenAI-compatible HTTP edge", EdgeSettings, _cmd_edge),
    ]
    for name, help_text, settings_cls, func in planes:
        plane = sub.add_parser(
            name, help=help_text, description=f"{help_text}; flags override LLMMESH_* variables."
        )
        config.add_arguments(plane, settings_cls)
        plane.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _setup_logging(args.command, args)
        result: int = args.func(args)
    except ValueError as err:  # a malformed LLMMESH_* variable
        print(f"llmmesh {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
