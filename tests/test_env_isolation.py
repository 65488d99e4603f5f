"""``isolation: venv``: two env wheels, built here, pinning versions of fsspec that conflict with
each other and with the trainer's, each served from a cached uv venv of its own while the
trainer's packages stay as they were; a second start finds the venv with the network refused."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import signal
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from agilerl.assembly.env_factory import make_env_factory
from agilerl.errors import EnvPackagesError, ManifestError
from agilerl.fleet.factory import replica_spec
from agilerl.fleet.isolation import agilerl_requirement, prepare_env, prepared_envs
from agilerl.manifest.spec import load_manifest, parse_env_spec
from agilerl.registry.install import installed_constraints
from tests.health import start_server
from tests.signals import as_from_a_terminal

pytestmark = pytest.mark.timeout(600)

PINS = {"agilerl-env-pina": "fsspec==2026.6.0", "agilerl-env-pinb": "fsspec==2026.7.0"}
"""Two envs, two versions of fsspec, neither the trainer's (the local index has all three)."""

ENV_SOURCE = '''
import fsspec


class PinEnv:
    """Says which fsspec it runs with: the proof of whose venv it is in."""

    max_turns = 2

    def reset(self, seed=None):
        return f"fsspec {fsspec.__version__}", {}

    def step(self, action):
        return "done", 1.0, True, False, {}
'''


def _wheel(folder: Path, dist: str, requirement: str) -> Path:
    """A pure-python wheel of ``dist`` (module ``dist`` with underscores) requiring ``requirement``."""
    module, version = dist.replace("-", "_"), "0.1.0"
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": ENV_SOURCE,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nRequires-Dist: {requirement}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: agilerl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for dist, pin in PINS.items():
        _wheel(folder, dist, pin)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agilerl-cache")


