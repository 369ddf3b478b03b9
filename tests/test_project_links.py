"""The project's public addresses agree, and every link a user or an operator follows lands.

One repository address is canonical (``dashboards.alerts.PROJECT_URL``): the package metadata,
the documentation site's ``repo_url`` and ``site_url`` (the repository's Pages site), the
README's links and every ``runbook_url`` of the shipped alert rules are under it. The README is
shown on the package index, where a relative link breaks: its links are all absolute, and those
into the repository or the documentation site name a file, page and anchor that exist.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from dashboards.alerts import PROJECT_URL
from guarded.cli.support import DOCUMENTATION_URL

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
OWNER, NAME = PROJECT_URL.removeprefix("https://github.com/").split("/")
SITE_URL = f"https://{OWNER}.github.io/{NAME}/"
BLOB = f"{PROJECT_URL}/blob/main/"
RAW = f"https://raw.githubusercontent.com/{OWNER}/{NAME}/main/"
SHIPPED_RULES = (
    REPO / "grafana" / "alerts" / "guarded-rules.yml",
    REPO / "guarded" / "assets" / "grafana" / "alerts" / "guarded-rules.yml",
)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(?P<target>[^)\s]+)[^)]*\)|<(?P<auto>https?://[^>]+)>")


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower-cased, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    """The ATX headings of a Markdown page, outside fenced code blocks, without their markup."""
    found: list[str] = []
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(match.group(1))
    return found


def mkdocs_anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives the page's headings (Python-Markdown's toc slugify on their text)."""
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in headings(page)}


def github_anchors(page: Path) -> set[str]:
    return {github_slug(re.sub(r"[`*]", "", heading)) for heading in headings(page)}


def mkdocs_config() -> dict[str, object]:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use !!python/name tags (e.g. for a slugify function): read them as strings.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: str(node.value))
    loaded: dict[str, object] = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    return loaded


def nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values()))
    return set()


def test_metadata_site_and_rules_name_one_repository() -> None:
    urls = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    assert urls["Repository"] == urls["Homepage"] == PROJECT_URL
    assert urls["Documentation"] == SITE_URL
    assert urls["Issues"] == f"{PROJECT_URL}/issues"
    assert urls["Changelog"] == f"{BLOB}CHANGELOG.md"
    config = mkdocs_config()
    assert config["repo_url"] == PROJECT_URL
    assert config["site_url"] == SITE_URL
    assert DOCUMENTATION_URL == SITE_URL, "the command line's help links another documentation site"


@pytest.mark.parametrize("rules", SHIPPED_RULES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_runbook_url_resolves_to_a_runbook_section_of_the_shipped_docs(rules: Path) -> None:
    urls = re.findall(r"^\s*runbook_url:\s*(\S+)\s*$", rules.read_text(encoding="utf-8"), re.MULTILINE)
    assert len(urls) >= 20, f"{rules}: the rule file has {len(urls)} runbook_url lines"
    site_pages = nav_pages(mkdocs_config()["nav"])
    for url in urls:
        address, _, anchor = url.partition("#")
        assert address.startswith(BLOB), f"{url}: not under {BLOB}"
        path = address.removeprefix(BLOB)
        page = REPO / path
        assert path.startswith("docs/"), f"{url}: {path} is not under docs/"
        assert page.is_file(), f"{url}: no {path} in the repository"
        assert path.removeprefix("docs/") in site_pages, f"{url}: {path} is not a page of the site"
        assert anchor, f"{url}: no anchor"
        assert anchor in github_anchors(page), f"{url}: no section #{anchor} in {path} on GitHub"
        assert anchor in mkdocs_anchors(page), f"{url}: no section #{anchor} in {path} on the site"


def readme_links() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # code is not links
    return [match["target"] or match["auto"] for match in LINK.finditer(text)]


def test_the_readme_has_absolute_links_only() -> None:
    links = readme_links()
    assert len(links) >= 10, links
    relative = [link for link in links if not re.match(r"https?://", link)]
    assert not relative, f"relative links break on the package index: {relative}"


def test_the_readme_links_into_the_project_land() -> None:
    for link in readme_links():
        address, _, anchor = link.partition("#")
        if address.startswith(BLOB) or address.startswith(RAW):
            path = address.removeprefix(BLOB).removeprefix(RAW)
            assert (REPO / path).is_file(), f"{link}: no {path} in the repository"
            if anchor:
                assert anchor in github_anchors(REPO / path), f"{link}: no #{anchor} in {path}"
        elif address.startswith(SITE_URL):
            page = address.removeprefix(SITE_URL).strip("/")
            source = DOCS / (f"{page}.md" if page else "index.md")
            assert source.is_file(), f"{link}: no docs page {source.relative_to(REPO)}"
            if anchor:
                assert anchor in mkdocs_anchors(source), f"{link}: no #{anchor} in {source.name}"
        elif address != PROJECT_URL:
            other_form = f"{link}: a project address in another form than {BLOB}, {RAW} or {SITE_URL}"
            assert PROJECT_URL not in address, other_form
            assert f"{OWNER}.github.io" not in address, other_form


def test_the_slugs_follow_github_and_mkdocs() -> None:
    assert github_slug("GuardedCircuitOpen") == "guardedcircuitopen"
    assert github_slug("Shutting down: the SIGTERM pattern") == "shutting-down-the-sigterm-pattern"
    assert slugify("Shutting down: the SIGTERM pattern", "-") == "shutting-down-the-sigterm-pattern"
