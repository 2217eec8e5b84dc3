"""scripts/uv_install.py hands uv what pip's configuration says about where packages come from.

The translation is tested on `pip config list` texts; the command line on the checkout's own venv
(its real pip configuration, with PIP_* variables added), nothing installed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from conftest import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]
_SCRIPT = REPO / "scripts" / "uv_install.py"
uv_install = load_script("uv_install")

THIS_MACHINE = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_this_machines_pip_configuration_becomes_the_same_sources_for_uv():
    args, env, refused = uv_install.uv_configuration(uv_install.effective_options(THIS_MACHINE))
    assert refused == []
    pairs = list(zip(args[::2], args[1::2]))
    assert pairs == [("--constraint", "/etc/xdg/pip/constraints.txt"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--extra-index-url", "file:///opt/pypi-more/simple"),
                     ("--find-links", "/opt/wheels"),
                     ("--index-strategy", "unsafe-best-match")]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_environment_beats_the_install_section_which_beats_global():
    text = ("global.index-url='https://a.example/simple'\n"
            "install.index-url='https://b.example/simple'\n"
            "download.index-url='https://ignored.example/simple'\n"
            "global.timeout='15'\n"
            ":env:.timeout='60.0'\n")
    options = uv_install.effective_options(text)
    assert options == {"index-url": "https://b.example/simple", "timeout": "60.0"}
    args, env, _ = uv_install.uv_configuration(options)
    assert args == ["--index-url", "https://b.example/simple"]  # one index: uv's default strategy
    assert env == {"UV_HTTP_TIMEOUT": "60"}


def test_switches_and_trusted_hosts():
    text = ("global.no-index='true'\nglobal.pre='yes'\nglobal.trusted-host='h1 h2'\n"
            "global.no-cache-dir='1'\nglobal.progress-bar='off'\n")
    args, env, refused = uv_install.uv_configuration(uv_install.effective_options(text))
    assert args == ["--no-index", "--prerelease", "allow",
                    "--allow-insecure-host", "h1", "--allow-insecure-host", "h2"]
    assert env == {} and refused == []


def test_keys_uv_cannot_take_are_named_not_dropped():
    text = "global.proxy='http://p:3128'\nglobal.user='true'\nglobal.find-links='/w'\n"
    _, _, refused = uv_install.uv_configuration(uv_install.effective_options(text))
    assert refused == ["proxy", "user"]


def _check(extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    venv = pathlib.Path(os.environ.get("VSPEC_VENV", REPO / ".venv"))
    return subprocess.run([sys.executable, str(_SCRIPT), "--venv", str(venv), "--check"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **extra_env})


def test_check_passes_here_and_refuses_a_proxy_by_name_with_status_3():
    ok = _check({})
    assert ok.returncode == 0, ok.stderr
    refused = _check({"PIP_PROXY": "http://proxy.invalid:3128"})
    assert refused.returncode == 3
    assert "'proxy'" in refused.stderr
