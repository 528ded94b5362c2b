"""The operator file (``GEMMANET_CAPACITY_FILE``, TOML): per-node budget overrides and the model
catalog that placement charges against each node's memory budget.

    [models."llama3:8b"]
    resident_gb = 5.5        # memory the model takes while loaded
    kv_gb = 0.75             # extra memory per request running on it (KV cache)

    [nodes."box-1"]
    max_parallel = 2         # overrides the node's --max-parallel
    vram_gb = 24             # overrides the node's --vram-gb (its memory budget)
    telemetry_url = "http://box-1:9105/telemetry"   # its `gemmanet telemetry-agent`, for a monitor

    [hosts."box-c"]          # a direct model host, watched by the elected monitor
    url = "http://box-c:11434"
    kind = "ollama"          # or "openai" (an OpenAI-compatible server)
    memory_gb = 24           # its memory budget
    max_parallel = 2
    weight = 1.0             # relative share of placement (core/placement/choose.py: "Weight")
    telemetry_url = "http://box-c:9105/telemetry"   # as for a node: polled by the monitor
    api_key_file = "/etc/gemmanet/box-c.key"      # read at start, sent as a Bearer token

    [keys."batch-jobs"]      # an API key, by the name it was created with
    priority = 1             # its weight in the fair admission queue, 1-100 (over the key's own)

A model without a catalog entry is placed on the parallel budget alone; a node's parallelism is
never inferred from its memory. Every instance should read the same file.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from coordinator.errors import SettingsError
from coordinator.log_redaction import register_secret
from protocol.constraints import MAX_PARALLEL, MAX_VRAM_GB

_HOST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

__all__ = ["HOST_KINDS", "Capacity", "HostSpec", "ModelCost", "NodeBudget", "load_capacity"]

#: the tables of the operator file; anything else at its top level is refused
TABLES = ("models", "nodes", "hosts", "keys")
#: what a direct host speaks: Ollama's API or the OpenAI-compatible one
HOST_KINDS = ("ollama", "openai")
MAX_HOST_WEIGHT = 1000.0


@dataclass(frozen=True, slots=True)
class ModelCost:
    resident_gb: float = 0.0
    kv_gb: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeBudget:
    max_parallel: int | None = None
    vram_gb: float | None = None
    #: where the node's ``gemmanet telemetry-agent`` answers (read-only; never a budget)
    telemetry_url: str | None = None


@dataclass(frozen=True, slots=True)
class HostSpec:
    """A direct model host (it cannot connect out; the coordinator calls it)."""

    url: str
    kind: str
    memory_gb: float | None = None
    max_parallel: int = 1
    weight: float = 1.0
    #: where the host's ``gemmanet telemetry-agent`` answers (read-only, as for a node)
    telemetry_url: str | None = None
    #: the key its ``api_key_file`` holds (never in a repr: a settings dump cannot show it)
    api_key: str | None = field(default=None, repr=False)

    def auth_headers(self) -> dict[str, str]:
        """What every request to the host carries: its API key, when it has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Capacity:
    models: dict[str, ModelCost] = field(default_factory=dict)
    nodes: dict[str, NodeBudget] = field(default_factory=dict)
    hosts: dict[str, HostSpec] = field(default_factory=dict)
    #: API key name -> its priority in the fair admission queue (over the key's own)
    key_priorities: dict[str, int] = field(default_factory=dict)

    def cost(self, model: str) -> ModelCost:
        return self.models.get(model, ModelCost())

    def budgets(
        self, node_id: str, max_parallel: int, vram_gb: float | None
    ) -> tuple[int, float | None]:
        """The node's (max parallel, memory budget): the operator file's, else its hello's."""
        override = self.nodes.get(node_id, NodeBudget())
        parallel = override.max_parallel if override.max_parallel is not None else max_parallel
        memory = override.vram_gb if override.vram_gb is not None else vram_gb
        return parallel, memory


def _number(where: str, table: dict[str, Any], name: str, maximum: float) -> float | None:
    value = table.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= maximum
    ):
        raise SettingsError(f"{where}.{name} = {value!r} must be a number from 0 to {maximum:g}")
    return float(value)


def _http_url(where: str, table: dict[str, Any], name: str) -> str | None:
    value = table.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise SettingsError(f"{where}.{name} = {value!r} must be an http:// or https:// URL")
    if any(ch.isspace() for ch in value) or len(value) > 2048:
        raise SettingsError(f"{where}.{name} must be one URL without spaces")
    return value


