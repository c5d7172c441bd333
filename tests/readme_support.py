"""The docs as data: the `so101d ...` commands, config keys, Python snippets, repo paths and links a page shows.

A page is README.md or any Markdown file under docs/ (``PAGES``); every extractor takes a page's
text (README.md's when none is given). Used by test_readme.py (every name a page shows exists,
every link resolves) and test_readme_walkthrough.py (the commands run as written). Nothing here
knows which commands or keys *should* exist: that is asked of the real parser
(daemon.apps.cli.build_parser) and the real schema (daemon.config.settings).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
# Written by a generator from the control API's schema, and checked by that generator's own test.
GENERATED = DOCS / "reference"


def pages() -> list[Path]:
    """README.md, then every hand-written Markdown page under docs/ (sorted)."""
    found = sorted(p for p in DOCS.rglob("*.md") if GENERATED not in p.parents)
    return [README, *found]


def page_name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def page_text(page: Path = README) -> str:
    return page.read_text(encoding="utf-8")


def all_pages_text() -> str:
    return "\n".join(page_text(p) for p in pages())


def section(heading: str) -> tuple[Path, str]:
    """The page holding the one heading that starts with ``heading``, and that section's text
    (up to the next heading of the same or a higher level)."""
    found = []
    for page in pages():
        lines = page_text(page).splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^(#+) (.*)$", line)
            if m and m.group(2).startswith(heading):
                level = len(m.group(1))
                end = next(
                    (j for j in range(i + 1, len(lines)) if re.match(rf"^#{{1,{level}}} ", lines[j])), len(lines)
                )
                found.append((page, "\n".join(lines[i:end])))
    assert len(found) == 1, (
        f"heading {heading!r} is on {len(found)} pages/places, not one: {[page_name(p) for p, _ in found]}"
    )
    return found[0]


_FENCE = re.compile(r"^```(\w*)\s*$")
_INLINE = re.compile(r"`([^`\n]+)`")
# `so101d` at the start of a command: line/span start, or after sudo, a venv's bin/, `&&`.
_COMMAND_START = re.compile(r"(?:^|(?<=&& )|(?<=sudo ))(?:\.venv/bin/)?so101d(?=\s|$)")


@dataclass(frozen=True)
class Snippet:
    """One piece of the README: a code block line (joined across ``\\``), or an inline code span."""

    text: str
    line: int  # 1-based line in README.md where it starts
    kind: str  # "block" (fenced/indented shell), "python" (fenced python), "inline"
    section: str  # the nearest heading above it


@dataclass(frozen=True)
class Command:
    """A `so101d ...` command as the README shows it, and the concrete argv lists it stands for."""

    text: str  # what the README shows, comment stripped
    line: int
    kind: str
    section: str
    variants: tuple[tuple[str, ...], ...]  # argv after `so101d`, one per alternative shown


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def snippets(text: str | None = None) -> list[Snippet]:
    """Every code block line and inline code span, with its line number and section."""
    text = readme_text() if text is None else text
    out: list[Snippet] = []
    section = ""
    fence: str | None = None
    pending = ""  # a block line continued with a trailing backslash
    pending_line = 0
    prev_blank = True
    in_indented = False
    for n, raw in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(raw.strip())
        if m and raw.startswith("```"):
            fence = None if fence is not None else (m.group(1) or "text")
            continue
        if fence is not None:
            out.append(Snippet(raw, n, "python" if fence == "python" else "block", section))
            continue
        if raw.startswith("#"):
            section = raw.lstrip("#").strip()
        # An indented block: 4+ spaces after a blank line (or continuing one).
        indented = raw.startswith("    ") and raw.strip() != "" and (prev_blank or in_indented)
        in_indented = indented
        prev_blank = raw.strip() == ""
        if indented:
            body = raw.strip()
            if pending:
                body = pending + " " + body
            if body.endswith("\\"):
                pending, pending_line = body[:-1].rstrip(), pending_line or n
                continue
            out.append(Snippet(body, pending_line or n, "block", section))
            pending, pending_line = "", 0
            continue
        for span in _INLINE.findall(raw):
            out.append(Snippet(span, n, "inline", section))
    # Fenced shell blocks can continue lines too: join them.
    joined: list[Snippet] = []
    carry: Snippet | None = None
    for s in out:
        if s.kind == "block" and carry is not None:
            s = Snippet(carry.text + " " + s.text.strip(), carry.line, "block", carry.section)
            carry = None
        if s.kind == "block" and s.text.rstrip().endswith("\\"):
            carry = Snippet(s.text.rstrip()[:-1].rstrip(), s.line, s.kind, s.section)
            continue
        joined.append(s)
    return joined


def _strip_comment(text: str) -> str:
    # A shell comment: `#` at a word start outside quotes (none of our commands quote a `#`).
    m = re.search(r"(?:^|\s)#", text)
    return text[: m.start()].rstrip() if m else text.rstrip()


def _variants(args_text: str) -> list[tuple[str, ...]]:
    """`status [--json] [--watch]` -> every option shown at least once; `a|b` -> one variant each."""
    groups = re.findall(r"\[([^\]]*)\]", args_text)
    base = re.sub(r"\s*\[[^\]]*\]", "", args_text)
    texts = [base]
    if groups:
        texts.append(base + " " + " ".join(g.split("|")[0].strip() for g in groups))
        for g in groups:
            for alt in g.split("|"):
                texts.append(base + " " + alt.strip())
    out: list[tuple[str, ...]] = []
    for t in texts:
        tokens = shlex.split(t)
        # Unbracketed alternatives (`start|stop`, `--success|--failure`): one variant per choice.
        width = max((len(tok.split("|")) for tok in tokens), default=1)
        for i in range(width):
            v = tuple(tok.split("|")[min(i, len(tok.split("|")) - 1)] if "|" in tok else tok for tok in tokens)
            if v not in out:
                out.append(v)
    return out


def commands(text: str | None = None) -> list[Command]:
    """Every `so101d ...` command in a code block or inline code span."""
    found: list[Command] = []
    for s in snippets(text):
        if s.kind == "python":
            continue
        body = _strip_comment(s.text.strip())
        for part in re.split(r"\s*(?:&&|;)\s*", body):
            m = _COMMAND_START.search(part.strip())
            if m is None or (m.start() != 0 and not part.strip().startswith(("sudo ", ".venv/bin/"))):
                continue
            rest = part.strip()[m.end() :].strip()
            # An inline span closing a sentence like "`so101d teleop start` clears it" ends at the span.
            found.append(Command(part.strip(), s.line, s.kind, s.section, tuple(_variants(rest))))
    return found


# ---------------------------------------------------------------------------------------------
# configuration keys
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigKey:
    section: str  # "follower", "cameras.front", or "" when the README names a bare setting
    key: str
    line: int
    how: str  # the README text it came from


_FILE_SUFFIXES = {"py", "toml", "json", "jsonl", "md", "conf", "sock", "hdf5", "rules", "service"}
_UNIT_SUFFIX = re.compile(r"^[a-z]+(?:_[a-z0-9]+)*_(?:s|ms|deg|deg_s|pct|pct_s|hz|c|ticks|bytes)$")


def config_keys(known_sections: set[str], text: str | None = None) -> list[ConfigKey]:
    """Config keys the README names, in any of the forms it uses.

    ``known_sections`` (the schema's section names) tells a dotted `section.key` from a dotted
    feature or file name (`observation.state`, `safety.py`); every bracketed `[section] key`
    form is taken as a key whatever the section, so a renamed section cannot slip through.
    """
    text = readme_text() if text is None else text
    keys: list[ConfigKey] = []
    lines = text.splitlines()
    for n, raw in enumerate(lines, start=1):
        # `[section] key = value  key2 = value2`, in code or prose
        for m in re.finditer(r"\[([a-z_]+(?:\.[a-z_]+)?)\]\s+((?:[a-z_]+\s*=\s*(?:\"[^\"]*\"|[^\s\"`]+)\s*)+)", raw):
            for k in re.findall(r"([a-z_]+)\s*=", m.group(2)):
                keys.append(ConfigKey(m.group(1), k, n, m.group(0)))
        # `[section] key` inline (no value), e.g. "`[recording] on_shutdown`"
        for m in re.finditer(r"`\[([a-z_]+(?:\.[a-z_]+)?)\] ([a-z_]+)`", raw):
            keys.append(ConfigKey(m.group(1), m.group(2), n, m.group(0)))
        # `key = value` under [section]
        for m in re.finditer(r"`([a-z_]+) = [^`]*` under \[([a-z_]+)\]", raw):
            keys.append(ConfigKey(m.group(2), m.group(1), n, m.group(0)))
        # [section] keys: a, b, c.
        for m in re.finditer(r"\[([a-z_]+)\] keys: ([a-z_, ]+)", raw):
            for k in m.group(2).split(","):
                if k.strip():
                    keys.append(ConfigKey(m.group(1), k.strip(), n, m.group(0)))
        for span in _INLINE.findall(raw):
            span = span.strip()
            # `section.key` or `section.key = value`
            m = re.fullmatch(r"([a-z_]+)\.([a-z_]+)(?:\s*=\s*.+)?", span)
            if m and m.group(1) in known_sections and m.group(2) not in _FILE_SUFFIXES:
                keys.append(ConfigKey(m.group(1), m.group(2), n, span))
            # a bare setting-like name with a unit suffix (`reply_margin_s`): must be a key somewhere
            elif _UNIT_SUFFIX.fullmatch(span):
                keys.append(ConfigKey("", span, n, span))
    return keys


# ---------------------------------------------------------------------------------------------
# links between pages
# ---------------------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str | None = None) -> list[tuple[str, int]]:
    """Markdown link and image targets outside code (`[text](target)`), with their line."""
    text = readme_text() if text is None else text
    out = []
    fence = False
    for n, raw in enumerate(text.splitlines(), start=1):
        if raw.startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for m in _LINK.finditer(_INLINE.sub("", raw)):
            out.append((m.group(1), n))
    return out


def anchors(text: str) -> set[str]:
    """The `#anchor` every heading of a page gets on GitHub: lower case, punctuation dropped,
    spaces to hyphens (a repeated heading gets -1, -2, ...)."""
    out: set[str] = set()
    fence = False
    for raw in text.splitlines():
        if raw.startswith("```"):
            fence = not fence
        m = re.match(r"^#+ (.*)$", raw)
        if fence or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        base, i = slug, 1
        while slug in out:
            slug, i = f"{base}-{i}", i + 1
        out.add(slug)
    return out


# ---------------------------------------------------------------------------------------------
# paths and Python names
# ---------------------------------------------------------------------------------------------
REPO_DIRS = ("daemon", "drivers", "calibration", "sim_bridge", "systemd", "bench", "tests", ".ci", "docs")


def repo_paths(text: str | None = None) -> list[tuple[str, int]]:
    """Repository paths the README names (`daemon/config/settings.py`, `bench/bench_sim.py`, ...)."""
    text = readme_text() if text is None else text
    out: list[tuple[str, int]] = []
    pattern = re.compile(r"(?<![\w/.~-])((?:{})/[\w./-]*)".format("|".join(re.escape(d) for d in REPO_DIRS)))
    for n, raw in enumerate(text.splitlines(), start=1):
        for m in pattern.finditer(raw):
            path = m.group(1).rstrip(".,:;)")
            out.append((path, n))
        # The layout table: | `folder/` | ... `name.py` ... `sub/` ... (names relative to the folder)
        row = re.match(r"\|\s*`([\w.]+/)`\s*\|(.*)\|\s*$", raw)
        if row:
            for span in _INLINE.findall(row.group(2)):
                if re.fullmatch(r"[\w.-]+(?:/[\w.-]+)*(?:\.\w+|/)", span) and not span.startswith(row.group(1)):
                    out.append((row.group(1) + span, n))
    return out


def dotted_python_names(text: str | None = None) -> list[tuple[str, int]]:
    """`package.module.Name` spans naming our packages or LeRobot's (two dots or more)."""
    text = readme_text() if text is None else text
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        for span in _INLINE.findall(raw):
            if re.fullmatch(r"(?:daemon|drivers|calibration|sim_bridge|lerobot)(?:\.\w+){2,}", span):
                out.append((span, n))
    return out


def python_blocks(text: str | None = None) -> list[tuple[str, int]]:
    """The fenced ```python blocks, whole, with their first line number."""
    blocks: dict[int, list[str]] = {}
    starts: list[int] = []
    last = -10
    for s in snippets(text):
        if s.kind != "python":
            continue
        if s.line != last + 1:
            starts.append(s.line)
            blocks[s.line] = []
        blocks[starts[-1]].append(s.text)
        last = s.line
    return [("\n".join(blocks[k]), k) for k in starts]
