"""Rendering the report's blocks as markdown and as one self-contained HTML page (its plots
embedded as data URIs, so the page alone can be copied, mailed or attached)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

# ("h2", text) | ("p", text) | ("list", items) | ("table", header, rows) | ("img", file, alt)
Block = tuple[Any, ...]

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for b in blocks:
        if b[0] in ("h1", "h2"):
            lines += ["#" * int(b[0][1]) + " " + b[1], ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "list":
            lines += [f"- {item}" for item in b[1]] + [""]
        elif b[0] == "img":
            lines += [f"![{b[2]}]({b[1]})", ""]
        elif b[0] == "table":
            header, rows = b[1], b[2]
            lines.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            lines.append("|" + "---|" + "---:|" * (len(header) - 1))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;\
color:#222}h1,h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}th,td{border:1px solid #ccc;
padding:.3em .7em}td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}img{max-width:100%;display:block;
margin:1em 0}code{background:#f3f3f3;padding:0 .2em}"""


def _html_text(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _image_src(folder: Path | None, name: str) -> str:
    """The plot `name` of `folder` as a data URI; its file name where there is no folder."""
    if folder is None:
        return name
    data = base64.b64encode((Path(folder) / name).read_bytes()).decode("ascii")
    return f"data:image/png;base64,{data}"


def render_html(blocks: list[Block], folder: Path | None = None) -> str:
    """One HTML page of `blocks`, the PNG plots read from `folder` and embedded in it."""
    e = html.escape
    body: list[str] = []
    for b in blocks:
        if b[0] in ("h1", "h2"):
            body.append(f"<{b[0]}>{e(b[1])}</{b[0]}>")
        elif b[0] == "p":
            body.append(f"<p>{_html_text(b[1])}</p>")
        elif b[0] == "list":
            body.append("<ul>" + "".join(f"<li>{_html_text(item)}</li>" for item in b[1])
                        + "</ul>")
        elif b[0] == "img":
            body.append(f'<img src="{e(_image_src(folder, b[1]))}" alt="{e(b[2])}">')
        elif b[0] == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                           for row in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>bertgpu report</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")

