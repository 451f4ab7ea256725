"""The ACE-Step processors' attention-backend lookup (`acestep_wrappers._attention_backend`):
the stock function's answer for every processor state, installed by the loader's processor
setup, and an enum member passed through as is (the graph break it avoids in torch 2.11)."""

from __future__ import annotations

import pytest
from diffusers.models import attention_dispatch
from diffusers.models.transformers import ace_step_transformer

from hotstep_ray.models import acestep_wrappers
from hotstep_ray.models.acestep_wrappers import KeyPaddingMasks, PaddedKeyAttnProcessor

Name = attention_dispatch.AttentionBackendName
STOCK = ace_step_transformer._get_current_attention_backend  # before any install in this file


def _processor(backend):
    processor = PaddedKeyAttnProcessor(KeyPaddingMasks())
    processor._attention_backend = backend
    return processor


@pytest.mark.parametrize("backend", [None, Name.NATIVE, Name.FLASH, "flash_varlen", "native"])
def test_same_answer_as_diffusers(backend):
    processor = _processor(backend)
    assert acestep_wrappers._attention_backend(processor) is STOCK(processor)
    assert acestep_wrappers._attention_backend(None) is STOCK(None)


def test_a_member_is_returned_without_calling_the_enum(monkeypatch):
    calls = []
    real = type(Name).__call__

    def spy(cls, *args, **kwargs):
        if cls is Name:
            calls.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(type(Name), "__call__", spy)
    for backend in (Name.NATIVE, None):  # a processor's own member, the registry's
        assert acestep_wrappers._attention_backend(_processor(backend)) is STOCK(
            _processor(backend)
        )
    assert len(calls) == 2  # the stock lookups only: the spy sees what ours does not do
    assert acestep_wrappers._attention_backend(_processor("native")) is Name.NATIVE
    assert len(calls) == 3  # a string still goes through the enum


def test_the_loader_setup_installs_it(monkeypatch):
    import torch

    monkeypatch.setattr(ace_step_transformer, "_get_current_attention_backend", STOCK)

    class Tiny(torch.nn.Module):
        def set_attn_processor(self, processor):
            self.processor = processor

    acestep_wrappers.install_padded_key_processor(Tiny())
    assert (
        ace_step_transformer._get_current_attention_backend is acestep_wrappers._attention_backend
    )
    # the stock flash check (also what modeling_ace_step imports) looks the name up in that
    # module at call time, so it goes through ours (a canary on diffusers' internals: if an
    # upgrade binds the name at import, the patch no longer reaches it)
    check = ace_step_transformer._is_flash_attention_backend
    assert check.__globals__ is vars(ace_step_transformer)
    assert "_get_current_attention_backend" in check.__code__.co_names