@pytest.fixture
def env_index(wheels: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheels folder as uv's find-links (pip's indexes still reach fsspec), the cache here."""
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("AGILERL_CACHE_DIR", str(cache))


def _spec(dist: str):
    module = dist.replace("-", "_")
    return parse_env_spec({
        "env_type": "rollout", "entrypoint": f"{module}:PinEnv", "isolation": "venv",
        "env_packages": {"uv": [dist]},
    })


def test_the_venv_gets_the_agilerl_the_trainer_runs():
    assert agilerl_requirement() == f"-e {Path(__file__).resolve().parents[1]}"  # this checkout, editable


@pytest.mark.slow
def test_two_envs_with_conflicting_pins_run_side_by_side_and_leave_the_trainer_alone(env_index, cache):
    before = installed_constraints()
    factories = [make_env_factory(_spec(dist)) for dist in PINS]
    try:
        clients = [factory() for factory in factories]
        seen = [client.reset(seed=0)[0] for client in clients]  # both served at once
        assert seen == ["fsspec 2026.6.0", "fsspec 2026.7.0"]
        assert clients[0].describe().max_turns == 2  # probed inside the venv, from /metadata
        for client in clients:
            client.close()
        venvs = {env.hash for env in prepared_envs()}
        assert len(venvs) == 2 and all(f"venv {cache / 'envs'}" in f.where for f in factories)
    finally:
        for factory in factories:
            factory.close()
    assert installed_constraints() == before  # the trainer's packages, exactly as they were
    assert importlib.metadata.version("fsspec") not in ("2026.6.0", "2026.7.0")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("agilerl-env-pina")


@pytest.mark.slow
def test_a_warm_start_needs_no_network(env_index, cache, monkeypatch, capsys):
    spec = replica_spec(_spec("agilerl-env-pina"))
    cold = prepare_env(spec)  # built by the test before, or now
    capsys.readouterr()
    dead = "http://127.0.0.1:9/simple"  # nothing listens on the discard port
    for var in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("UV_FIND_LINKS", str(cache / "no-such-folder"))
    monkeypatch.setenv("UV_OFFLINE", "1")

    def no_uv() -> str:
        raise AssertionError("a warm start ran uv")

    monkeypatch.setattr("agilerl.registry.install.uv_binary", no_uv)
    warm = prepare_env(spec, offline=True)
    assert warm == cold and "building" not in capsys.readouterr().err
    factory = make_env_factory(_spec("agilerl-env-pina"))
    try:
        client = factory()
        assert client.reset(seed=0)[0] == "fsspec 2026.6.0"
        client.close()
    finally:
        factory.close()


@pytest.mark.slow
def test_env_prepare_lists_and_removes_prepared_envs(env_index, cache, tmp_path, capsys):
    from agilerl.cli.main import main

    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"environment": _spec("agilerl-env-pinb").model_dump(mode="json", exclude_none=True)}))
    assert main(["env", "prepare", str(manifest)]) == 0
    prepared = next(e for e in prepared_envs() if "agilerl-env-pinb" in e.requirements)
    assert str(prepared.path) in capsys.readouterr().out
    assert main(["env", "prepared"]) == 0
    listing = capsys.readouterr().out
    assert prepared.hash in listing and "MB" in listing and "agilerl-env-pinb" in listing
    assert main(["env", "prepared", "--remove", "0000"]) == 2
    assert "no prepared env '0000'" in capsys.readouterr().err
    assert main(["env", "prepared", "--remove", prepared.hash]) == 0
    assert not prepared.path.exists() and prepared.hash not in {e.hash for e in prepared_envs()}


@pytest.mark.slow
def test_resolve_env_and_agilerl_serve_serve_from_the_venv(env_index, tmp_path):
    from agilerl.llm_envs import RemoteEnvClient
    from agilerl.llm_envs.openenv_server import resolve_env

    url, server = resolve_env("agilerl_env_pina:PinEnv", isolation="venv", env_packages=["agilerl-env-pina"])
    with server:
        client = RemoteEnvClient(url)
        assert client.reset(seed=0)[0] == "fsspec 2026.6.0"
        client.close()
        process = server.replica.handle
    assert process.poll() is not None  # stopped with the server

    serve, url = start_server(
        [sys.executable, "-m", "agilerl", "serve", "agilerl_env_pinb:PinEnv", "--isolation", "venv",
         "--env-package", "agilerl-env-pinb", "--port", "0", "--port-file", str(tmp_path / "url")],
        tmp_path / "url", tmp_path / "serve.log", timeout_s=300, preexec_fn=as_from_a_terminal,
    )
    try:
        client = RemoteEnvClient(url)
        assert client.reset(seed=0)[0] == "fsspec 2026.7.0"  # the serve process became the venv's
        client.close()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_a_venv_resolves_within_pips_constraint_files(tmp_path, monkeypatch):
    from agilerl.registry.install import pip_constraint_options

    caps = tmp_path / "caps.txt"
    caps.write_text("fsspec<=2026.6.0\n")
    monkeypatch.setenv("PIP_CONSTRAINT", str(caps))
    assert pip_constraint_options() == ["--constraint", str(caps)]  # pip's own setting, passed to uv
    monkeypatch.setenv("UV_CONSTRAINT", str(caps))
    assert pip_constraint_options() == []  # uv's own setting wins, and uv reads it itself


def test_without_isolation_a_conflict_names_isolation_venv_as_the_fix():
    from agilerl.registry.install import install_packages

    before = installed_constraints()
    with pytest.raises(EnvPackagesError, match=r"set `isolation: venv`"):
        install_packages(["fsspec==2026.6.0"])
    assert installed_constraints() == before


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("isolation", "docker", "environment.isolation: Input should be 'none' or 'venv'"),
        ("provider", "k8s", "environment.provider: Input should be 'in_process', 'local' or 'ray'"),
        ("replicas", 0, "environment.replicas: replicas takes a whole number from 1 to 1024, or 'auto' (got 0)"),
        ("replicas", "lots", "environment.replicas: replicas takes a whole number from 1 to 1024, or 'auto'"),
    ],
)
def test_a_bad_placement_value_is_a_manifest_error_naming_the_field(tmp_path, field, value, says):
    manifest = tmp_path / "m.yaml"
    environment = {"env_type": "rollout", "entrypoint": "guess", "provider": "local", field: value}
    manifest.write_text(yaml.safe_dump({"environment": environment}))
    with pytest.raises(ManifestError) as exc:
        load_manifest(manifest)
    assert says in str(exc.value)


def test_isolation_venv_cannot_run_in_process():
    with pytest.raises(ValueError, match="isolation 'venv' runs the env in a process of its own"):
        parse_env_spec({"env_type": "rollout", "entrypoint": "guess", "isolation": "venv", "provider": "in_process"})
