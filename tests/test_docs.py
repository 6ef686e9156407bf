"""Documentation that must stay true: every setting is in the README's table, every service has a home."""

from __future__ import annotations

from pathlib import Path

from wolfpack import SERVICES
from wolfpack.settings import describe_settings

ROOT = Path(__file__).resolve().parent.parent


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [var for var, _default, _doc in describe_settings() if f"`{var}`" not in readme]
    assert not missing, f"add to the README configuration table: {missing}"


def test_readme_documents_every_inference_setting() -> None:
    from wolfpack_inference.settings import InferenceSettings

    readme = (ROOT / "README.md").read_text()
    missing = [f"WOLFPACK_INFERENCE_{n.upper()}" for n in InferenceSettings.model_fields]
    missing = [v for v in missing if f"`{v}`" not in readme]
    assert not missing, f"add to the README inference table: {missing}"
    assert all(f.description for f in InferenceSettings.model_fields.values())


def test_every_service_has_server_tests_and_dockerfile() -> None:
    for service in SERVICES:
        folder = ROOT / "services" / service
        assert (folder / f"wolfpack_{service}" / "server.py").is_file(), service
        assert (folder / "Dockerfile").is_file(), service
        assert service in (ROOT / "docs" / "architecture.md").read_text()


def test_readme_commands_exist_in_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("setup:", "demo:", "test:"):
        assert f"\n{target}" in makefile
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
