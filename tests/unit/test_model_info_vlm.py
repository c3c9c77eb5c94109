"""Model info of a VLM reports what its processor really does: the size it crops images to and the
number of image tokens it inserts, not the vision tower's pretraining size (`vision_config.image_size`)."""
from __future__ import annotations

import pytest
from PIL import Image

from analysis.model_access import anatomy, tiny_models
from analysis.model_access.models import ModelSpec, describe, load_model


def _inserted(handle, image: Image.Image) -> tuple[int, tuple[int, ...]]:
    """Image tokens the processor puts into a one-image prompt, and the pixel shape it hands the tower."""
    enc = handle.processor(images=[image], text=[anatomy.image_prompt(handle, "describe")], return_tensors="pt")
    return int((enc["input_ids"][0] == anatomy.image_token_id(handle)).sum()), tuple(enc["pixel_values"].shape)


@pytest.fixture(scope="module")
def cropping_llava(model_root):
    """A tiny LLaVA whose tower is built for 64 px (8 x 8 patches of 8 px: 64 tokens) but whose
    processor crops every image to 32 px (4 x 4 patches: 16 tokens), like a real LLaVA whose tower
    was pretrained at 518 px and whose processor crops to 224."""
    from transformers import AutoProcessor

    folder = tiny_models.save_tiny_llava(model_root / "tiny-llava-crop", image_size=64, patch=8)
    processor = AutoProcessor.from_pretrained(folder)
    processor.image_processor.size = {"shortest_edge": 32}
    processor.image_processor.crop_size = {"height": 32, "width": 32}
    processor.save_pretrained(folder)
    return load_model(ModelSpec("local", str(folder)))


def test_image_tokens_are_what_the_processor_inserts_not_the_towers_size(cropping_llava):
    h = cropping_llava
    assert h.model.config.vision_config.image_size == 64  # what the old info reported (and 64 tokens)
    for size in ((300, 200), (32, 32), (90, 500)):
        tokens, pixels = _inserted(h, Image.new("RGB", size, (10, 200, 30)))
        assert tokens == h.info.image_tokens == 16
        assert pixels[-2:] == (h.info.image_size, h.info.image_size) == (32, 32)
    assert ("Image", "32 px, 16 image tokens") in h.info.rows()


def test_a_processor_that_keeps_the_images_resolution_reports_no_fixed_count():
    model, _, processor = tiny_models.build_tiny("llava-next")  # tiles: more tokens for bigger images
    handle = type("H", (), {"model": model, "processor": processor, "tokenizer": processor.tokenizer})()
    counts = {_inserted(handle, Image.new("RGB", size))[0] for size in ((28, 28), (28, 56))}
    assert len(counts) == 2
    info = describe(model, "vlm", processor=processor)
    assert info.image_tokens is None
    assert dict(info.rows())["Image"].endswith("image tokens set by the size")


def test_without_a_processor_the_towers_config_is_all_there_is():
    model, _, _ = tiny_models.build_tiny("llava")
    info = describe(model, "vlm", processor=None)
    vc = model.config.vision_config
    assert info.image_size == vc.image_size and info.image_tokens == (vc.image_size // vc.patch_size) ** 2


def test_the_demo_vlm_is_unchanged():
    from analysis.model_access.models import zoo_models

    if "shapes-vlm" not in zoo_models():
        pytest.skip("needs the demo zoo")
    h = load_model(ModelSpec("zoo", "shapes-vlm"))
    assert (h.info.image_size, h.info.image_tokens) == (63, 9)  # one 21-px patch per grid cell
    tokens, pixels = _inserted(h, Image.new("RGB", (64, 64)))
    assert tokens == 9 and pixels[-1] == 63
