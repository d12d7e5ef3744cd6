"""Draw a maze as an RGB image with PIL.

The image is N*cell_px pixels square. The default theme uses the reference's colours: white
floor, gray (169, 169, 169) walls, the goal a red (255, 0, 0) square filling its square, the agent
a blue (0, 0, 255) circle of radius cell_px/4. Walls depend on the layout: for `cells`, lines along
cell borders, the outer wall included, `wall_thickness(cell_px)` pixels thick (at least 2 from
8 px cells up, so they stay visible in small images); for `blocks`, every wall block is a filled
cell_px square (the reference look: 9x9 blocks at 25 px = 225 px). Drawing order: floor, goal,
walls, agent, then (theme `noise`) pixel noise seeded by `noise_seed`. Same inputs give
byte-identical images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from vlrl.envs.maze.maze import Cell, E, Maze, S
from vlrl.errors import VlrlError

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Theme:
    floor: RGB
    wall: RGB
    agent: RGB
    goal: RGB
    noise: int = 0  # amplitude of uniform per-pixel noise, 0 = none


THEMES: dict[str, Theme] = {
    "default": Theme(floor=(255, 255, 255), wall=(169, 169, 169), agent=(0, 0, 255), goal=(255, 0, 0)),
    "dark": Theme(floor=(28, 28, 36), wall=(200, 200, 210), agent=(90, 170, 255), goal=(255, 90, 90)),
    "pastel": Theme(floor=(255, 246, 228), wall=(176, 160, 206), agent=(120, 160, 235), goal=(240, 140, 140)),
    "noise": Theme(floor=(255, 255, 255), wall=(169, 169, 169), agent=(0, 0, 255), goal=(255, 0, 0), noise=48),
}


def wall_thickness(cell_px: int) -> int:
    """Wall line width in pixels: about cell_px/8, at least 2 for cells of 8 px and more."""
    return max(1, min(cell_px // 4, max(2, cell_px // 8)))


def render(
    maze: Maze, agent_pos: Cell, cell_px: int = 25, theme: str = "default", noise_seed: int | None = None
) -> Image.Image:
    """The maze with the agent at `agent_pos`, as an RGB image of side maze.size * cell_px."""
    if theme not in THEMES:
        raise VlrlError(f"unknown maze theme {theme!r}; known: {', '.join(THEMES)}")
    if cell_px < 4:
        raise VlrlError(f"cell_px must be at least 4, got {cell_px}")
    style = THEMES[theme]
    side = maze.size * cell_px
    image = Image.new("RGB", (side, side), style.floor)
    draw = ImageDraw.Draw(image)

    gr, gc = maze.goal
    draw.rectangle([gc * cell_px, gr * cell_px, (gc + 1) * cell_px - 1, (gr + 1) * cell_px - 1], fill=style.goal)

    if maze.layout == "blocks":
        _draw_wall_blocks(draw, maze, cell_px, style.wall)
    else:
        _draw_wall_lines(draw, maze, cell_px, style.wall)

    ar, ac = agent_pos
    cx, cy, radius = (ac + 0.5) * cell_px, (ar + 0.5) * cell_px, cell_px / 4
    draw.ellipse([cx - radius, cy - radius, cx + radius - 1, cy + radius - 1], fill=style.agent)

    if style.noise:
        rng = np.random.default_rng(0 if noise_seed is None else noise_seed)
        noise = rng.integers(-style.noise, style.noise + 1, size=(side, side, 3), dtype=np.int16)
        pixels = np.asarray(image, dtype=np.int16) + noise
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    return image


def _draw_wall_lines(draw: ImageDraw.ImageDraw, maze: Maze, cell_px: int, wall: RGB) -> None:
    """Cell layout: the outer wall and every closed border between two cells as a line."""
    n, side = maze.size, maze.size * cell_px
    t = wall_thickness(cell_px)

    def band(border: int) -> tuple[int, int]:
        # Pixel span of a wall line centred on a border, kept fully inside the image.
        lo = min(max(border - t // 2, 0), side - t)
        return lo, lo + t - 1

    x0, x1 = band(0)
    draw.rectangle([0, 0, side - 1, t - 1], fill=wall)  # outer wall
    draw.rectangle([0, side - t, side - 1, side - 1], fill=wall)
    draw.rectangle([x0, 0, x1, side - 1], fill=wall)
    draw.rectangle([side - t, 0, side - 1, side - 1], fill=wall)
    for r in range(n):
        for c in range(n):
            if c + 1 < n and not maze.is_open((r, c), E):  # wall between (r, c) and (r, c+1)
                a, b = band((c + 1) * cell_px)
                draw.rectangle([a, band(r * cell_px)[0], b, band((r + 1) * cell_px)[1]], fill=wall)
            if r + 1 < n and not maze.is_open((r, c), S):  # wall between (r, c) and (r+1, c)
                a, b = band((r + 1) * cell_px)
                draw.rectangle([band(c * cell_px)[0], a, band((c + 1) * cell_px)[1], b], fill=wall)


def _draw_wall_blocks(draw: ImageDraw.ImageDraw, maze: Maze, cell_px: int, wall: RGB) -> None:
    """Block layout: every wall block as a filled square."""
    for r in range(maze.size):
        for c in range(maze.size):
            if not maze.is_free((r, c)):
                draw.rectangle([c * cell_px, r * cell_px, (c + 1) * cell_px - 1, (r + 1) * cell_px - 1], fill=wall)


def ascii_maze(maze: Maze, agent_pos: Cell | None = None) -> str:
    """A text drawing for terminals: `A` the agent, `G` the goal, `*` the agent on the goal.

    Cells (left) and blocks (right, two characters a block so it looks square; `##` a wall)::

        +---+---+        ##########
        | A     |        ##A ##G ##
        +   +---+        ##  ##  ##
        |     G |        ##      ##
        +---+---+        ##########
    """
    n = maze.size
    if maze.layout == "blocks":
        return "\n".join("".join(_block_text(maze, (r, c), agent_pos) for c in range(n)) for r in range(n))
    lines = ["+" + "---+" * n]
    for r in range(n):
        row, below = "|", "+"
        for c in range(n):
            here = (r, c)
            mark = (
                "*"
                if here == agent_pos == maze.goal
                else "A"
                if here == agent_pos
                else "G"
                if here == maze.goal
                else " "
            )
            row += f" {mark} " + (" " if c + 1 < n and maze.is_open(here, E) else "|")
            below += ("   " if r + 1 < n and maze.is_open(here, S) else "---") + "+"
        lines += [row, below]
    return "\n".join(lines)


def _block_text(maze: Maze, here: Cell, agent_pos: Cell | None) -> str:
    if not maze.is_free(here):
        return "##"
    return (
        "* " if here == agent_pos == maze.goal else "A " if here == agent_pos else "G " if here == maze.goal else "  "
    )
