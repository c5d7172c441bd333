"""Everything the docs name exists: README.md and every page under docs/ cannot drift from the code.

A new user copies commands, keys and imports from the README and the pages it links. Each one is
checked against the real thing, never against a list kept here: `so101d ...` commands are parsed
by the real parser (daemon.apps.cli.build_parser), config keys are looked up in
daemon.config.settings's dataclasses and in the shipped example configuration, Python blocks are
compiled and their imports imported, dotted names resolved, repository paths stat'ed, links and
their `#anchors` followed. Each check runs once per page (``PAGES``). The last tests feed the
checks drifted lines (as once found in the README) and a page with a bad command, key, path, name
and link, so they are known to catch them.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import tomllib
import typing
from pathlib import Path

import pytest
from readme_support import (
    README,
    REPO,
    Command,
    ConfigKey,
    anchors,
    commands,
    config_keys,
    dotted_python_names,
    links,
    page_name,
    page_text,
    pages,
    python_blocks,
    repo_paths,
    section,
    snippets,
)

import daemon.config.settings as config_module
from daemon.apps.cli import build_parser

EXAMPLE_TOML = REPO / "daemon/configs/so101d.example.toml"
PAGES = pages()
PAGE_IDS = [page_name(p) for p in PAGES]
README_MAX_LINES = 250


# ---------------------------------------------------------------------------------------------
# the real schema and parser
# ---------------------------------------------------------------------------------------------
# Config's tables of tables ([cameras.<name>], [arms.<side>]): a page's `[cameras.front]` is "cameras.*"
TABLES_OF_TABLES = {n for n, tp in typing.get_type_hints(config_module.Config).items() if typing.get_origin(tp) is dict}


def _section_of(name: str) -> str:
    """ "cameras.front" -> "cameras.*" (a table of tables), "follower" -> "follower"."""
    prefix, dot, _ = name.partition(".")
    return f"{prefix}.*" if dot and prefix in TABLES_OF_TABLES else name


def _schema() -> dict[str, set[str]]:
    """Section -> keys, from daemon.config.settings.Config's dataclasses ("cameras.*" for a camera table)."""
    hints = typing.get_type_hints(config_module.Config)
    out: dict[str, set[str]] = {}
    for name, tp in hints.items():
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            name = f"{name}.*"
        out[name] = {f.name for f in dataclasses.fields(tp)}
    return out


def _example() -> dict[str, set[str]]:
    """Section -> keys in the shipped example, the commented tables of tables included."""
    text = EXAMPLE_TOML.read_text()
    data = tomllib.loads(text)
    out = {section: set(values) for section, values in data.items() if isinstance(values, dict)}
    # A camera table and a pair's table are shown commented out (none by default): read them uncommented.
    for m in re.finditer(r"^# \[([a-z_]+)\.\w+\]\n((?:# [a-z_]+ = .*\n)+)", text, re.M):
        body = "\n".join(line[2:] for line in m.group(2).splitlines())
        out.setdefault(f"{m.group(1)}.*", set()).update(tomllib.loads(body))
    return out


def _key_problems(keys: list[ConfigKey], page: str = "README.md") -> list[str]:
    schema, example = _schema(), _example()
    problems = []
    for k in keys:
        section = _section_of(k.section)
        where = f"{page}:{k.line} ({k.how!r})"
        if not section:
            if not any(k.key in keys_ for keys_ in schema.values()):
                problems.append(f"{where}: '{k.key}' is not a configuration key in any section")
            continue
        if section not in schema:
            problems.append(f"{where}: no section [{k.section}] in daemon/config/settings.py")
        elif k.key not in schema[section]:
            problems.append(f"{where}: [{k.section}] has no key '{k.key}' in daemon/config/settings.py")
        elif k.key not in example.get(section, set()):
            problems.append(f"{where}: [{k.section}] {k.key} is missing from {EXAMPLE_TOML.relative_to(REPO)}")
    return problems


