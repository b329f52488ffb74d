"""A FastAPI application with awa: a signup endpoint writes its row and enqueues the welcome
email in one database transaction (SQLAlchemy), the worker runs in the application's
lifespan, and the operator UI is mounted under /awa.

    DATABASE_URL=postgresql://... uvicorn examples.fastapi_app:app

Larger deployments run the worker as its own process (`awa worker`) and keep only the
producer here: `lifespan(client, worker=False)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import sqlalchemy as sa
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

import awa
import awa.bridge
from awa.contrib.fastapi import lifespan, mount

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

client = awa.AsyncClient(DATABASE_URL)
# SQLAlchemy on psycopg 3, connecting with the same libpq string as awa (URL or key=value).
engine = create_async_engine(
    "postgresql+psycopg://", async_creator=lambda: psycopg.AsyncConnection.connect(DATABASE_URL)
)
Session = async_sessionmaker(engine, expire_on_commit=False)

tables = sa.MetaData()
signups = sa.Table(
    "example_signups",
    tables,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("email", sa.Text, nullable=False, unique=True),
    sa.Column("welcomed", sa.Boolean, nullable=False, server_default=sa.false()),
)


@dataclasses.dataclass
class SendWelcome:
    signup_id: int
    email: str


@client.task(SendWelcome, queue="email", max_attempts=5)
async def send_welcome(job: awa.Job[SendWelcome]) -> None:
    # A real application calls its mail provider here.
    async with Session.begin() as session:
        await session.execute(
            signups.update().where(signups.c.id == job.args.signup_id).values(welcomed=True)
        )


@contextlib.asynccontextmanager
async def database(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(tables.create_all)
    yield
    await engine.dispose()


app = FastAPI(lifespan=lifespan(client, {"email": 4}, migrate=True, inner=database))
mount(app, client, prefix="/awa")


class SignupIn(BaseModel):
    email: str


@app.post("/signups")
async def create_signup(body: SignupIn) -> dict[str, Any]:
    async with Session.begin() as session:
        inserted = await session.execute(
            sa.insert(signups).values(email=body.email).returning(signups.c.id)
        )
        signup_id = inserted.scalar_one()
        job = await awa.bridge.insert_job(
            session, SendWelcome(signup_id, body.email), client=client
        )
        if body.email.endswith(".invalid"):
            # Raising inside the transaction rolls back the signup and its job together.
            raise HTTPException(422, "undeliverable address")
    return {"signup_id": signup_id, "job_id": job.id}


@app.get("/signups/{signup_id}")
async def read_signup(signup_id: int) -> dict[str, Any]:
    async with Session() as session:
        row = (
            await session.execute(sa.select(signups).where(signups.c.id == signup_id))
        ).one_or_none()
    if row is None:
        raise HTTPException(404, "no such signup")
    return {"id": row.id, "email": row.email, "welcomed": row.welcomed}
