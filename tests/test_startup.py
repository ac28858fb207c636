"""What starting ojs_kombu loads: importing the package, or running one ``ojs-kombu``
command, leaves out what only other paths need (docs/performance.rst, Start-up)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def loaded_after(code: str) -> set[str]:
    """The modules loaded in a fresh interpreter after ``code`` ran."""
    script = textwrap.dedent(code) + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_importing_ojs_kombu_leaves_out_the_redis_client_and_opentelemetrys_sdk() -> None:
    loaded = loaded_after("import ojs_kombu")
    assert "ojs_kombu" in loaded
    assert not {name for name in loaded
                if name.startswith(("redis", "celery.backends.redis", "opentelemetry.sdk"))}


def test_one_command_loads_only_its_own_module() -> None:
    loaded = loaded_after("""
        from ojs_kombu.cli.main import main
        try:
            main(["dlq", "list", "--help"])
        except SystemExit:
            pass
    """)
    assert "ojs_kombu.cli.dlq" in loaded
    assert not {"ojs_kombu.cli.migrate", "ojs_kombu.cli.conformance"} & loaded
