"""The layer-scale stack plot on a real demo run, in headless Chromium.

Reads the quick demo's vanishing-gradient run (the real ``Introspect`` callback, trained
once per session), serves it with a real TensorBoard and checks that the gradient stack
draws one band per layer: hovering the middle of each band, bottom to top, names each layer with
weights once, in depth order; a click opens that layer in the Layers view.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.browser_session import FINDINGS_READ_JS
from tests.browser.browser_support import launch_chromium, next_paint, plugin_frame, tensorboard

pytestmark = pytest.mark.browser

RUN = "4_vanishing_sigmoid_mlp"  # of the session's quick demo (conftest.py)


def inside(box: dict, fx: float, share: float) -> dict:
    """The point of the plot at ``fx`` of its width and ``share`` of its height from the
    bottom, at least two pixels inside its edges."""
    y = np.clip((1 - share) * box["height"], 2, box["height"] - 2)
    return {"x": fx * box["width"], "y": float(y)}


def test_gradient_stack_has_one_band_per_layer(trained) -> None:
    from playwright.sync_api import sync_playwright

    with tensorboard(trained.demo, wait_runs=4, reload=False) as tb, sync_playwright() as p:
        ov = tb.get_json(f"overview?run={RUN}")["views"]["gradient"]
        layers_with_weights = list(dict.fromkeys(t["layer"] for t in ov["tensors"]))
        bands = ov["stack_layers"]
        # One band per layer (8 sigmoid layers + the classifier), not per tensor (18).
        assert [b["layer"] for b in bands] == layers_with_weights
        assert len(bands) == 9 and len(ov["tensors"]) == 18
        stack = np.array(ov["stack"], dtype=float)
        assert stack[0, -1] < stack[-1, -1] / 5  # the thin first-layer band of vanishing

        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(tb.url + f"#introspect&p.introspect.run={RUN}")
        frame = plugin_frame(page)
        chart = frame.locator('.chart[data-chart="gradient-stack"]')
        chart.wait_for(timeout=60_000)
        frame.wait_for_selector("html[data-status=ready]", timeout=30_000)
        frame.wait_for_function(FINDINGS_READ_JS, timeout=60_000)
        assert f"one band per layer ({len(bands)})" in chart.locator(".chart-sub").text_content()
        over = chart.locator(".u-over")
        over.scroll_into_view_if_needed()
        # The last point is at the right edge; hover a little inside it.
        fx = 0.995
        mids = np.cumsum(stack[:, -1]) - stack[:, -1] / 2
        named = []
        for mid in mids:
            # Enter the plot afresh for each band (uPlot measures the plot's place on entering
            # it), two pixels inside its edges: the axis below starts where the plot ends, at a
            # fraction of a pixel, and the first band's middle lies a pixel or two above it.
            box = over.bounding_box()
            over.hover(position={"x": fx * box["width"], "y": -5}, force=True)
            over.hover(position=inside(box, fx, mid))
            next_paint(frame)
            name = chart.locator(".readout .layer-name")
            assert name.count() == 1, (
                f"no layer named at share {mid:.4f} of {box}: "
                f"{chart.locator('.readout').text_content()!r}")
            named.append(name.text_content().split(" · ")[0])
        assert named == [b["layer"] for b in bands]
        # A click on the bottom band opens the first layer's gradient in the Layers view.
        over.click(position=inside(over.bounding_box(), fx, mids[0]))
        frame.wait_for_selector(".panel.focused", timeout=30_000)
        assert frame.locator(".panel.focused").get_attribute("data-tag") == bands[0]["tag"]
        browser.close()
