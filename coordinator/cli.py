"""The ``gemmanet`` command line (see INTERFACE.md). Exit 0 on success; otherwise a one-line
reason on stderr and a non-zero code.

It is the top of the program (tests/test_layers.py): it wires the commands of sim/ and tools/
as well as the coordinator's, but imports those packages only inside the functions that parse
or run one of their commands, and only for the command given, so ``gemmanet serve`` loads
neither the simulator nor the tools, and the
coordinator never depends on the packages built on it. The coordinator's own modules are
imported the same way, so ``gemmanet --help`` and ``--version`` load argparse and nothing of
the server stack (tests/coordinator/test_cli_help.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from coordinator import __version__
from coordinator.cli_help import (
    AUDIT_SETTINGS,
    MONITOR_SETTINGS,
    listen_arguments,
    one_line,
    settings_epilog,
    verbose_everywhere,
)
from coordinator.cli_keys import add_lifecycle_commands, keys_create
from coordinator.cli_monitor import add_monitor_commands

Handler = Callable[[argparse.Namespace], int]


def _fail(message: str, code: int = 1) -> int:
    from coordinator.logging_setup import json_logging_active

    if json_logging_active():  # every line of stderr stays JSON
        import logging

        logging.getLogger("gemmanet.cli").error(one_line(message))
    else:
        print(f"gemmanet: {one_line(message)}", file=sys.stderr)
    return code


def _serve(args: argparse.Namespace) -> int:
    from coordinator.server.listen import check_port

    port = check_port("--port", args.port, any_free=True)
    from coordinator.logging_setup import register_startup_secrets
    from coordinator.settings import Settings

    # The settings are checked before the server's modules load (about half a second of
    # imports): a bad setting is refused at once.
    settings = Settings.from_env()
    register_startup_secrets(
        database_url=settings.database_url, redis_password_file=settings.redis_password_file
    )
    from coordinator.server.serve import serve

    return serve(settings, host=args.host, port=port)


def _nodes_enroll(args: argparse.Namespace) -> int:
    from coordinator.settings import Settings
    from coordinator.store import Store, check_node_id

    try:
        check_node_id(args.node_id)
    except ValueError as exc:
        return _fail(f"--node-id: {exc}", 2)
    from coordinator.cli_keys import cli_actor

    store = Store.open(Settings.from_env().database_url)
    try:
        token = store.enroll_node_sync(args.node_id, actor=cli_actor())
    finally:
        store.close()
    print(f"enrolled node {args.node_id}; any earlier token of it is revoked. Token:")
    print(token)
    return 0


def _node(args: argparse.Namespace) -> int:
    from tools.node_agent import run_node

    return run_node(args)


def _demo(args: argparse.Namespace) -> int:
    from coordinator.server.listen import check_port
    from tools.demo import run_demo

    port = check_port("--port", args.port)
    return run_demo(host=args.host, port=port, state_dir=args.state_dir)


def _loadtest(args: argparse.Namespace) -> int:
    from tools.loadtest import run_loadtest

    return run_loadtest(args)


def _sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return sim_main(args)


def _telemetry_agent(args: argparse.Namespace) -> int:
    from coordinator.errors import StartupRefused
    from coordinator.server.listen import check_port, check_port_free

    port = check_port("--port", args.port)
    if not 0.05 <= args.interval <= 3600:
        return _fail("--interval must be between 0.05 and 3600 seconds", 2)
    check_port_free(args.host, port)  # a bad host or a port in use: one line, exit 1
    from tools.node_agent.telemetry.agent_server import run_telemetry_agent

    try:
        return run_telemetry_agent(
            host=args.host, port=port, interval_s=args.interval, sysfs_root=args.sysfs_root
        )
    except (OSError, BaseExceptionGroup) as exc:
        # The port taken between the check and Hypercorn's bind (in the task tree's groups).
        reason: BaseException = exc
        while isinstance(reason, BaseExceptionGroup):
            reason = reason.exceptions[0]
        if not isinstance(reason, OSError):
            raise
        cause = reason.strerror or reason
        raise StartupRefused(f"cannot listen on {args.host}:{port}: {cause}") from None


def _redis_acl(args: argparse.Namespace) -> int:
    from coordinator.coordination.redis.acl import parse_version, setuser_line

    try:
        version = parse_version(args.redis_version)
        line = setuser_line(
            args.user,
            args.prefix,
            redis_version=version,
            cluster=args.cluster,
            sentinel=args.sentinel,
        )
        print(line)
    except ValueError as exc:
        return _fail(str(exc), 2)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from coordinator.audit.command import run_audit_command
    from coordinator.settings import Settings

    switch: Literal["enable", "disable"] | None = (
        "enable" if args.enable else "disable" if args.disable else None
    )
    code, refusal = run_audit_command(
        Settings.from_env(), as_json=args.json, probe=args.probe, switch=switch, by=args.by
    )
    return code if refusal is None else _fail(refusal, code)


def _add_audit_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = sub.add_parser(
        "audit",
        help="is the scheduler ready? per host: reachable, facts fresh, budgets, resident "
        "models; the monitor, the timing bound, catalog gaps (exit 0 ready, 1 not ready, "
        "2 bad settings, 3 Redis unreachable)",
    )
    audit.add_argument(
        "--json", action="store_true", help="print the report as one JSON object (default: a table)"
    )
    audit.add_argument(
        "--probe",
        action="store_true",
        help="also poll each host from here (timeout: the poll timeout, at most 2 s); a failed "
        "probe is a warning, reachability itself comes from the monitor's facts (default: off)",
    )
    switch = audit.add_mutually_exclusive_group()
    switch.add_argument(
        "--enable",
        action="store_true",
        help="switch placement on direct hosts on in the shared store, only when every gate is "
        "green (else refused, naming them: exit 1); instances with GEMMANET_HOST_PLACEMENT=gated "
        "follow within 0.5 s (default: only report)",
    )
    switch.add_argument(
        "--disable",
        action="store_true",
        help="switch it off, no gate needed: no new placement on hosts from the instances' next "
        "read, calls in flight finish; prints the switch alone (default: only report)",
    )
    audit.add_argument(
        "--by",
        metavar="NAME",
        help="who switches, as the report shows it (default: user@host of this machine)",
    )
    audit.set_defaults(handler=_audit)


def _node_arguments(parser: argparse.ArgumentParser) -> None:
    from tools.node_agent import add_node_arguments

    add_node_arguments(parser)


def _loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    from tools.loadtest import add_loadtest_arguments

    add_loadtest_arguments(parser)


def _sim_arguments(parser: argparse.ArgumentParser) -> None:
    from sim.cli import add_sim_arguments

    add_sim_arguments(parser)


def _command_of(argv: Sequence[str]) -> str:
    """The command ``argv`` names: its first word that is not an option (the top-level options
    take no value), "" for none (``gemmanet --help``)."""
    return next((word for word in argv if not word.startswith("-")), "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line. ``command`` given, only that command's arguments defined in
    sim/ or tools/ are added (the others keep their name and help), so parsing one command
    imports only what it runs; None adds them all (help walkers and tests)."""

    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = argparse.ArgumentParser(
        prog="gemmanet", description="GemmaNet coordinator, node agent and tools"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, before or after the command"
    )
    parser.add_argument(
        "--version", action="version", version=f"gemmanet {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run one coordinator instance (its --help lists the GEMMANET_* settings it reads)",
    )
    listen_arguments(serve)
    if wanted("serve"):
        settings_epilog(serve, None)
    serve.set_defaults(handler=_serve)

    keys = sub.add_parser("keys", help="client API keys").add_subparsers(
        dest="keys_command", required=True, metavar="ACTION"
    )
    create = keys.add_parser("create", help="create an API key; prints it on the last line")
    create.add_argument(
        "--name", required=True, help="a label for the key (shown in logs, not secret)"
    )
    create.add_argument(
        "--admin",
        action="store_true",
        help="an operator key: also sees node details and the queue per model on "
        "/system-health and /api/v1/cluster",
    )
    create.add_argument(
        "--expires",
        metavar="DURATION",
        default=None,
        help="refuse the key after this long: 30d, 12h, 90m, 2w, 1d12h (default: never)",
    )
    create.add_argument(
        "--priority",
        type=int,
        default=1,
        metavar="N",
        help="its weight in the fair admission queue, 1-100: requests it is granted per turn "
        "while keys take turns (default 1; docs/fair-queuing.md)",
    )
    if wanted("keys"):
        settings_epilog(create, ("database_url",))
    create.set_defaults(handler=lambda args: keys_create(args, _fail))

    nodes = sub.add_parser("nodes", help="node identities").add_subparsers(
        dest="nodes_command", required=True, metavar="ACTION"
    )
    enroll = nodes.add_parser("enroll", help="create a node token; prints it on the last line")
    enroll.add_argument(
        "--node-id", required=True, metavar="ID", help="the identity the node will connect as"
    )
    if wanted("nodes"):
        settings_epilog(enroll, ("database_url",))
    enroll.set_defaults(handler=_nodes_enroll)
    add_lifecycle_commands(
        keys,
        nodes,
        _fail,
        lambda p: settings_epilog(p, ("database_url",)) if wanted(p.prog.split()[1]) else None,
    )

    node = sub.add_parser("node", help="run a node agent that serves tasks")
    if wanted("node"):
        _node_arguments(node)
    node.set_defaults(handler=_node)

    demo = sub.add_parser(
        "demo", help="coordinator + demo API key + one echo node, and a curl line to try"
    )
    listen_arguments(demo)
    demo.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the demo keeps its database and its API key, reused on every run (default: "
        "$XDG_STATE_HOME/gemmanet-demo, i.e. ~/.local/state/gemmanet-demo)",
    )
    demo.set_defaults(handler=_demo)

    loadtest = sub.add_parser("loadtest", help="the load profile of seed 000 section 4.1")
    if wanted("loadtest"):
        _loadtest_arguments(loadtest)
    loadtest.set_defaults(handler=_loadtest)

    telemetry = sub.add_parser(
        "telemetry-agent", help="serve this machine's CPU, memory and GPU telemetry as JSON"
    )
    telemetry.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    telemetry.add_argument("--port", default=9105, help="TCP port, 1-65535 (default 9105)")
    telemetry.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between samples; CPU busy is measured over it (default 1)",
    )
    telemetry.add_argument(
        "--sysfs-root",
        type=Path,
        default=Path("/sys"),
        metavar="DIR",
        help="where to read the DRM GPU files (default /sys; tests use a recorded tree)",
    )
    telemetry.set_defaults(handler=_telemetry_agent)

    redis_acl = sub.add_parser(
        "redis-acl", help="print the ACL SETUSER line of one instance's least Redis rights"
    )
    redis_acl.add_argument("--user", required=True, help="the ACL user name of this instance")
    redis_acl.add_argument("--prefix", default="gn", help="its GEMMANET_KEY_PREFIX (default gn)")
    redis_acl.add_argument(
        "--redis-version",
        default="7.0",
        help="the server's version; 7.2 and later also allow CLIENT SETINFO (default 7.0)",
    )
    redis_acl.add_argument(
        "--cluster",
        action="store_true",
        help="for a Redis Cluster (redis+cluster://): {prefix} names and sharded pub/sub",
    )
    redis_acl.add_argument(
        "--sentinel",
        action="store_true",
        help="for a master behind Redis Sentinel (redis+sentinel://): adds ROLE and WAIT",
    )
    redis_acl.set_defaults(handler=_redis_acl)

    sim = sub.add_parser("sim", help="deterministic simulator: run, replay, sweep")
    if wanted("sim"):
        _sim_arguments(sim)
    sim.set_defaults(handler=_sim)

    add_monitor_commands(sub)
    _add_audit_command(sub)
    for name, fields in (("monitor", MONITOR_SETTINGS), ("audit", AUDIT_SETTINGS)):
        if wanted(name):
            settings_epilog(sub.choices[name], fields)
    verbose_everywhere(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)  # --help and --version exit here, having loaded nothing
    from coordinator.errors import SettingsError, StartupRefused, StoreError
    from coordinator.logging_setup import configure_logging, log_format_from_env

    try:
        log_format = log_format_from_env()
    except SettingsError as exc:
        return _fail(str(exc), 2)
    configure_logging(verbose=args.verbose, log_format=log_format)
    try:
        return int(args.handler(args))
    except SettingsError as exc:
        return _fail(str(exc), 2)
    except StartupRefused as exc:
        return _fail(str(exc), 1)
    except StoreError as exc:
        return _fail(f"database: {exc}", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
