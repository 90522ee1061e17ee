"""Every code block of the README and the docs site runs, or is checked, in `make test`.

The rules (docs/developing.md says them to contributors):

- A Python block in `docs/` comes from a file under `docs/examples/` through a snippet line
  (`--8<-- "docs/examples/x.py:section"`), or from `examples/`. Every such file runs here as a
  script (its `main()` asserts what the page claims) and is type-checked by `mypy --strict`.
- A Python block written inline (the README, or a page) must either appear verbatim in one of
  those files (so it runs there), run here as it stands, or open with `# not run: <why>`; then it
  must still compile.
- A shell block's `mrtr ...` commands must parse (`mrtr <subcommand> --help`), its `make X`
  targets must exist in the Makefile, and the scripts it runs must exist.
- JSON and YAML blocks must parse; `text` blocks are output, shown as printed.

The strict site build (`mkdocs build --strict`: broken links, missing references and griffe's
docstring warnings fail it) runs here too, and every public name of mrtr's public modules must
have an entry in the built API reference, with a docstring.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
PUBLIC_MODULES = [
    "mrtr",
    "mrtr.client",
    "mrtr.tasks",
    "mrtr.stores",
    "mrtr.buses",
    "mrtr.temporal",
    "mrtr.testing",
    "mrtr.tracing",
    "mrtr.fastmcp",
    "mrtr.metrics",
    "mrtr.console",
]
NOT_RUN = "# not run:"
SNIPPET = re.compile(r'^\s*-{1,2}8<-{1,2}\s+"([^"]+)"\s*$')
SECTION = re.compile(r"# --8<-- \[start:[\w-]+\]\n(.*?)^\s*# --8<-- \[end:[\w-]+\]", re.S | re.M)
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)[^\n]*$")
PY = sys.executable
BIN = Path(PY).parent


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang or 'no language'})"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (indented fences included, dedented)."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(page, start, lang.lower(), textwrap.dedent("\n".join(body))))
        i += 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def snippet_files(block: Block) -> list[Path]:
    paths = []
    for line in block.code.splitlines():
        match = SNIPPET.match(line)
        if match:
            paths.append(ROOT / match.group(1).split(":", 1)[0])
    return paths


def example_sources() -> str:
    """Every file an inline block may be copied from: what runs in `make test`."""
    files = [*EXAMPLES, *sorted((ROOT / "examples").glob("*.py"))]
    texts = [path.read_text() for path in files]
    sections = [textwrap.dedent(body) for text in texts for body in SECTION.findall(text)]
    return "\n".join([*texts, *sections])


def env() -> dict[str, str]:
    return {
        **os.environ,
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "PYTHONPATH": str(ROOT / "src"),
        "NO_MKDOCS_2_WARNING": "1",
    }


def test_the_pages_have_code_to_check() -> None:
    """The collection itself: a broken fence parser would make every check below vacuous."""
    assert len(EXAMPLES) >= 5
    python = [block for block in ALL_BLOCKS if block.lang == "python"]
    assert len(python) >= 10, [str(block) for block in python]
    assert any(block.page.name == "README.md" and block.lang == "python" for block in ALL_BLOCKS)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
@pytest.mark.spawns
def test_a_docs_example_runs(example: Path) -> None:
    """Each file under docs/examples/ runs to its end: its `main()` asserts what the page says."""
    proc = subprocess.run(
        [PY, str(example)], cwd=example.parent, env=env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{example.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.spawns
def test_every_python_block_runs_or_says_why() -> None:
    sources = example_sources()
    problems = []
    for block in ALL_BLOCKS:
        if block.lang not in ("python", "py"):
            continue
        included = snippet_files(block)
        if included:
            for path in included:
                if not path.is_file() or not (
                    path.is_relative_to(DOCS / "examples") or path.is_relative_to(ROOT / "examples")
                ):
                    problems.append(f"{block}: includes {path}, not a file under docs/examples/ or examples/")
            continue
        code = block.code
        try:
            compile(code, str(block), "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
        except SyntaxError as exc:
            problems.append(f"{block}: does not compile: {exc}")
            continue
        if code.lstrip().startswith(NOT_RUN):
            reason = code.lstrip().splitlines()[0].removeprefix(NOT_RUN).strip()
            if len(reason) < 10:
                problems.append(f"{block}: `{NOT_RUN}` needs a reason")
            continue
        if code.strip() in sources:
            continue  # copied verbatim from a file that runs here
        proc = subprocess.run([PY, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            problems.append(f"{block}: failed to run:\n{proc.stderr[-1500:]}")
    assert not problems, "\n".join(problems)


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))


def _commands(code: str) -> list[str]:
    """The shell lines of a block, comments and continuation lines folded."""
    out: list[str] = []
    for raw in code.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line.rstrip("&").strip())
    return out


@pytest.mark.spawns
def test_every_shell_block_names_real_commands() -> None:
    targets = _make_targets()
    problems = []
    checked = 0
    helps: dict[tuple[str, ...], bool] = {}  # pages repeat commands: one `--help` process per subcommand path

    def has_help(sub: list[str]) -> bool:
        if tuple(sub) not in helps:
            proc = subprocess.run(
                [str(BIN / "mrtr"), *sub, "--help"], env=env(), capture_output=True, text=True, timeout=60
            )
            helps[tuple(sub)] = proc.returncode == 0
        return helps[tuple(sub)]

    for block in ALL_BLOCKS:
        if block.lang not in ("bash", "sh", "shell", "console"):
            continue
        for command in _commands(block.code):
            words = shlex.split(command.removeprefix("$ "))
            if not words:
                continue
            if words[0] == "make":
                missing = [
                    word for word in words[1:] if not word.startswith("-") and "=" not in word and word not in targets
                ]
                if missing:
                    problems.append(f"{block}: no make target {missing}")
                checked += 1
            elif words[0] == "mrtr":
                sub = [word for word in words[1:3] if re.fullmatch(r"[a-z][a-z-]*", word)]
                # `mrtr tasks ls ...`: the subcommand path, cut where arguments begin
                while sub and not has_help(sub):
                    sub = sub[:-1]
                if not sub:
                    problems.append(f"{block}: `{command}` is not an mrtr command")
                checked += 1
            elif words[0] in ("python", "python3"):
                scripts = [word for word in words[1:] if word.endswith(".py")]
                missing = [script for script in scripts if not (ROOT / script).is_file()]
                if missing:
                    problems.append(f"{block}: no such script {missing}")
                checked += 1
    assert checked >= 5
    assert not problems, "\n".join(problems)


def test_every_json_and_yaml_block_parses() -> None:
    problems = []
    for block in ALL_BLOCKS:
        try:
            if block.lang == "json":
                json.loads(block.code)
            elif block.lang in ("yaml", "yml"):
                yaml.safe_load(block.code)
        except ValueError as exc:
            problems.append(f"{block}: {exc}")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it: offline, strict."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-5000:]}"
    assert "WARNING" not in log, log
    return out


@pytest.mark.spawns
def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS).with_suffix("")
        built = site / ("index.html" if rel.name == "index" and rel.parent == Path() else rel / "index.html")
        if rel.name == "index" and rel.parent != Path():
            built = site / rel.parent / "index.html"
        assert built.is_file(), f"{page} was not built ({built})"
    # Offline: no page loads a script, stylesheet, font or image from the network.
    loads = re.compile(
        r'<(?:script|img)[^>]+src="https?://|<link(?=[^>]*href="https?://)(?=[^>]*rel="(?:stylesheet|preload|preconnect)")'
    )
    for html in site.rglob("*.html"):
        assert not loads.search(html.read_text()), f"{html} loads something from the network"


def _inventory(site: Path) -> set[str]:
    raw = (site / "objects.inv").read_bytes()
    body = raw.split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


@pytest.mark.spawns
def test_every_public_name_has_a_reference_entry_with_a_docstring(site: Path) -> None:
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    package = loader.load("mrtr")
    loader.resolve_aliases(implicit=True, external=False)
    entries = _inventory(site)
    problems = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        model = package if name == "mrtr" else package.get_member(name.removeprefix("mrtr."))
        assert model.docstring, f"{name} has no module docstring"
        for public in module.__all__:
            if f"{name}.{public}" not in entries:
                problems.append(f"{name}.{public}: no entry in the API reference")
            target = model.get_member(public)
            target = target.final_target if target.is_alias else target
            if target.docstring is None or len(target.docstring.value.split()) < 4:
                problems.append(f"{name}.{public}: no docstring saying what it is for ({target.path})")
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    """Short (the docs hold the rest), and every relative link in it leads to a file that exists."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024, f"README.md is {len(readme.encode())} bytes: move sections into docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if "://" not in target]
    assert len(local) >= 10, local
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_fleet_guides_haproxy_is_the_configuration_the_resend_test_runs() -> None:
    """docs/guides/fleet.md calls its HAProxy blocks tested: every directive in them (but where to
    bind and the servers, and the health checks' timing, which the test makes faster) is in the
    configuration tests/fleet/test_resend.py runs its kills behind."""
    from tests.fleet.test_resend import DOCUMENTED_HAPROXY

    tested = {" ".join(line.split()) for line in DOCUMENTED_HAPROXY.splitlines()}
    guide = (DOCS / "guides" / "fleet.md").read_text()
    blocks = [b for b in re.findall(r"```text\n(.*?)```", guide, re.S) if "backend fleet" in b]
    assert len(blocks) == 2, "the guide's HAProxy blocks: modern clients, then legacy ones"
    checked = 0
    for block in blocks:
        for line in block.splitlines():
            directive = " ".join(line.split("#")[0].split())
            if not directive or directive.startswith(("bind ", "server ", "default-server ")):
                continue
            assert directive in tested, f"the fleet guide's {directive!r} is not what the resend test runs"
            checked += 1
    assert checked >= 20
