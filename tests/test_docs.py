"""The docs hold together: README.md and docs/*.md link to files and headings that exist, the README's map
names every docs/ file, and the code's pointers into docs/ (error messages, docstrings) name files that exist.

Several people edit docs/ at once, and a heading renamed in one file silently breaks the links of another;
GitHub renders a dead anchor without complaint. Pure text, no TensorFlow: milliseconds.
"""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md"] + DOCS
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code ticks and punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set:
    found, seen = set(), {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            name = slug(match.group(1))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return found


def links(page: pathlib.Path):
    """(target file, anchor) of every relative link on the page, outside code blocks."""
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        yield (page.parent / path).resolve() if path else page, anchor, target


def test_slug_follows_githubs_rules():
    """Bug it catches: spaces turned into underscores (every anchor with a space would look broken)."""
    assert slug("The device check: `--selfcheck`") == "the-device-check---selfcheck"
    assert slug("`colab_XL` on 80 GB, 40 GB and 16 GB GPUs") == "colab_xl-on-80-gb-40-gb-and-16-gb-gpus"
    assert slug("TensorFlow 2.21 against 2.15") == "tensorflow-221-against-215"


def test_every_link_between_the_pages_reaches_a_file_and_a_heading():
    """Bug it catches: a heading renamed (`## Precision` -> `## Precisions` in models.md) while configs.md,
    devices.md and checkpoints.md still link to `models.md#precision`."""
    broken = []
    for page in PAGES:
        for dest, anchor, target in links(page):
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_maps_every_docs_file():
    """Bug it catches: a docs/ file added, or its row dropped from the README's map (repository.md's row
    deleted), so a newcomer never finds it."""
    linked = {dest for dest, _, _ in links(ROOT / "README.md")}
    assert DOCS and not [d.name for d in DOCS if d.resolve() not in linked]


def test_the_codes_pointers_into_docs_name_files_that_exist():
    """Bug it catches: an error message or docstring citing a docs/ file that was renamed or never written
    (execution/xla.py citing speed.md misspelt as sped.md)."""
    sources = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("runs", "__pycache__")]
        sources += [pathlib.Path(folder, f) for f in files if f.endswith((".py", ".txt", ".sh"))]
    sources.append(ROOT / ".ci" / "run")
    named = {(p.relative_to(ROOT), name) for p in sources
             for name in re.findall(r"docs/([\w-]+\.md)", p.read_text(errors="ignore"))}
    assert named, "no pointer into docs/ found: the pattern no longer matches how the code cites docs"
    assert not [f"{p}: docs/{name}" for p, name in named if not (ROOT / "docs" / name).exists()]


def test_every_prompt_file_the_commands_name_exists_or_is_written_before():
    """The everyday commands run as written: each `--prompt FILE ...` on a page names a file of the repository, or
    one a command earlier on the same page writes (`> FILE`). Bug it catches: the README's `--prompt p.txt`,
    a file nobody had (issue 33)."""
    missing = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"--prompt((?: [^\s`|&;#-][^\s`|&;]*)+)", text):
            written = re.findall(r">\s*(\S+)", text[:match.start()])
            for name in match.group(1).split():
                if name.endswith(".txt") and not (ROOT / name).is_file() and name not in written:  # not FILE, ...
                    missing.append(f"{page.relative_to(ROOT)}: --prompt {name}")
    assert not missing, "\n".join(missing)


def test_every_test_the_docs_name_exists():
    """docs/testing.md's table of one-line bugs (and every other page) names tests as
    `tests/<path>.py::test_name`: each file exists and defines that test, so a test moved or renamed keeps its
    row true. Bug caught: a row left naming a file's old path after the tests moved (tests/test_model.py)."""
    named = re.compile(r"`(tests/[\w/]+\.py)(?:::(test_\w+))?")
    missing = []
    for page in PAGES:
        for path, test in named.findall(page.read_text()):
            source = ROOT / path
            if not source.exists():
                missing.append(f"{page.name}: {path} (no such file)")
            elif test and not re.search(rf"^(?:async )?def {test}\b", source.read_text(), re.M):
                missing.append(f"{page.name}: {path}::{test} (no such test)")
    assert not missing, "\n".join(missing)


def product_modules() -> list:
    """Every module of the product (the repository's .py files outside tests/, docs/, runs/, hidden folders such
    as the virtualenvs, and dunder files), relative to the root. The walk skips those folders rather than reading
    them: the virtualenvs hold tens of thousands of files."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        if pathlib.Path(folder) == ROOT:
            subfolders[:] = [d for d in subfolders if d not in ("tests", "docs", "runs")]
        subfolders[:] = sorted(d for d in subfolders if not d.startswith((".", "__")))
        found += [pathlib.Path(folder, f).relative_to(ROOT) for f in files
                  if f.endswith(".py") and not f.startswith("__")]
    return sorted(found)


def test_every_module_has_its_test_file_or_a_row_naming_what_tests_it():
    """tests/<package>/test_<module>.py for every product module, or a row of docs/testing.md's table under
    "Where the tests are" naming test files that exist (or saying "not run by the tests:" and why); no row for a
    module that has its file or no longer exists.
    Bug it catches: a new module without tests (models/new_layer.py and no tests/models/test_new_layer.py)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text[text.index("## Where the tests are"):text.index("## Helpers")]
    rows = dict(re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", section, re.M))
    missing, stale = [], []
    for module in product_modules():
        mirror = ROOT / "tests" / module.parent / f"test_{module.name}"
        name = str(module)
        if mirror.exists():
            if name in rows:
                stale.append(f"{name}: has {mirror.relative_to(ROOT)}, so its row in docs/testing.md goes")
        elif name not in rows:
            missing.append(f"{name}: no {mirror.relative_to(ROOT)} and no row in docs/testing.md")
        else:
            named = re.findall(r"`(tests/[\w/]+\.py)", rows[name])
            if rows[name].startswith("not run by the tests:"):
                continue  # said so in the table, with the reason
            if not named or not all((ROOT / t).exists() for t in named):
                missing.append(f"{name}: its row names no test file that exists ({rows[name]})")
    modules = {str(m) for m in product_modules()}
    stale += [f"{name}: a row for a module that does not exist" for name in rows if name not in modules]
    assert not missing and not stale, "\n".join(missing + stale)
