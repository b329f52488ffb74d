"""Package surface and value types: job states, kinds, EnqueueRequest, UniqueOpts."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pydantic
import pytest

import awa
from awa.model import DEFAULT_UNIQUE_STATES
from jobs_helpers import Conn, must_job_row

STATES = [
    "scheduled",
    "available",
    "running",
    "completed",
    "retryable",
    "failed",
    "cancelled",
    "waiting_external",
    "blocked",  # waiting for the jobs it depends on
]


def test_job_state_has_exactly_the_nine_states() -> None:
    assert [state.value for state in awa.JobState] == STATES
    assert [str(state) for state in awa.JobState] == STATES
    assert [state.name.lower() for state in awa.JobState] == STATES
    assert awa.JobState("waiting_external") is awa.JobState.WAITING_EXTERNAL
    assert f"{awa.JobState.RUNNING}" == "running"


def test_job_state_matches_the_database_enum_and_bits(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT s::text, awa.state_bit(s) FROM unnest(enum_range(NULL::awa.job_state)) AS s"
    ).fetchall()
    assert [name for name, _ in rows] == STATES
    assert {name: bit for name, bit in rows} == {state.value: state.bit for state in awa.JobState}


def test_terminal_states() -> None:
    terminal = {state.value for state in awa.JobState if state.is_terminal}
    assert terminal == {"completed", "failed", "cancelled"}


def test_public_names_exist() -> None:
    for name in awa.__all__:
        assert hasattr(awa, name), name


DERIVE_KIND_GOLDEN = [
    ("SendEmail", "send_email"),
    ("SendConfirmationEmail", "send_confirmation_email"),
    ("SMTPEmail", "smtp_email"),
    ("OAuthRefresh", "o_auth_refresh"),
    ("PDFRenderJob", "pdf_render_job"),
    ("ProcessV2Import", "process_v2_import"),
    ("ReconcileQ3Revenue", "reconcile_q3_revenue"),
    ("HTMLToPDF", "html_to_pdf"),
    ("IOError", "io_error"),
    ("already_snake", "already_snake"),
    ("send_email", "send_email"),
]


@pytest.mark.parametrize(("name", "kind"), DERIVE_KIND_GOLDEN)
def test_derive_kind_golden_cases(name: str, kind: str) -> None:
    assert awa.derive_kind(name) == kind


@dataclasses.dataclass
class HTMLToPDF:
    url: str


class OAuthRefresh(pydantic.BaseModel):
    account: int


async def test_derived_kind_is_what_gets_stored(client: awa.AsyncClient, conn: Conn) -> None:
    dataclass_job = await client.insert(HTMLToPDF("https://example.com"))
    model_job = await client.insert(OAuthRefresh(account=7))
    assert must_job_row(conn, dataclass_job.id)["kind"] == "html_to_pdf"
    assert must_job_row(conn, model_job.id)["kind"] == "o_auth_refresh"


def test_enqueue_request_setters_return_new_requests() -> None:
    base = awa.EnqueueRequest(HTMLToPDF("u"))
    mail = base.queue("mail").priority(1)
    assert base.resolve(awa.InsertOpts()) == awa.InsertOpts()
    resolved = mail.resolve(awa.InsertOpts())
    assert (resolved.queue, resolved.priority) == ("mail", 1)
    assert mail.args == HTMLToPDF("u")


def test_enqueue_request_with_opts_replaces_earlier_options() -> None:
    run_at = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
    request = (
        awa.EnqueueRequest(HTMLToPDF("u"))
        .queue("mail")
        .tags(["x"])
        .with_opts(awa.InsertOpts(priority=4, run_at=run_at))
    )
    assert request.resolve(awa.InsertOpts(queue="shared")) == awa.InsertOpts(
        priority=4, run_at=run_at
    )
    assert request.queue("late").resolve(awa.InsertOpts()).queue == "late"


def test_unique_opts_defaults_and_coercion() -> None:
    defaults = awa.UniqueOpts.coerce({})
    assert defaults == awa.UniqueOpts()
    assert defaults is not None
    assert defaults.states == DEFAULT_UNIQUE_STATES
    assert defaults.mask == 0b0001_1111
    from_mask = awa.UniqueOpts(states=0b0100_0001)  # type: ignore[arg-type]
    assert from_mask.states == {awa.JobState.SCHEDULED, awa.JobState.CANCELLED}
    from_names = awa.UniqueOpts(states=frozenset({"failed"}))  # type: ignore[arg-type]
    assert from_names.mask == 1 << 5
    assert awa.UniqueOpts(by_period=dt.timedelta(hours=1)).period_seconds == 3600.0


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"by_args": True, "by_kind": True}, "unknown key"),
        ({"by_period": 0}, "by_period"),
        ({"by_period": -5}, "by_period"),
        ({"states": 256}, "255"),
        ({"states": ["finished"]}, "finished"),
        ("by_args", "dict"),
    ],
)
def test_unique_opts_rejects_bad_values(value: object, fragment: str) -> None:
    with pytest.raises(awa.ValidationError, match=fragment):
        awa.UniqueOpts.coerce(value)  # type: ignore[arg-type]
