"""Shared by the tensor-parallel tests: a random Llama whose 2 KV heads split over 2 ranks."""

from __future__ import annotations

import pytest

from engine.tp.models import TINY_KV2, save_random_llama


@pytest.fixture(scope="session")
def kv2_path(tmp_path_factory) -> str:
    return str(save_random_llama(tmp_path_factory.mktemp("tp") / "llama-kv2", TINY_KV2))