def _parse(argv: tuple[str, ...]) -> str | None:
    """None if the real parser accepts ``argv``, else its error message.

    A placeholder the README shows in capitals where a number goes (`--record N`, `--duration S`)
    is tried as 1.
    """
    args = list(argv)
    for _ in range(len(args) + 1):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser(args).parse_args(args)
                return None
            except SystemExit as exc:
                if exc.code in (0, None):
                    return None
        message = err.getvalue().strip().splitlines()[-1]
        placeholder = re.search(r"invalid (?:int|float) value: '([A-Z]+)'", message)
        if placeholder is None or placeholder.group(1) not in args:
            return message
        args[args.index(placeholder.group(1))] = "1"
    return message


def _command_problems(found: list[Command], page: str = "README.md") -> list[str]:
    problems = []
    for cmd in found:
        for argv in cmd.variants:
            if not argv:
                continue  # the program named in prose ("so101d runs as ...")
            error = _parse(argv)
            # An inline mention may name a command without its required arguments
            # ("`so101d import-hdf5` into a dataset ... refuses"): what it shows must still exist.
            if error and cmd.kind == "inline" and "arguments are required" in error:
                continue
            if error:
                problems.append(f"{page}:{cmd.line} `{cmd.text}` -> so101d {' '.join(argv)}: {error}")
    return problems


