"""The HTML report: self-contained, with tables, graph code, kernels and diagrams; rendered by headless Chromium."""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest


def test_html_report_is_self_contained_with_tables_code_kernels_and_diagrams(cli_run):
    proc, html_path = cli_run
    assert f"HTML report: {html_path}" in proc.stdout
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "src=" not in page and "<link" not in page  # nothing external
    assert page.count("<table>") >= 5
    for text in ("compile time by stage", "graph breaks", "recompiles", "failing guard", "two_regions.py:",
                 "sin = torch.sin(x)", "fused_max_exp_sum_0", 'extern &quot;C&quot; void fused_max_exp_sum_0',
                 "def call("):
        assert text in page, text
    assert page.count("<svg") >= 4  # captured graphs and fused graphs


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the decoded scanlines): a blank page has only a few."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[: 4 * width * min(height, 600)]))


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(cli_run, tmp_path):
    _, html_path = cli_run
    shot = tmp_path / "report.png"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900", f"--screenshot={shot}",
           html_path.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == (1200, 900)
    assert colours > 20  # text, tables and bars drawn, not a blank page
    # the DOM chromium built has the report's tables and the inline SVG diagrams
    dom = subprocess.run([*cmd[:-2], "--dump-dom", html_path.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count("<table>") >= 5 and "<svg" in dom and "compiled region" in dom