def _table(where: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SettingsError(f"{where} must be a table")
    return value


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SettingsError(f"{where} has unknown field(s) {', '.join(unknown)}")


def parse_capacity(text: str, source: str = "the capacity file") -> Capacity:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{source} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        tables = all(isinstance(data[name], dict) for name in unknown)
        names = ", ".join(f"[{n}]" if isinstance(data[n], dict) else repr(n) for n in unknown)
        known = ", ".join(f"[{name}]" for name in TABLES[:-1]) + f" and [{TABLES[-1]}]"
        raise SettingsError(
            f"{source} has unknown {'table(s)' if tables else 'top-level key(s)'} {names}: the "
            f"operator file knows only the tables {known}"
        )
    models = {}
    for name, raw in _table(f"{source}: [models]", data.get("models", {})).items():
        where = f'{source}: models."{name}"'
        entry = _table(where, raw)
        _check_keys(where, entry, {"resident_gb", "kv_gb"})
        models[name] = ModelCost(
            resident_gb=_number(where, entry, "resident_gb", MAX_VRAM_GB) or 0.0,
            kv_gb=_number(where, entry, "kv_gb", MAX_VRAM_GB) or 0.0,
        )
    nodes = {}
    for node_id, raw in _table(f"{source}: [nodes]", data.get("nodes", {})).items():
        where = f'{source}: nodes."{node_id}"'
        entry = _table(where, raw)
        _check_keys(where, entry, {"max_parallel", "vram_gb", "telemetry_url"})
        parallel = _number(where, entry, "max_parallel", MAX_PARALLEL)
        if parallel is not None and (parallel < 1 or parallel != int(parallel)):
            raise SettingsError(f"{where}.max_parallel must be a whole number of at least 1")
        nodes[node_id] = NodeBudget(
            max_parallel=None if parallel is None else int(parallel),
            vram_gb=_number(where, entry, "vram_gb", MAX_VRAM_GB),
            telemetry_url=_http_url(where, entry, "telemetry_url"),
        )
    hosts = {
        host_id: _host(f'{source}: hosts."{host_id}"', host_id, raw)
        for host_id, raw in _table(f"{source}: [hosts]", data.get("hosts", {})).items()
    }
    priorities = {}
    for name, raw in _table(f"{source}: [keys]", data.get("keys", {})).items():
        where = f'{source}: keys."{name}"'
        entry = _table(where, raw)
        _check_keys(where, entry, {"priority"})
        priority = entry.get("priority")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 100:
            raise SettingsError(f"{where}.priority must be a whole number from 1 to 100")
        priorities[name] = priority
    return Capacity(models=models, nodes=nodes, hosts=hosts, key_priorities=priorities)


def _host(where: str, host_id: str, raw: object) -> HostSpec:
    if not _HOST_ID.fullmatch(host_id):
        raise SettingsError(f"{where}: a host id may hold only [A-Za-z0-9._:-], 1 to 64 of them")
    entry = _table(where, raw)
    _check_keys(
        where,
        entry,
        {"url", "kind", "memory_gb", "max_parallel", "weight", "telemetry_url", "api_key_file"},
    )
    url = _http_url(where, entry, "url")
    if url is None:
        raise SettingsError(f"{where}.url is required (the host's http:// or https:// base URL)")
    kind = entry.get("kind")
    if kind not in HOST_KINDS:
        raise SettingsError(
            f"{where}.kind = {kind!r} must be " + " or ".join(map(repr, HOST_KINDS))
        )
    parallel = _number(where, entry, "max_parallel", MAX_PARALLEL)
    if parallel is not None and (parallel < 1 or parallel != int(parallel)):
        raise SettingsError(f"{where}.max_parallel must be a whole number of at least 1")
    weight = _number(where, entry, "weight", MAX_HOST_WEIGHT)
    if weight is not None and weight <= 0:
        raise SettingsError(f"{where}.weight must be above 0")
    return HostSpec(
        url=url.rstrip("/"),
        kind=kind,
        memory_gb=_number(where, entry, "memory_gb", MAX_VRAM_GB),
        max_parallel=1 if parallel is None else int(parallel),
        weight=1.0 if weight is None else weight,
        telemetry_url=_http_url(where, entry, "telemetry_url"),
        api_key=_api_key(where, entry.get("api_key_file")),
    )


#: an API key is one line of printable ASCII (it goes into an HTTP header)
_API_KEY = re.compile(r"[\x21-\x7e]{1,4096}")


def _api_key(where: str, path: object) -> str | None:
    """The key the file holds (surrounding whitespace dropped), registered as a secret so no
    log line can show it; refused in one line naming the file, never the content."""
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise SettingsError(f"{where}.api_key_file must be the path of a file")
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read(8192).strip()
    except OSError as exc:
        raise SettingsError(f"{where}.api_key_file = {path!r}: cannot read it: {exc.strerror}")
    except UnicodeDecodeError:
        raise SettingsError(f"{where}.api_key_file = {path!r} is not UTF-8 text") from None
    if not _API_KEY.fullmatch(key):
        raise SettingsError(
            f"{where}.api_key_file = {path!r} must hold one API key: one line of printable "
            "characters without spaces"
        )
    register_secret(key)
    return key


def load_capacity(path: str) -> Capacity:
    """Read and check the operator file; a SettingsError names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise SettingsError(f"GEMMANET_CAPACITY_FILE={path!r}: cannot read it: {exc.strerror}")
    except UnicodeDecodeError:
        raise SettingsError(f"GEMMANET_CAPACITY_FILE={path!r} is not UTF-8 text") from None
    return parse_capacity(text, source=path)
