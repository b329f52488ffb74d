"""The rest of the reference package's (awa-pg) Python surface, written the way its own tests
use it (../shared/reference/python-api.md): ``python -m awa`` as a module, start()'s checks
and their words, ``QueueStat``, ``JobState``'s repr, ``Job.deadline``,
``flush_admin_metadata``, telemetry, ``awa._awa`` and ``awa._trace``, ``resume_external`` to
a handler waiting for its callback, an unreachable database, the bridge's and ``work_one``'s
messages, and the storage-engine calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import awa
import awa.testing
from awa.bridge import insert_job_sync
from helpers_worker import wait_for

RUNTIME_START_KWARGS = {"poll_interval_ms": 50, "leader_election_interval_ms": 100}
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=5"


@dataclasses.dataclass
class SeqTask:
    order_id: int


@dataclasses.dataclass
class ConfigTestJob:
    value: str


async def wait_until(predicate: Any, timeout: float = 10.0) -> Any:
    """Until ``predicate`` (a coroutine function) returns something truthy (the shared
    deadline helper, with the reference tests' default timeout)."""
    return await wait_for(predicate, timeout, interval=0.02)


def run_python(code: str, database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"DATABASE_URL": database_url} if database_url else {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ── python -m awa ─────────────────────────────────────────────────────


def test_importing_main_runs_nothing_and_main_returns_the_exit_code(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import awa.__main__ as main_module  # no SystemExit

    assert main_module.main(["--version"]) == 0
    assert awa.__version__ in capsys.readouterr().out
    assert main_module.main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err
    assert main_module.main(["--database-url", database_url, "migrate"]) == 0
    assert main_module.main(["--database-url", UNREACHABLE, "job", "list"]) == 1
    assert "error:" in capsys.readouterr().err
    imported = run_python("import awa.__main__; print('imported')")
    assert (imported.returncode, imported.stdout) == (0, "imported\n"), imported.stderr


# ── start() config validation (test_start_config.py) ──────────────────


async def test_start_config_errors_speak_the_reference_words(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    with pytest.raises(
        awa.AwaError, match="register at least one worker before starting the runtime"
    ):
        await client.start([("cfg_no_worker", 1)], **RUNTIME_START_KWARGS)

    queue = "cfg_checks"

    @client.task(ConfigTestJob, queue=queue)
    async def handle(job):  # type: ignore[no-untyped-def]
        return None

    cases = [
        ("tuple queue config is not supported", ([(queue, 10)],), {"global_max_workers": 20}),
        ("weighted mode requires explicit queue configs", (), {"global_max_workers": 20}),
        ("weight must be > 0", ([{"name": queue, "max_workers": 10, "weight": 0}],), {}),
        ("weight must be > 0", ([{"name": queue, "min_workers": 1, "weight": -1}],), {}),
    ]
    for message, args, kwargs in cases:
        with pytest.raises(ValueError, match=message) as caught:
            await client.start(*args, **kwargs)
        assert isinstance(caught.value, awa.ValidationError)
    partitioned = awa.PartitionedQueue("cfg_partitioned_queue_duplicate", 2)
    with pytest.raises(awa.AwaError, match="configured more than once"):
        await client.start(
            [
                {"name": partitioned.physical_queues[0], "max_workers": 1},
                *partitioned.queue_configs(max_workers_per_partition=1),
            ]
        )
    assert client.runtime is None
    await client.close()


def test_validation_error_is_a_value_error(database_url: str) -> None:
    assert issubclass(awa.ValidationError, ValueError)
    with awa.Client(database_url) as client, pytest.raises(ValueError, match="priority") as caught:
        client.insert(SeqTask(order_id=1), priority=9)  # caught as the standard library's
    assert isinstance(caught.value, awa.ValidationError)


# ── Typed returns (test_adversarial_api.py) ───────────────────────────


async def test_queue_stats_returns_queue_stat_and_job_state_repr(database_url: str) -> None:
    assert "Completed" in repr(awa.JobState.Completed)
    assert repr(awa.JobState.COMPLETED) == "JobState.Completed"
    assert repr(awa.JobState.WaitingExternal) == "JobState.WaitingExternal"
    assert str(awa.JobState.Completed) == "completed"
    async with awa.AsyncClient(database_url) as client:
        await client.insert(SeqTask(order_id=1), queue="adv_typed_stats")
        stats = await client.queue_stats()
        stat = next(stat for stat in stats if stat.queue == "adv_typed_stats")
        assert isinstance(stat, awa.QueueStat)
        for field in (
            "queue",
            "total_queued",
            "scheduled",
            "available",
            "retryable",
            "running",
            "failed",
            "waiting_external",
            "completed_last_hour",
            "lag_seconds",
            "paused",
        ):
            assert hasattr(stat, field), field
        assert (stat.available, stat.total_queued) == (1, 1)
    with awa.Client(database_url) as sync_client:
        assert all(isinstance(stat, awa.QueueStat) for stat in sync_client.queue_stats())


async def test_job_deadline(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    queue = "props_deadline"
    seen = []
    release = asyncio.Event()

    @client.task(SeqTask, queue=queue)
    async def handle(job):  # type: ignore[no-untyped-def]
        seen.append(job.deadline)
        await release.wait()

    job = await client.insert(SeqTask(order_id=1), queue=queue)
    assert job.deadline is None
    await client.start(
        [{"name": queue, "max_workers": 1, "deadline_duration_ms": 60_000}],
        **RUNTIME_START_KWARGS,
    )
    try:
        running = await wait_until(
            lambda: _state_is(client, job.id, awa.JobState.Running), timeout=10
        )
        assert running.deadline is not None
        assert running.deadline == running["deadline"] == running.deadline_at
        assert 50 < (running.deadline - running.attempted_at).total_seconds() <= 61
        # The row turns running at the claim, a moment before the handler starts.
        [handler_deadline] = await wait_until(lambda: seen)
        # The handler's job.deadline is the row's (to rounding).
        assert abs((handler_deadline - running.deadline).total_seconds()) < 0.001
        release.set()
        done = await wait_until(lambda: _state_is(client, job.id, awa.JobState.Completed))
        assert done.deadline is None
    finally:
        release.set()
        await client.shutdown()
        await client.close()


async def _state_is(client: awa.AsyncClient, job_id: int, state: awa.JobState):  # type: ignore[no-untyped-def]
    job = await client.get_job(job_id)
    return job if job is not None and job.state == state else None


# ── flush_admin_metadata ──────────────────────────────────────────────


async def test_flush_admin_metadata(database_url: str, conn: psycopg.Connection) -> None:  # type: ignore[type-arg]
    async with awa.AsyncClient(database_url) as client:
        await client.insert(SeqTask(order_id=1), queue="flush_meta")
        await client.pause_queue("flush_meta", paused_by="ops")
        sampled = "SELECT counts FROM awa.queue_samples WHERE queue = 'flush_meta'"
        assert conn.execute(sampled).fetchone() is None  # no leader has sampled it
        assert await client.flush_admin_metadata() is None
        assert conn.execute(sampled).fetchone() == ({"available": 1},)
        [stat] = [s for s in await client.queue_stats() if s.queue == "flush_meta"]
        assert stat.paused is True
    with awa.Client(database_url) as sync_client:
        sync_client.insert(SeqTask(order_id=2), queue="flush_meta")
        assert sync_client.flush_admin_metadata() is None
        assert conn.execute(sampled).fetchone() == ({"available": 2},)


# ── Telemetry (test_telemetry.py) ─────────────────────────────────────

# Stand-ins for the OTLP/gRPC exporters (no collector here): the metric exporter records the
# names of the metrics it is handed, the span exporter the spans.
FAKE_EXPORTERS = """
import sys, types
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

exported, spans = set(), []

class OTLPMetricExporter(MetricExporter):
    def __init__(self, endpoint=None):
        super().__init__()
        self.endpoint = endpoint
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        for resource in metrics_data.resource_metrics:
            assert resource.resource.attributes["service.name"] == "awa-test-idempotent"
            for scope in resource.scope_metrics:
                exported.update(metric.name for metric in scope.metrics)
        return MetricExportResult.SUCCESS
    def force_flush(self, timeout_millis=10_000):
        return True
    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass

class OTLPSpanExporter(SpanExporter):
    def __init__(self, endpoint=None):
        self.endpoint = endpoint
    def export(self, batch):
        spans.extend(span.name for span in batch)
        return SpanExportResult.SUCCESS

base = "opentelemetry.exporter.otlp.proto.grpc"
for name, cls in (("metric_exporter", OTLPMetricExporter), ("trace_exporter", OTLPSpanExporter)):
    module = types.ModuleType(f"{base}.{name}")
    setattr(module, cls.__name__, cls)
    sys.modules[module.__name__] = module
"""


def test_init_telemetry_exposed_and_shutdown_before_init_is_safe() -> None:
    assert callable(awa.init_telemetry)
    assert callable(awa.shutdown_telemetry)
    awa.shutdown_telemetry()  # before any init: nothing to do
    with pytest.raises(awa.ValidationError, match="export_interval_ms"):
        awa.init_telemetry("http://127.0.0.1:4317", "awa-test", export_interval_ms=0)


def test_init_telemetry_is_idempotent_and_exports_awa_metrics_and_spans() -> None:
    result = run_python(
        FAKE_EXPORTERS
        + """
import awa
from awa.observability import tracing
from awa.observability import metrics

first = awa.init_telemetry("http://127.0.0.1:4317", "awa-test-idempotent", 60_000)
second = awa.init_telemetry("http://127.0.0.1:4317", "awa-test-idempotent")
metrics.completed.add(1, {metrics.KIND: "k", metrics.QUEUE: "q"})
with tracing.child_span("outer"):
    pass
with tracing._tracer.start_as_current_span("root"), tracing.producing():
    pass
awa.shutdown_telemetry()  # flushes
awa.shutdown_telemetry()
print(first, second, "awa.job.completed" in exported, sorted(spans))
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "True False True ['root', 'send']"


@pytest.mark.parametrize(
    "missing",
    ["opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"],
)
def test_init_telemetry_without_the_sdk_names_the_extra(missing: str) -> None:
    result = run_python(
        f"""
import sys
sys.modules[{missing!r}] = None  # not installed
import awa  # needs neither
try:
    awa.init_telemetry("http://127.0.0.1:4317", "svc")
except ImportError as error:
    print(error)
"""
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()  # one line
    assert line.startswith("awa.init_telemetry() (")
    assert "needs the OTLP export extra: pip install 'awa-py[otlp]'" in line


# ── awa._awa and awa._trace ───────────────────────────────────────────


def test_the_extension_module_names() -> None:
    from awa import _awa, callback_contract
    from awa._awa import derive_kind

    golden = {
        "SendEmail": "send_email",
        "SMTPEmail": "smtp_email",
        "OAuthRefresh": "o_auth_refresh",
        "HTMLToPDF": "html_to_pdf",
        "ProcessV2Import": "process_v2_import",
    }
    assert {name: derive_kind(name) for name in golden} == golden
    assert callback_contract.SIGNATURE_HEADER == _awa.CALLBACK_SIGNATURE_HEADER
    assert callback_contract.DEFAULT_PATH_PREFIX == _awa.CALLBACK_DEFAULT_PATH_PREFIX
    assert (
        callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS
        == _awa.CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS
    )
    secret = bytes(range(32))
    signature = _awa.sign_callback(secret, "cb")
    assert _awa.verify_callback(secret, "cb", signature)
    assert _awa.QueueStat is awa.QueueStat
    assert _awa.JobState is awa.JobState
    assert _awa.current_migration_version() == awa.current_migration_version()
    for name in _awa.__all__:
        assert getattr(_awa, name) is not None


async def test_trace_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    from awa import _trace

    assert _trace.TRACEPARENT_KEY == "awa:traceparent"
    assert _trace.current_traceparent() is None
    metadata = {"a": 1}
    assert _trace.inject_traceparent(metadata) is metadata
    context = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(1),
    )
    expected = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.use_span(NonRecordingSpan(context)):
        assert _trace.current_traceparent() == expected
        injected = _trace.inject_traceparent(metadata)
        assert injected == {"a": 1, "awa:traceparent": expected}
        assert metadata == {"a": 1}  # never mutated
        assert _trace.inject_traceparent({"awa:traceparent": "mine"}) == {"awa:traceparent": "mine"}
        monkeypatch.setenv("AWA_TRACE_CAPTURE", "off")
        assert _trace.ambient_traceparent() is None
        assert _trace.inject_traceparent(None) is None

    async def handler(job):  # type: ignore[no-untyped-def]
        return job, _trace.current_traceparent()

    assert await _trace.call_with_context(expected, handler, "job") == ("job", expected)
    assert await _trace.call_with_context(None, handler, "job") == ("job", None)


# ── resume_external to a waiting handler (test_sequential_callbacks.py) ──


async def test_resume_external_resumes_the_handler_waiting_for_its_callback(
    database_url: str,
) -> None:
    client = awa.AsyncClient(database_url)
    queue = "seq_wait_for_callback"
    tokens: asyncio.Queue[str] = asyncio.Queue()
    received = []

    @client.task(SeqTask, queue=queue)
    async def handle(job):  # type: ignore[no-untyped-def]
        for _ in range(2):
            token = await job.register_callback(timeout_seconds=60)
            await tokens.put(token.id)
            received.append(await job.wait_for_callback(token))
        return None

    job = await client.insert(SeqTask(order_id=1), queue=queue)
    await client.start([(queue, 1)], **RUNTIME_START_KWARGS)
    try:
        first = await asyncio.wait_for(tokens.get(), 10)
        await wait_until(lambda: _state_is(client, job.id, awa.JobState.WaitingExternal))
        resumed = await client.resume_external(first, payload={"step": 1})
        assert resumed.state == awa.JobState.Running
        assert resumed.attempt == 1
        second = await asyncio.wait_for(tokens.get(), 10)
        assert received == [{"step": 1}]
        await wait_until(lambda: _state_is(client, job.id, awa.JobState.WaitingExternal))
        with awa.Client(database_url) as sync_client:  # from another client, blocking
            resumed = sync_client.resume_external(second, payload={"step": 2})
        assert resumed.state == awa.JobState.Running
        done = await wait_until(lambda: _state_is(client, job.id, awa.JobState.Completed))
        assert received == [{"step": 1}, {"step": 2}]
        assert done.attempt == 1
        assert "_awa_callback_result" not in done.metadata
        with pytest.raises(awa.CallbackNotFound):
            await client.resume_external(second)
    finally:
        await client.shutdown()
        await client.close()


# ── An unreachable database ───────────────────────────────────────────


async def test_unreachable_database_raises_database_error() -> None:
    client = awa.AsyncClient(UNREACHABLE)  # connects on first use
    with pytest.raises(awa.DatabaseError):
        await client.insert(SeqTask(order_id=1))
    with pytest.raises(awa.DatabaseError):
        await client.get_job(1)
    with pytest.raises(awa.DatabaseError):
        async with client.transaction() as tx:
            await tx.execute("SELECT 1")
    await client.close()
    with pytest.raises(awa.DatabaseError):
        awa.migrate(UNREACHABLE)
    with awa.Client(UNREACHABLE) as sync_client:
        with pytest.raises(awa.DatabaseError):
            sync_client.insert(SeqTask(order_id=1))
        with pytest.raises(awa.DatabaseError), sync_client.transaction() as sync_tx:
            sync_tx.execute("SELECT 1")
        with pytest.raises(awa.DatabaseError):
            sync_client.queue_stats()


# ── The bridge (test_bridge.py) and awa.testing (test_testing_module.py) ──


def test_bridge_unsupported_connection_and_null_bytes(database_url: str) -> None:
    with pytest.raises(TypeError, match="Unsupported connection type"):
        insert_job_sync("not a connection", SeqTask(order_id=1))  # type: ignore[arg-type]
    with psycopg.Connection.connect(database_url) as conn:
        with pytest.raises(ValueError, match="null bytes"):
            insert_job_sync(conn, {"key": "val\x00ue"}, kind="bridge_nul")
        with pytest.raises(ValueError, match="null bytes"):
            insert_job_sync(conn, SeqTask(order_id=1), metadata={"bad": "val\x00ue"})
        count = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
        assert count == (0,)


async def test_work_one_cancel(database_url: str) -> None:
    tc = awa.testing.AwaTestClient(awa.AsyncClient(database_url))
    await tc.insert(SeqTask(order_id=1))

    async def handler(job):  # type: ignore[no-untyped-def]
        return awa.Cancel(reason="not needed")

    result = await tc.work_one(SeqTask, handler=handler)
    assert result.is_cancelled()
    assert result.error == "not needed"
    await tc.client.close()


# ── Storage-engine calls ──────────────────────────────────────────────

STATUS_KEYS = {
    "current_engine",
    "active_engine",
    "prepared_engine",
    "state",
    "transition_epoch",
    "details",
    "entered_at",
    "updated_at",
    "finalized_at",
    "canonical_live_backlog",
    "prepared_queue_storage_schema",
    "prepared_schema_ready",
    "live_runtime_capability_counts",
    "can_enter_mixed_transition",
    "enter_mixed_transition_blockers",
    "can_finalize",
    "finalize_blockers",
}


async def test_storage_status_and_install_on_awa_storage(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    status = json.loads(await client.storage_status())
    assert status.keys() >= STATUS_KEYS
    assert (status["current_engine"], status["active_engine"], status["state"]) == (
        "queue_storage",
        "queue_storage",
        "active",
    )
    assert (status["schema"], status["details"]["schema"]) == ("awa", "awa")
    assert status["migration_version"] == awa.current_migration_version()
    assert status["installed"] is status["prepared_schema_ready"] is True
    assert status["canonical_live_backlog"] == 0
    async with await client.transaction() as tx:
        row = await tx.fetch_one("SELECT awa.active_queue_storage_schema() AS schema_name")
        assert row["schema_name"] == "awa"

    job = await client.insert(SeqTask(order_id=1))
    assert await client.install_queue_storage() is None  # built by the migrations already
    assert await client.install_queue_storage(schema="awa", reset=False) is None
    assert await client.prepare_queue_storage_schema() is None
    assert await client.get_job(job.id) is not None  # nothing was touched
    bad = [
        ({"queue_slot_count": 2}, "queue storage requires at least 4 queue slots"),
        ({"lease_slot_count": 1}, "queue storage requires at least 2 lease slots"),
        ({"schema": "Bad-Name"}, "invalid SQL identifier: Bad-Name"),
        ({"queue_slot_count": 32}, "the default `awa` queue-storage schema must use the default"),
        ({"schema": "awa_py_other"}, "schema 'awa'"),
    ]
    for kwargs, message in bad:
        with pytest.raises(awa.ValidationError, match=message):
            await client.install_queue_storage(**kwargs)
        with pytest.raises(awa.ValidationError, match=message):
            await client.prepare_queue_storage_schema(**kwargs)

    @client.task(SeqTask, queue="storage_guard")
    async def handle(job):  # type: ignore[no-untyped-def]
        return None

    await client.start([("storage_guard", 1)], **RUNTIME_START_KWARGS)
    try:
        live = json.loads(await client.storage_status())["live_runtime_capability_counts"]
        assert live == {"queue_storage": 1}
        with pytest.raises(
            awa.AwaError, match="cannot install queue storage while the worker runtime is running"
        ):
            await client.install_queue_storage()
    finally:
        await client.shutdown()
        await client.close()

    with awa.Client(database_url) as sync_client:
        assert json.loads(sync_client.storage_status())["state"] == "active"
        assert sync_client.install_queue_storage() is None
        assert sync_client.prepare_queue_storage_schema() is None


async def test_install_queue_storage_reset_empties_the_storage(fresh_database: str) -> None:
    async with awa.AsyncClient(fresh_database) as client:
        with pytest.raises(awa.SchemaNotMigrated):
            await client.install_queue_storage()
        await client.migrate()
        job = await client.insert(SeqTask(order_id=1))
        await client.install_queue_storage(reset=True)
        assert await client.get_job(job.id) is None
        assert json.loads(await client.storage_status())["migration_version"] == (
            awa.current_migration_version()
        )
        again = await client.insert(SeqTask(order_id=2))
        assert again.state == awa.JobState.Available
    with awa.Client(fresh_database) as sync_client:
        sync_client.install_queue_storage(reset=True)
        assert sync_client.get_job(again.id) is None


def test_storage_module_constants() -> None:
    from awa import storage

    assert storage.DEFAULT_QUEUE_STORAGE_SCHEMA == "awa"
    assert (
        storage.DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        storage.DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    ) == (16, 8)


def test_storage_status_command(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from awa.__main__ import main

    assert main(["--database-url", database_url, "storage", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["current_engine"], status["state"], status["schema"]) == (
        "queue_storage",
        "active",
        "awa",
    )
