"""Draw the Teams app icons (teams-manifest/color.png 192x192, outline.png 32x32) without an imaging library.

Teams asks for a full-colour 192x192 icon and a 32x32 outline icon that is white on a transparent background
("App icons for Teams apps"). Both show a document with text lines; run `python scripts/teams_icons.py` to redraw.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

Pixel = tuple[int, int, int, int]
ACCENT: Pixel = (0x5B, 0x5F, 0xC7, 255)  # the manifest's accentColor
WHITE: Pixel = (255, 255, 255, 255)
CLEAR: Pixel = (0, 0, 0, 0)


def png(width: int, height: int, pixels: list[list[Pixel]]) -> bytes:
    """An 8-bit RGBA PNG (PNG spec: signature, IHDR, one zlib IDAT with filter byte 0 per row, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"".join(bytes(p) for p in row) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def document(size: int, background: Pixel, ink: Pixel, *, outline: bool) -> list[list[Pixel]]:
    """A page (filled, or only its border when `outline`) with four text lines, centred in a size x size square."""
    grid = [[background] * size for _ in range(size)]
    left, right = round(size * 0.25), round(size * 0.75)
    top, bottom = round(size * 0.15), round(size * 0.85)
    stroke = max(1, size // 16)
    for y in range(top, bottom):
        for x in range(left, right):
            border = x < left + stroke or x >= right - stroke or y < top + stroke or y >= bottom - stroke
            if border or not outline:
                grid[y][x] = ink
    line_ink = ink if outline else background
    for n in range(4):
        y0 = top + round((bottom - top) * (0.25 + 0.15 * n))
        x1 = right - stroke * 2 - (round(size * 0.1) if n == 3 else 0)
        for y in range(y0, y0 + stroke):
            for x in range(left + stroke * 2, x1):
                grid[y][x] = line_ink
    return grid


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "color.png").write_bytes(png(192, 192, document(192, ACCENT, WHITE, outline=False)))
    (folder / "outline.png").write_bytes(png(32, 32, document(32, CLEAR, WHITE, outline=True)))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "teams-manifest")
