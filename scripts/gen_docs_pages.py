"""Pages of the documentation site generated at build time (run by mkdocs-gen-files, see mkdocs.yml).

- ``index.md``: the README, its links into ``docs/`` made relative to the site;
- ``reference/config.md``: every config key from the dataclasses of :mod:`serl.config`, with its
  type, its default and the ``#:`` comment above the field, one table per section, in the order
  of :class:`serl.config.Config`. Nothing here is hand-written, so the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from serl import config as serl_config  # noqa: E402  (a leaf package: imports nothing heavy)


# ------------------------------------------------------------------ the home page: the README
#: the README's quickstart, from its snippet marker to the next section (its pointers included)
QUICKSTART = re.compile(r"<!-- --8<-- \[start:quickstart\] -->.*?<!-- --8<-- \[end:quickstart\] -->.*?(?=\n## )", re.S)


def home_page(readme: str) -> str:
    """The README with ``docs/X`` links and images pointing at ``X`` (the site's root is docs/),
    its quickstart (the two commands, their times, what they print) replaced by a pointer: the
    site shows it once, on the getting-started page, which includes it from the README."""
    if not QUICKSTART.search(readme):
        raise ValueError("README.md: the quickstart markers (--8<-- [start:quickstart] / [end:quickstart]) are missing")
    readme = QUICKSTART.sub("The two commands (install and train; install and run the tests), their times per CPU "
                            "kind and what the first one prints: [Getting started](getting-started.md).\n", readme)
    return re.sub(r"\]\(docs/", "](", readme)


# ------------------------------------------------------------------ the config reference
def field_comments(cls: type) -> dict[str, str]:
    """``{field: text of the #: comment lines right above it}`` for the dataclass ``cls``."""
    lines, _ = inspect.getsourcelines(cls)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    out = {}
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment, i = [], node.lineno - 2  # 0-based index of the line above the field
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            out[node.target.id] = " ".join(comment)
    return out


def yaml_value(v) -> str:
    """A default as one would write it in a recipe or a ``key=value`` override."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v else "''"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def markdown(text: str) -> str:
    """The docstrings' reST markup as Markdown: ``:class:`~a.B``` -> `B`, ````x```` -> `x`."""
    text = re.sub(r":(?:class|mod|func|meth|attr|data|exc|obj):`~([^`]*\.)?([^`.]+)`", r"`\2`", text)
    text = re.sub(r":(?:class|mod|func|meth|attr|data|exc|obj):`([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def cell(text: str) -> str:
    """Markdown table cell: pipes outside code spans escaped, no line breaks."""
    parts = re.split(r"(`[^`]*`)", markdown(text).replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("|", r"\|") for p in parts)


def section(prefix: str, cls: type, out: list[str]) -> None:
    """One table for the dataclass ``cls`` at key ``prefix``, then one per nested section."""
    doc = inspect.getdoc(cls)
    own_doc = doc if doc and cls.__doc__ else ""  # dataclasses invent a signature docstring
    out += [f"## `{prefix}`", "", f"Class `{cls.__module__}.{cls.__qualname__}`.", ""]
    if own_doc:
        out += [markdown(own_doc), ""]
    comments, nested = field_comments(cls), []
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        key = f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(default):
            nested.append((key, type(default)))
            shown = f"section [`{key}`](#{key.replace('.', '')})"
        else:
            shown = "required" if default is dataclasses.MISSING else f"`{yaml_value(default)}`"
        out.append(f"| `{key}` | `{hints[f.name]}` | {shown} | {cell(comments.get(f.name, ''))} |")
    out.append("")
    for key, sub in nested:
        section(key, sub, out)


def config_page() -> str:
    out = ["# Configuration reference", "",
           "Generated from the config dataclasses in `serl/config/` when the site is built: every key, its type, "
           "its default and the comment above the field in the code. A recipe (YAML) or a `key=value` override on "
           "the command line sets any of them; an unknown key or a bad value stops the run at start-up with an "
           "error naming the key. Recipes: [Recipes](../recipes.md).", "",
           markdown(inspect.getdoc(serl_config)), ""]
    for f in dataclasses.fields(serl_config.Config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            section(f.name, type(default), out)
    top = [f for f in dataclasses.fields(serl_config.Config)
           if not dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING else None)]
    if top:
        comments = field_comments(serl_config.Config)
        out += ["## Top-level keys", "", "| key | type | default | description |", "|---|---|---|---|"]
        for f in top:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append(f"| `{f.name}` | `{f.type}` | `{yaml_value(default)}` | {cell(comments.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out)


with mkdocs_gen_files.open("index.md", "w") as fh:
    fh.write(home_page((ROOT / "README.md").read_text()))
mkdocs_gen_files.set_edit_path("index.md", "../README.md")

with mkdocs_gen_files.open("reference/config.md", "w") as fh:
    fh.write(config_page())
