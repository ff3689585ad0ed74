"""The SVG renderer of the dashboard: well-formed, escaped, accessible charts whose
bars and points sit where their values say."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from celery_zsched.contrib.django import svg

NS = {"s": "http://www.w3.org/2000/svg"}


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # raises on anything not well-formed


@pytest.mark.parametrize(("value", "ceiling"), [
    (0, 1), (-3, 1), (float("nan"), 1), (1, 1), (1.2, 2), (2, 2), (2.1, 2.5), (3, 5),
    (7, 10), (10, 10), (11, 20), (0.03, 0.05), (999_999, 1_000_000)])
def test_nice_ceiling_is_the_next_round_number(value: float, ceiling: float) -> None:
    assert svg.nice_ceiling(value) == pytest.approx(ceiling)


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (12, "12"), (1200, "1.2k"),
                                             (2_500_000, "2.5M"), (0.5, "0.5")])
def test_numbers_are_short(value: float, text: str) -> None:
    assert svg.number(value) == text


def test_bar_heights_are_proportional_and_every_bar_has_a_tooltip() -> None:
    root = parse(svg.bar_chart([10, 5, 0], ["a", "b", "c"], ["ten", "five", "none"],
                               title="T", desc="D", y_label="jobs"))
    bars = root.findall("s:rect[@class='bar']", NS)
    heights = [float(bar.get("height", "")) for bar in bars]
    assert heights[0] == pytest.approx(2 * heights[1]) and heights[2] == 0
    assert [bar.findtext("s:title", namespaces=NS) for bar in bars] == ["ten", "five", "none"]
    assert root.get("role") == "img"
    labelled = (root.get("aria-labelledby") or "").split()
    assert [root.find(f".//*[@id='{i}']", NS) is not None for i in labelled] == [True, True]


def test_text_is_escaped() -> None:
    markup = svg.bar_chart([1], ["<b>"], ["<script>alert(1)</script>"],
                           title="a & b", desc="<desc>", y_label="\"y\"")
    root = parse(markup)
    assert "<script>" not in markup
    assert root.findtext("s:title", namespaces=NS) == "a & b"
    hover = root.findtext("s:rect[@class='bar']/s:title", namespaces=NS)
    assert hover == "<script>alert(1)</script>"


def test_stacked_segments_add_up_to_the_total() -> None:
    layers = [svg.Series("ok", [3, 0], "#0a0"), svg.Series("bad", [1, 2], "#a00")]
    root = parse(svg.stacked_bars(layers, ["h1", "h2"], title="T", desc="D", y_label="n"))
    bars = root.findall("s:rect[@class='bar']", NS)
    # A zero segment draws nothing: three segments for four values.
    assert [b.findtext("s:title", namespaces=NS) for b in bars] == ["h1: 3 ok", "h1: 1 bad",
                                                                   "h2: 2 bad"]
    first = [float(b.get("height", "")) for b in bars[:2]]
    assert first[0] == pytest.approx(3 * first[1])
    # The first segment stacks on the baseline, the second on top of it.
    assert float(bars[1].get("y", "")) + first[1] == pytest.approx(float(bars[0].get("y", "")))


def test_a_missing_value_breaks_the_line() -> None:
    line = svg.Series("p50", [1.0, 2.0, None, 4.0], "#00f")
    root = parse(svg.line_chart([line], ["a", "b", "c", "d"], title="T", desc="D",
                                y_label="s", unit=" s"))
    assert len(root.findall("s:polyline", NS)) == 2
    points = root.findall("s:circle", NS)
    assert [p.findtext("s:title", namespaces=NS) for p in points] == [
        "a: p50 1 s", "b: p50 2 s", "d: p50 4 s"]


def test_unequal_lengths_name_the_series() -> None:
    with pytest.raises(ValueError, match="labels has 2, p99 has 3"):
        svg.line_chart([svg.Series("p99", [1, 2, 3], "#000")], ["a", "b"], title="T",
                       desc="D", y_label="s")