def _python_problems(text: str, page: str) -> list[str]:
    """Every fenced python block compiles, and every name it imports exists."""
    problems = []
    for code, line in python_blocks(text):
        try:
            tree = ast.parse(code, filename=f"{page}:{line}")
        except SyntaxError as exc:
            problems.append(f"{page}:{line}: the python block does not parse: {exc.msg}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if importlib.util.find_spec(alias.name) is None:
                        problems.append(f"{page}:{line}: no module {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                try:
                    module = importlib.import_module(node.module or "")
                except ModuleNotFoundError:
                    problems.append(f"{page}:{line}: no module {node.module}")
                    continue
                problems += [
                    f"{page}:{line}: {node.module} has no {alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
    return problems


def _dotted_name_problems(text: str, page: str) -> list[str]:
    problems = []
    for name, line in dotted_python_names(text):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        else:
            problems.append(f"{page}:{line}: nothing of {name} imports")
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                problems.append(f"{page}:{line}: {name}: no {attr}")
                break
            obj = getattr(obj, attr)
    return problems


def _path_problems(text: str, page: str) -> list[str]:
    return [f"{page}:{line}: no {path}" for path, line in repo_paths(text) if not (REPO / path).exists()]


def _link_problems(text: str, page: Path) -> list[str]:
    """Every relative link resolves to a file of the repository, and its #anchor to a heading there."""
    problems = []
    where = page_name(page)
    for target, line in links(text):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if path_part and not dest.exists():
            problems.append(f"{where}:{line}: link to {target}: no {dest.relative_to(REPO)}")
            continue
        if anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}:{line}: link to {target}: an anchor into a file that is not a page")
            elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}:{line}: link to {target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return problems


# LeRobot's programs parse their flags with draccus from a config dataclass (no build_parser)
DRACCUS_CONFIGS = {
    "lerobot.async_inference.policy_server": "lerobot.async_inference.configs.PolicyServerConfig",
    "lerobot.async_inference.robot_client": "lerobot.async_inference.configs.RobotClientConfig",
}


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _program_problems(text: str, page: str) -> tuple[list[str], int]:
    """`python -m MODULE --flags` and `python bench/x.py --flags` / `python .ci/x.py --flags`: the
    module or script exists and knows every flag shown. Returns the problems and how many were seen."""
    problems: list[str] = []
    seen = 0
    for s in snippets(text):
        for m in re.finditer(r"python -m ([\w.]+)((?: +--?\w[\w-]*(?: +[^\s\\-][^\s\\]*)?)*)", s.text):
            module, args = m.group(1), shlex.split(m.group(2))
            if module == "pytest":
                continue
            seen += 1
            if importlib.util.find_spec(module) is None:
                problems.append(f"{page}:{s.line}: no module {module}")
                continue
            if module in DRACCUS_CONFIGS:  # LeRobot's own programs: flags are fields of their config
                config = _resolve(DRACCUS_CONFIGS[module])
                fields = {f.name for f in dataclasses.fields(config)}
                flags = {a.split("=", 1)[0].removeprefix("--") for a in args if a.startswith("--")}
                if not flags <= fields:
                    problems.append(f"{page}:{s.line}: {module} has no {sorted(flags - fields)}")
                continue
            parser = importlib.import_module(module).build_parser()
            _ns, unknown = parser.parse_known_args(args)
            # Isaac Lab's AppLauncher adds these at run time (isaaclab.app.AppLauncher
            # .add_app_launcher_args); it is only installed on the GPU workstation.
            unknown = [u for u in unknown if u not in ("--enable_cameras", "--device", "cuda", "--headless")]
            if unknown:
                problems.append(f"{page}:{s.line}: {module} does not know {unknown}")
        for m in re.finditer(r"python ((?:bench|\.ci)/\w+\.py)((?: *\[?--[\w-]+(?: [\d.]+)?\]?)*)", s.text):
            script = REPO / m.group(1)
            seen += 1
            if not script.is_file():
                problems.append(f"{page}:{s.line}: no {m.group(1)}")
                continue
            problems += [
                f"{page}:{s.line}: {m.group(1)} has no {flag}"
                for flag in re.findall(r"--[\w-]+", m.group(2))
                if f'"{flag}"' not in script.read_text()
            ]
    return problems, seen


def _make_targets(text: str) -> list[tuple[str, int]]:
    """`make TARGET` as a command: a code block line or an inline span that starts with it."""
    return [
        (m.group(1), s.line) for s in snippets(text) if (m := re.match(r"make ([\w-]+)", s.text.strip())) is not None
    ]


def _make_problems(text: str, page: str) -> list[str]:
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    return [f"{page}:{line}: no make target {t}" for t, line in _make_targets(text) if t not in targets]


def _page_problems(page: Path, text: str | None = None) -> list[str]:
    """Every check of one page."""
    text = page_text(page) if text is None else text
    where = page_name(page)
    return (
        _command_problems(commands(text), where)
        + _key_problems(config_keys(set(_schema()), text), where)
        + _python_problems(text, where)
        + _dotted_name_problems(text, where)
        + _path_problems(text, where)
        + _link_problems(text, page)
        + _program_problems(text, where)[0]
        + _make_problems(text, where)
    )


# ---------------------------------------------------------------------------------------------
# every page as it is
# ---------------------------------------------------------------------------------------------
def test_the_docs_are_the_readme_and_the_pages_it_links() -> None:
    names = set(PAGE_IDS)
    assert {"README.md", "docs/operator-guide.md", "docs/configuration.md", "docs/security.md"} <= names
    # every page is reachable from the README through links (none is an orphan nobody finds)
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target, _line in links(page_text(page)):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.suffix == ".md" and dest in PAGES and dest not in reached:
                reached.add(dest)
                todo.append(dest)
    assert sorted(page_name(p) for p in set(PAGES) - reached) == []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_command_key_import_name_path_and_link_of_the_page_is_real(page: Path) -> None:
    assert _page_problems(page) == []


def test_the_readme_is_an_entry_point_that_starts_with_the_two_commands() -> None:
    lines = page_text(README).splitlines()
    assert len(lines) <= README_MAX_LINES
    # .ci/run and the Makefile call these "the README's two commands": they come first
    shell = [s.text.split("#")[0].strip() for s in snippets(page_text(README)) if s.kind == "block"]
    assert shell[:2] == ["make run", "make test"]


def test_the_pages_show_so101d_commands_at_all() -> None:
    found = [c for p in PAGES for c in commands(page_text(p))]
    shown = {c.variants[0][0] for c in found if c.variants and c.variants[0]}
    # Guards the extractor itself: if it stopped finding commands every check would pass.
    assert len(found) > 30
    assert {"demo", "run", "status", "calibrate", "emulate", "episode", "record", "sim-follower"} <= shown
    assert len([k for p in PAGES for k in config_keys(set(_schema()), page_text(p))]) > 15
    assert len([x for p in PAGES for x in repo_paths(page_text(p))]) > 20
    assert sum(len(links(page_text(p))) for p in PAGES) > 20
    assert sum(_program_problems(page_text(p), page_name(p))[1] for p in PAGES) >= 4
    assert [b for p in PAGES for b in python_blocks(page_text(p))]
    assert [n for p in PAGES for n in dotted_python_names(page_text(p))]
    assert {"run", "test", "bench"} <= {t for p in PAGES for t, _line in _make_targets(page_text(p))}


def test_every_subcommand_of_the_cli_is_in_the_docs() -> None:
    from daemon.apps.cli import COMMANDS

    shown = {c.variants[0][0] for p in PAGES for c in commands(page_text(p)) if c.variants and c.variants[0]}
    assert sorted(set(COMMANDS) - shown) == []


def test_the_example_config_loads_with_every_key_of_the_schema() -> None:
    schema, example = _schema(), _example()
    assert {s: sorted(schema[s] - example.get(s, set())) for s in schema if schema[s] - example.get(s, set())} == {}
    config_module.load_config(EXAMPLE_TOML)  # and it loads as shipped


def _reference_rows() -> dict[str, dict[str, str]]:
    """docs/configuration.md's tables: section -> key -> the default as shown (TOML)."""
    out: dict[str, dict[str, str]] = {}
    current = None
    for raw in page_text(REPO / "docs/configuration.md").splitlines():
        m = re.match(r"^## `\[([a-z_.A-Z]+)\]`", raw)
        if m:
            current = _section_of(m.group(1))
            out[current] = {}
            continue
        row = re.match(r"^\| `([a-z_]+)` \| `([^`]*)` \|", raw)
        if row and current:
            out[current][row.group(1)] = row.group(2)
    return out


def test_the_configuration_reference_lists_every_key_with_the_default_the_code_has() -> None:
    rows = _reference_rows()
    hints = typing.get_type_hints(config_module.Config)
    problems = []
    for name, tp in hints.items():
        section_name = name
        if typing.get_origin(tp) is dict:
            tp, section_name = typing.get_args(tp)[1], f"{name}.*"
        default = tp()
        for f in dataclasses.fields(tp):
            shown = rows.get(section_name, {}).get(f.name)
            if shown is None:
                problems.append(f"[{section_name}] {f.name}: not in docs/configuration.md")
                continue
            value = tomllib.loads(f"v = {shown}")["v"]
            code = getattr(default, f.name)
            if dataclasses.is_dataclass(code):  # a table inside the section: its keys set by default
                code = {k: v for k, v in dataclasses.asdict(code).items() if v is not None}
            if value != code:
                problems.append(
                    f"[{section_name}] {f.name}: the page says {shown}, the code {getattr(default, f.name)!r}"
                )
    extra = {f"[{s}] {k}" for s, keys in rows.items() for k in keys} - {
        f"[{f'{n}.*' if typing.get_origin(tp) is dict else n}] {f.name}"
        for n, tp in hints.items()
        for f in dataclasses.fields(typing.get_args(tp)[1] if typing.get_origin(tp) is dict else tp)
    }
    assert problems == [] and sorted(extra) == []


def test_the_live_keys_the_reference_names_are_what_a_reload_applies() -> None:
    from daemon.config.reload import LIVE_KEYS

    _page, text = section("Reloading: SIGHUP")
    listed = text.split("applied live:", 1)[1].split(". ", 1)[0]
    assert sorted(re.findall(r"`([a-z_]+\.[a-z_*]+)`", listed)) == sorted(LIVE_KEYS)


def test_the_realtime_priority_the_docs_suggest_is_what_the_drop_in_allows() -> None:
    conf = (REPO / "systemd/so101d.service.d/realtime.conf").read_text()
    allowed = int(re.search(r"^LimitRTPRIO=(\d+)", conf, re.M).group(1))  # type: ignore[union-attr]
    suggested = [int(v) for p in PAGES for v in re.findall(r"`control\.realtime_priority = (\d+)`", page_text(p))]
    assert suggested and all(0 < v <= allowed for v in suggested)
    assert [int(v) for v in re.findall(r"`control\.realtime_priority = (\d+)`", DRIFTED)] == [50]  # would fail


def test_the_calibration_steps_are_the_prompts_the_cli_shows() -> None:
    cli = (REPO / "daemon/apps/commands/calibrate.py").read_text()
    prompts = re.findall(r'"(\d)/(\d) ', cli)
    total = int(prompts[0][1])
    assert [int(p[0]) for p in prompts] == list(range(1, total + 1))
    _page, text = section("Calibrating an arm")
    steps = re.findall(r"^(\d)\. ", text, re.M)
    assert [int(s) for s in steps] == list(range(1, total + 1))
    assert f"`1/{total}` ... `{total}/{total}`" in text


def test_the_emulators_calibration_ids_are_the_ones_the_docs_name() -> None:
    import argparse

    from drivers.emulator import cli as emulate_cli

    p = argparse.ArgumentParser()
    emulate_cli.add_arguments(p)
    defaults = p.parse_args([])
    _page, text = section("No arm? The emulated SO-101")
    assert f"`{defaults.leader_id}`" in text and f"`{defaults.follower_id}`" in text
    assert f'[leader] id = "{defaults.leader_id}"' in text
    assert f'[follower] id = "{defaults.follower_id}"' in text


# ---------------------------------------------------------------------------------------------
# the checks catch drift (README lines as they once were) and a page that names what is not there
# ---------------------------------------------------------------------------------------------
DRIFTED = """\
For jitter under 1 ms on a busy machine set `control.realtime_priority = 50` (needs LimitRTPRIO).
- Real adapters: set the FTDI latency timer to 1 ms (udev, `so101d find-ports`), then
  lower `reply_margin_s` for faster fault detection.
- `so101d episode save --sucess`, `[follower] kind = "sim" endpont = "tcp://127.0.0.1:5555"`

    so101d sim-follower --backend bullet
"""

BAD_PAGE = """\
# A page that drifted

See [the service guide](service.md#no-such-heading), [the old guide](README.server.md) and
[the policy guide](policy.md#policies-local-inference-and-lerobots-policy-server).
The loop is in `daemon/control/cycle.py`; the reader is `daemon.control.loop.ControlLop`.

    so101d teleop pause
    .venv/bin/python bench/bench_loop.py --secnds 3
    python .ci/check_imports.py --graph
    make tests

```python
from daemon.control.loop import ControlLoop, Cycle
```
"""


def test_the_checks_catch_a_key_that_does_not_exist() -> None:
    problems = _key_problems(config_keys(set(_schema()), DRIFTED))
    assert any("'reply_margin_s' is not a configuration key" in p for p in problems)
    assert any("[follower] has no key 'endpont'" in p for p in problems)


def test_the_checks_catch_a_flag_or_choice_that_does_not_exist() -> None:
    problems = _command_problems(commands(DRIFTED))
    assert any("--sucess" in p for p in problems)
    assert any("bullet" in p for p in problems)


def test_the_checks_catch_a_page_naming_a_command_path_name_or_link_that_is_not_there() -> None:
    page = REPO / "docs" / "drifted.md"  # never written: the text is checked as if it were this page
    problems = _page_problems(page, BAD_PAGE)
    expected = [
        "docs/drifted.md:7 `so101d teleop pause`",  # no such choice
        "docs/drifted.md:3: link to service.md#no-such-heading: no heading #no-such-heading",
        "docs/drifted.md:3: link to README.server.md: no docs/README.server.md",
        "docs/drifted.md:5: no daemon/control/cycle.py",
        "docs/drifted.md:5: daemon.control.loop.ControlLop: no ControlLop",
        "docs/drifted.md:8: bench/bench_loop.py has no --secnds",
        "docs/drifted.md:10: no make target tests",
        "docs/drifted.md:13: daemon.control.loop has no Cycle",
    ]
    assert [e for e in expected if not any(p.startswith(e) for p in problems)] == [], problems
    # and nothing else: the good link, the real script and flag pass
    assert len(problems) == len(expected), problems


def test_the_realism_presets_the_docs_list_are_the_emulators() -> None:
    """`--realism` takes any string at parse time (the emulator checks it when it starts), so the
    parser check cannot see a wrong preset name: the table is held to the emulator's presets."""
    from drivers.emulator.realism import PRESETS

    _page, text = section("No arm? The emulated SO-101")
    table = re.findall(r"^\s*\| `([\w-]+)` \|", text, re.M)
    assert sorted(table) == sorted(PRESETS)
    shown = {p for m in re.findall(r"--realism ([\w,-]+)", text) for p in m.split(",")} - {"PRESET"}
    assert shown and shown <= set(PRESETS)
